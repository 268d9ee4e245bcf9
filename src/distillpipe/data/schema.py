"""The on-disk contracts between stages: what ``prepare`` writes and what ``tokenize`` writes.

Both are ``datasets.DatasetDict.save_to_disk`` folders plus a ``meta.json`` beside the splits.

Prepared (``data/prepared/<name>/``), one of four task types:
  corpus          doc_id: str, text: str              one row per paragraph/document; consecutive
                                                      rows with one doc_id form one document
  classification  id: str, text_a: str, [text_b: str], label: int64 (-1 = unlabeled)
  regression      id: str, text_a: str, text_b: str, label: float32 (STS-B 0..5)
  qa              id, title, context, question: str,
                  answers: {text: list[str], answer_start: list[int32]}  (empty lists = unanswerable)
  splits: train, dev, test (corpus: train, dev; MNLI: dev_matched, dev_mismatched, ...)
  meta.json: name, task_type, num_labels, label_names, text_fields, source (the params), summary,
             and optionally labeled (bool): false when the rows have no ground truth (the augment
             stage's generated questions, every ``answers`` empty); a missing key reads as true
             (prepare's outputs are labeled; see :func:`is_labeled`)

Tokens (``data/tokens/<name>/``): unpadded rows, ids as int32; attention mask is implicit
(ones over ``length``), so batches pad at collate time and bucket by ``length``.
  all             input_ids, token_type_ids (list[int8]), length (int32)
  classification  + example_id, label, a_input_ids, b_input_ids (separate [CLS] x [SEP]
                  encodings for DiffCat; b_input_ids empty for single-sentence tasks)
  qa              + example_id, offset_mapping (list of [start, end] char offsets into the
                  context; [-1, -1] for question/special tokens), start_positions,
                  end_positions (0 = [CLS] when unanswerable or not in this window), has_answer
  mlm             + block_id (int64), view (int32), masked_positions (list[int32]),
                  masked_labels (list[int32], the original ids at those positions)
  dtypes: start/end_positions int32, has_answer bool, offset_mapping list of [int32, 2],
          label int64 (float32 for regression), example_id string
  meta.json: name, task_type, kind, fingerprint, num_labels, label_names, labeled (from the
             prepared meta; labeled false: train with teacher losses only, WaLDORf eq. (8)),
             tokenizer {spec, sha256, vocab_size, pad_id, cls_id, sep_id, mask_id}, max_seq_len,
             params, summary
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

TASK_TYPES = ("corpus", "classification", "regression", "qa")
META_FILE = "meta.json"


def write_meta(folder: str | Path, meta: dict[str, Any]) -> None:
    path = Path(folder) / META_FILE
    path.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")


def is_labeled(meta: dict[str, Any]) -> bool:
    """Whether a prepared or tokens dataset has ground truth (``labeled`` missing: true)."""
    return bool(meta.get("labeled", True))


def read_meta(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {folder} is not the output of a distillpipe stage "
            "(run the stage that writes it first, e.g. `dvc repro prepare`)"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def regression_bins(labels: Any, width: float) -> np.ndarray:
    """Bin index of each regression score: the nearest multiple of ``width``, halves rounded up (STS-B scores
    0..5 in 0.2 bins, CMOW paper after Raffel et al.). Scores arrive as float32 (0.7 is 0.69999998...), so
    the quotient is first rounded to 6 decimals: 0.7 / 0.2 lands in bin 4 (0.8), not in bin 3 by float noise.
    The one binning of both the teacher (teacher_finetune) and the students (train/data.py)."""
    q = np.round(np.asarray(labels, dtype=np.float64) / width, 6)
    return np.floor(q + 0.5).astype(np.int64)


def longest_list(rows: Any, column: str, batch_size: int = 65_536) -> int:
    """The most items a row of ``rows`` (a ``datasets.Dataset``) holds in the list ``column`` (0 for no rows).

    Read in Arrow batches of ``batch_size`` rows: memory stays one batch whatever the number of rows. Reading
    ``rows[column]`` instead makes a Python list per row, all at once with datasets 3 (some 200 bytes a row:
    20 GB at 100 M rows) and one at a time at ~70 us a row with datasets 4 (two hours at 100 M rows)."""
    longest = 0
    for batch in rows.select_columns([column]).with_format("arrow").iter(batch_size=batch_size):
        longest = max(longest, pc.max(pc.list_value_length(batch[column])).as_py() or 0)
    return longest
