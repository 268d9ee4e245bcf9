"""Batches from unpadded token rows: length bucketing, right-padding and the masks of padded batches.

Tokens are stored unpadded (see ``schema.py``); every consumer (teacher fine-tuning, teacher
capture, student training, question generation) pads at collate time and groups rows of similar length so
that little compute is spent on padding. General code only: a stage that pads a batch imports this module,
so what only some stages do (pooling a teacher's signals) lives elsewhere (docs/code-deps.md).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def length_batches(lengths: Sequence[int] | np.ndarray, batch_size: int, *, shuffle: bool = False,
                   seed: int = 0, window: int = 64) -> list[np.ndarray]:
    """Split row indices into batches of rows of similar length.

    Without shuffle: indices sorted by length (stable), cut into batches (deterministic, minimal
    padding; the caller writes results back in dataset order). With shuffle: rows are shuffled,
    sorted by length inside windows of ``window`` batches, and the batch order is shuffled, the
    usual trade-off between randomness and padding.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    lengths = np.asarray(lengths)
    n = len(lengths)
    if not shuffle:
        order = np.argsort(lengths, kind="stable")
        return [order[i:i + batch_size] for i in range(0, n, batch_size)]
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    span = batch_size * window
    batches = []
    for s in range(0, n, span):
        chunk = perm[s:s + span]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def length_mask(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(B,) lengths -> (B, seq_len) bool, True on the first ``lengths[b]`` positions."""
    return torch.arange(seq_len, device=lengths.device)[None, :] < lengths[:, None]


def pad_sequences(seqs: Sequence[Sequence[int]], pad_value: int, length: int | None = None,
                  dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Right-pad variable-length integer sequences into a (B, T) tensor (T = longest, or ``length``)."""
    t = max((len(s) for s in seqs), default=0) if length is None else length
    out = torch.full((len(seqs), t), pad_value, dtype=dtype)
    for i, s in enumerate(seqs):
        s = s[:t]
        if len(s):
            out[i, :len(s)] = torch.as_tensor(np.asarray(s), dtype=dtype)
    return out


def collate_tokens(rows: dict[str, list], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a columnar batch (``Dataset[idx]`` output) into model inputs.

    Returns ``input_ids`` (B, T), ``attention_mask`` (B, T) and ``token_type_ids`` (B, T).
    """
    ids = rows["input_ids"]
    input_ids = pad_sequences(ids, pad_id)  # (B, T)
    lengths = torch.tensor([len(s) for s in ids])
    attention_mask = length_mask(lengths, input_ids.shape[1]).long()  # (B, T)
    tt = rows.get("token_type_ids")
    token_type_ids = pad_sequences(tt, 0) if tt is not None else torch.zeros_like(input_ids)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
