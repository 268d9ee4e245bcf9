"""The rows a teacher cache would hold, before it is built: counted in the tokens folder, else estimated from the
prepared folder and the tokenize params (for ``distillpipe plan``, :mod:`distillpipe.teacher.plan`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.tokenize import TokenizeConfig, TokenizeMLMConfig, TokenizeQAConfig
from distillpipe.data.masking import n_to_mask
from distillpipe.data.schema import read_meta
from distillpipe.teacher.targets import masked_counts, split_rows

CHARS_PER_TOKEN = 4.7
"""Characters per WordPiece token of English prose (measured on the embedded Wikipedia sample with MiniLM's uncased
vocabulary: 4.6-4.7; short reviews 4.2, QA contexts with their questions 2.7 counting window overlap). Only rows
estimated from prepared data use it."""


@dataclass(frozen=True)
class Rows:
    """The rows an item would cache, and what is known of them."""

    n: int | None
    """Rows of the store (``max_rows`` applied); None: unknown."""
    how: str
    """``tokens`` (counted), ``estimated`` (from prepared data) or ``unknown``."""
    note: str
    max_seq_len: int | None
    """L; None when neither the tokens nor the tokenize params give it."""
    max_masked: int
    """M (MLM tokens; 0 otherwise): counted in the tokens, else the bound from the tokenize params."""
    lengths: np.ndarray | None = field(default=None, repr=False)
    """(n,) token count of each cached row (tokens only)."""
    masked: np.ndarray | None = field(default=None, repr=False)
    """(n,) masked positions of each cached row (MLM tokens only)."""


def count_rows(name: str, cfg: TeacherCacheDatasetConfig, tokenize: TokenizeConfig, tokens: Path,
               prepared: Path) -> Rows:
    """The rows of item ``name``: from its tokens folder if there is one, else estimated from its prepared folder."""
    from datasets import load_from_disk

    tok_cfg = tokenize.datasets.get(name)
    if tokens.is_dir():
        meta = read_meta(tokens)
        rows, subset = split_rows(name, tokens, cfg.split, cfg.max_rows)
        note = f"{tokens}/{cfg.split}: {len(rows):,} rows"
        if subset is not None:
            rows = rows.select(subset)
            note += f", {len(rows):,} evenly spaced kept (max_rows)"
        lengths = np.asarray(rows.with_format("arrow")["length"].to_numpy(), dtype=np.int64)
        masked = masked_counts(rows) if "masked_positions" in rows.column_names else None
        return Rows(len(rows), "tokens", note, int(meta["max_seq_len"]),
                    int(masked.max()) if masked is not None and masked.size else 0, lengths, masked)
    seq_len = tokenize.seq_len(name) if tok_cfg is not None else None
    bound, bound_note = 0, ""
    if isinstance(tok_cfg, TokenizeMLMConfig):
        bound = n_to_mask(seq_len - 2, tok_cfg.mask_prob)
        bound_note = f"; M <= {bound} = round(mask_prob {tok_cfg.mask_prob} x {seq_len - 2} maskable tokens)"
    if tok_cfg is None:
        return Rows(None, "unknown", f"tokenize.datasets has no {name!r} and {tokens} does not exist", None, 0)
    if not prepared.is_dir():
        return Rows(None, "unknown", f"no {tokens} nor {prepared}: run prepare/tokenize first{bound_note}", seq_len,
                    bound)
    data = load_from_disk(str(prepared))
    if cfg.split not in data:
        return Rows(None, "unknown", f"{prepared} has splits {list(data)}, not {cfg.split!r}{bound_note}", seq_len,
                    bound)
    n, how = _estimate_rows(data[cfg.split], tok_cfg, seq_len)
    note = f"estimated from {prepared}/{cfg.split}: {how}"
    if cfg.max_rows is not None and cfg.max_rows < n:
        n, note = cfg.max_rows, note + f"; max_rows {cfg.max_rows:,} kept"
    return Rows(n, "estimated", note + bound_note, seq_len, bound)


def _estimate_rows(split: Any, tok_cfg: Any, seq_len: int) -> tuple[int, str]:
    """Token rows a prepared split gives, at CHARS_PER_TOKEN: (rows, how)."""

    def chars(column: str) -> np.ndarray:
        return np.asarray(pc.utf8_length(split.data.column(column)).to_numpy(), dtype=np.float64)

    if isinstance(tok_cfg, TokenizeMLMConfig):
        total = float(chars("text").sum())
        blocks = math.ceil(total / CHARS_PER_TOKEN / (seq_len - 2))
        return blocks * tok_cfg.mask_views, (f"{total:,.0f} characters / {CHARS_PER_TOKEN} a token in blocks of "
                                             f"{seq_len - 2} x {tok_cfg.mask_views} mask views")
    if isinstance(tok_cfg, TokenizeQAConfig):
        question = np.minimum(np.ceil(chars("question") / CHARS_PER_TOKEN), tok_cfg.max_query_len)
        context = np.ceil(chars("context") / CHARS_PER_TOKEN)
        room = seq_len - question - 3  # [CLS] q [SEP] c [SEP]
        windows = 1 + np.ceil(np.maximum(context - room, 0) / np.maximum(room - tok_cfg.doc_stride, 1))
        return int(windows.sum()), (f"{len(split):,} questions, windows of {seq_len} tokens with stride "
                                    f"{tok_cfg.doc_stride} at {CHARS_PER_TOKEN} characters a token")
    return len(split), "one row per prepared example"
