"""Local plain-text corpora: ``text`` (documents separated by blank lines) or ``jsonl`` (one JSON
object per line, the document under ``text_field``). One row per document; doc_id is
``<file name>:<line>`` with the line where the document starts."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tqdm import tqdm

from distillpipe.config.prepare import LocalTextConfig
from distillpipe.data.features import rows_to_dataset
from distillpipe.data.sources.base import Prepared, PrepareError, Skips, input_path, numbered_lines, read_text

logger = logging.getLogger(__name__)


def _text_documents(path: Path, text: str) -> list[dict]:
    rows, current, start = [], [], 0
    for number, line in numbered_lines(text):
        if line.strip():
            if not current:
                start = number
            current.append(line.rstrip())
        elif current:
            rows.append({"doc_id": f"{path.name}:{start}", "text": "\n".join(current)})
            current = []
    if current:
        rows.append({"doc_id": f"{path.name}:{start}", "text": "\n".join(current)})
    return rows


def _jsonl_documents(path: Path, text: str, cfg: LocalTextConfig, key: str, skips: Skips) -> list[dict]:
    rows = []
    lines = list(numbered_lines(text))
    for number, line in tqdm(lines, desc=path.name, unit="line", disable=None, leave=False):
        where = f"{path}:{number}"
        if not line.strip():
            skips.add("blank lines")
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            skips.bad_or_raise(cfg.on_bad_rows, key, "lines with invalid JSON", where,
                               f"invalid JSON ({e.msg}, column {e.colno})", unit="line")
            continue
        except RecursionError:
            skips.bad_or_raise(cfg.on_bad_rows, key, "lines with invalid JSON", where, "JSON nested too deeply",
                               unit="line")
            continue
        value = obj.get(cfg.text_field) if isinstance(obj, dict) else None
        if not isinstance(value, str):
            got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            skips.bad_or_raise(cfg.on_bad_rows, key, f"lines without a string {cfg.text_field!r}", where,
                               f"no string field {cfg.text_field!r} (got {got}); is `{key}.text_field` right?",
                               unit="line")
            continue
        if not value.strip():
            skips.bad("empty documents", where, f"{cfg.text_field!r} is empty")
            continue
        rows.append({"doc_id": f"{path.name}:{number}", "text": value})
    return rows



def build_text(name: str, cfg: LocalTextConfig) -> Prepared:
    key = f"prepare.local.{name}"
    if not cfg.files:
        raise PrepareError(f"{key}.files is empty; give at least `train: path/to/train.txt`")
    skips = Skips()
    splits = {}
    for split, file in cfg.files.items():
        path = input_path(Path(cfg.path) / file, f"{key}.files.{split}")
        text = read_text(path, cfg.encoding, f"{key}.encoding")
        if cfg.format == "text":
            rows = _text_documents(path, text)
        else:
            rows = _jsonl_documents(path, text, cfg, key, skips)
        if not rows:
            raise PrepareError(
                f"{path}: no documents (from params.yaml `{key}.files.{split}`; skipped so far: {skips.as_dict()})"
            )
        splits[split] = rows_to_dataset(rows, "corpus", ["text"])
    return Prepared(splits, "corpus", [], ["text"], skips)
