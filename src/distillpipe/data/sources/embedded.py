"""Embedded assets: files that ship inside the installed gensim package (``gensim/test/test_data``),
so the default pipeline runs offline; and the Pang & Lee polarity sentences built from one of them."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from pathlib import Path

from distillpipe.config.prepare import EmbeddedPolarityConfig
from distillpipe.data.features import rows_to_dataset
from distillpipe.data.sources.base import Prepared, PrepareError, Skips, numbered_lines, read_text, stratified_split

logger = logging.getLogger(__name__)

POLARITY_FILE = "pang_lee_polarity.cor"
POLARITY_LABELS = ["neg", "pos"]
LABEL_PREFIX = "__label__"


def gensim_test_file(filename: str) -> Path:
    """Path of a file in gensim's bundled test data (found without importing gensim, which takes seconds)."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError("embedded datasets need the gensim package: pip install gensim")
    path = Path(spec.submodule_search_locations[0]) / "test" / "test_data" / filename
    if not path.is_file():
        raise PrepareError(
            f"{path} not found: this gensim ({importlib.metadata.version('gensim')}) does not ship {filename}. "
            "Install gensim>=4.3 (pip install -U gensim), or use `source: local` with your own files."
        )
    return path


def build_polarity(name: str, cfg: EmbeddedPolarityConfig) -> Prepared:
    """200 movie-review sentences in fastText format (``__label__neg text``), stratified train/dev/test."""
    key = f"prepare.datasets.{name}"
    path = gensim_test_file(POLARITY_FILE)
    text = read_text(path, cfg.encoding, f"{key}.encoding")
    skips = Skips()
    rows, labels = [], []
    for number, line in numbered_lines(text):
        if not line.strip():
            skips.add("blank lines")
            continue
        tag, _, sentence = line.partition(" ")
        label = tag.removeprefix(LABEL_PREFIX)
        if not tag.startswith(LABEL_PREFIX) or label not in POLARITY_LABELS or not sentence.strip():
            # A bundled file: a bad line means a broken install, not a user choice to skip rows.
            raise PrepareError(
                f"{path}:{number}: expected `__label__neg <text>` or `__label__pos <text>`, got {line[:80]!r}; "
                "reinstall gensim (pip install --force-reinstall gensim)"
            )
        rows.append({"id": f"{POLARITY_FILE}:{number}", "text_a": sentence.strip(),
                     "label": POLARITY_LABELS.index(label)})
        labels.append(rows[-1]["label"])
    parts = stratified_split(labels, cfg.splits, cfg.seed, f"{key}.splits")
    text_fields = ["text_a"]
    splits = {s: rows_to_dataset([rows[i] for i in idx], "classification", text_fields) for s, idx in parts.items()}
    return Prepared(splits, "classification", list(POLARITY_LABELS), text_fields, skips)
