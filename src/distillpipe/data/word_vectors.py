"""Word-vector tables: the fixed, open-vocabulary embedding ELMo-C reads as input and predicts as output
(ELMo-C paper sec. 3.2), cached per word type over the teacher tokenizer's vocabulary.

A table folder (``models/word_vectors/<name>``) holds ``vectors.npy`` (V, d) float32, row i = the FastText
vector of token i's string (a ``##`` continuation prefix stripped; special tokens get zero rows, so they are
never prediction targets), and ``meta.json`` (source, dim, vocabulary size, the tokenizer's sha256 and a
fingerprint: the sha256 of the table's bytes). Students read the table, never a FastText model: one
(V, d) lookup per batch, and the student keeps the table in its state dict. This module owns the format and
reading it; :mod:`distillpipe.data.fasttext` builds tables.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from distillpipe.errors import UserError

TABLE_FILE = "vectors.npy"
META_FILE = "meta.json"


class WordVectorsError(UserError, ValueError):
    """A word-vector table is missing, damaged, or made for another tokenizer."""


def table_fingerprint(table: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(table, dtype=np.float32).tobytes()).hexdigest()


def load_table(folder: str | Path, *, tokenizer_sha256: str):
    """(table as a float32 torch tensor (V, d), its fingerprint); refuses a table of another tokenizer or one
    whose bytes differ from its recorded fingerprint."""
    import torch

    folder = Path(folder)
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        raise WordVectorsError(f"{folder} is not a word-vector table (no {META_FILE}): run `dvc repro word_vectors`")
    meta = json.loads(meta_path.read_text())
    if meta["tokenizer_sha256"] != tokenizer_sha256:
        raise WordVectorsError(f"{folder} was built for another tokenizer ({meta['tokenizer']}) than the tokens': "
                               "rebuild it with the tokenize section's tokenizer")
    table = np.load(folder / TABLE_FILE)
    if table_fingerprint(table) != meta["fingerprint"]:
        raise WordVectorsError(f"{folder / TABLE_FILE} does not match its recorded fingerprint: rebuild it")
    return torch.from_numpy(table), meta["fingerprint"]
