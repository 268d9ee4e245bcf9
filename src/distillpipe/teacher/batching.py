"""Teacher-capture batches: length buckets and collated inputs with MLM positions.

Built on :mod:`distillpipe.data.batching` (the padding and bucketing every consumer shares);
this adds what the capture needs beyond model inputs: ``lengths`` and, for MLM rows, the padded
``masked_positions`` with their validity mask.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from distillpipe.data.batching import collate_tokens, length_batches, pad_sequences
from distillpipe.pooling import length_mask


def length_buckets(lengths: Sequence[int] | np.ndarray, batch_size: int) -> list[list[int]]:
    """Row indices sorted by length (stable, so deterministic) and cut into batches of
    ``batch_size``: minimal padding. The caller writes results back in dataset order."""
    return [b.tolist() for b in length_batches(lengths, batch_size, shuffle=False)]


def _columns(rows: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]) -> Mapping[str, Sequence[Any]]:
    if isinstance(rows, Mapping):
        return rows
    rows = list(rows)
    if not rows:
        raise ValueError("collate needs at least one row")
    return {k: [r[k] for r in rows] for k in rows[0]}


def collate(rows: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad unpadded token rows (a columnar ``Dataset[idx]`` dict or a list of row dicts).

    Returns ``input_ids``, ``token_type_ids``, ``attention_mask`` (B, L) int64, ``lengths`` (B,)
    int64 and, when the rows carry ``masked_positions`` (MLM), ``masked_positions`` (B, M) int64
    padded with 0 and ``masked_valid`` (B, M) bool, M = most masked positions in the batch.
    """
    cols = _columns(rows)
    batch = collate_tokens(dict(cols), pad_id)
    lengths = torch.tensor([len(s) for s in cols["input_ids"]], dtype=torch.int64)
    if "length" in cols:
        declared = torch.as_tensor(np.asarray(cols["length"], dtype=np.int64))
        if not torch.equal(declared, lengths):
            bad = int((declared != lengths).nonzero()[0, 0])
            raise ValueError(
                f"row {bad} of the batch: length={int(declared[bad])} but {int(lengths[bad])} input_ids; "
                "the tokens dataset is inconsistent (re-run the tokenize stage)"
            )
    batch["lengths"] = lengths
    if "masked_positions" in cols:
        positions = cols["masked_positions"]
        counts = torch.tensor([len(s) for s in positions], dtype=torch.int64)
        pos = pad_sequences(positions, 0)  # (B, M)
        batch["masked_positions"] = pos
        batch["masked_valid"] = length_mask(counts, pos.shape[1])  # (B, M)
        if bool(((pos >= lengths[:, None]) & batch["masked_valid"]).any()):
            raise ValueError("a masked position lies beyond its row's length; re-run the tokenize stage")
    return batch
