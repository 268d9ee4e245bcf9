"""Sequence pooling of teacher signals (WaLDORf section 3.3), shared by the capture and the losses.

Pure torch, differentiable, batched; no Python loop over rows or positions.

Conventions (the teacher-cache store and every loss rely on them):

* ``mask`` is (B, L) bool, True on real tokens. Batches are right-padded, but nothing here assumes
  it: a padding position anywhere is simply invalid.
* Groups are ``[0, p), [p, 2p), ...``. When L is not a multiple of p the sequence is extended to
  ``ceil(L / p) * p`` with invalid positions, so the last group is partial. Grouping does not
  depend on L, so a row pooled inside a longer (more padded) batch gives the same groups.
* :func:`avg_pool_seq` (eq. 3) averages the VALID positions of a group only, so a half-filled last
  group is the mean of its real tokens (not diluted by zeros, not polluted by padding states).
  A group with no valid position is 0 and marked invalid.
* :func:`max_pool_scores` (eq. 5) takes the max of PRE-softmax scores over the valid
  (query, key) pairs of each p x p block: padded queries and padded keys are kept out of the max
  by filling them with -inf first. A block with no valid pair holds :data:`SCORE_MASKED` (-inf)
  and is marked invalid. This is the value the store uses (``store.schema.ATTN_MASKED``), so
  ``softmax`` of stored scores is the teacher's masked attention, and a loss that forgets the
  mask fails loudly (inf/nan) rather than learning the masking value (the WaLDORf caveat).
  Losses must therefore SELECT valid entries (``x[valid]``) or zero the teacher first
  (``t.masked_fill(~valid, 0)``); ``torch.where(valid, (s - t) ** 2, 0)`` gives nan gradients.
* ``p = 1`` is the identity on valid entries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SCORE_MASKED = float("-inf")
"""Pooled (or p=1) attention-score entries with no valid (query, key) pair."""


def n_groups(length: int, p: int) -> int:
    """ceil(length / p): pooled length of a sequence axis."""
    if p < 1:
        raise ValueError(f"pooling factor p must be >= 1, got {p}")
    return -(-length // p)


def pooled_mask(mask: torch.Tensor, p: int) -> torch.Tensor:
    """(B, L) -> (B, ceil(L/p)) bool: True where the group holds at least one valid position."""
    B, L = mask.shape
    n = n_groups(L, p)
    if n * p != L:
        mask = F.pad(mask, (0, n * p - L), value=False)
    return mask.view(B, n, p).any(dim=2)


def avg_pool_seq(h: torch.Tensor, mask: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """WaLDORf eq. (3), masked: average each group of p positions over its valid positions.

    ``h`` (B, L, d), ``mask`` (B, L) bool -> ``pooled`` (B, ceil(L/p), d) in ``h.dtype`` and
    ``valid`` (B, ceil(L/p)) bool. Invalid groups are 0.
    """
    B, L, d = h.shape
    assert mask.shape == (B, L), (mask.shape, h.shape)
    n = n_groups(L, p)
    h = h.masked_fill(~mask[..., None], 0.0)  # masked_fill, not h * mask: inf/nan padding must not leak
    if n * p != L:
        h = F.pad(h, (0, 0, 0, n * p - L))
        mask = F.pad(mask, (0, n * p - L), value=False)
    sums = h.reshape(B, n, p, d).sum(dim=2)  # (B, n, d)
    counts = mask.view(B, n, p).sum(dim=2)  # (B, n)
    pooled = sums / counts.clamp(min=1).to(sums.dtype)[..., None]
    return pooled, counts > 0


def max_pool_scores(
    scores: torch.Tensor, mask: torch.Tensor, p: int, *, inplace: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """WaLDORf eq. (5), masked: max of pre-softmax scores over each p x p block of valid pairs.

    ``scores`` (B, H, L, L) (query axis, then key axis), ``mask`` (B, L) bool -> ``pooled``
    (B, H, ceil(L/p), ceil(L/p)) in ``scores.dtype`` with :data:`SCORE_MASKED` on blocks without a
    valid pair, and ``valid`` (B, ceil(L/p), ceil(L/p)) bool (the same for every head).
    ``inplace=True`` overwrites ``scores`` (the capture's own temporary) to save one (B, H, L, L) copy.
    """
    B, H, L, L2 = scores.shape
    assert L == L2 and mask.shape == (B, L), (scores.shape, mask.shape)
    n = n_groups(L, p)
    # Two separable steps, so that only one pass touches the full (B, H, L, L) map: padded keys get
    # -inf through a broadcast add, the key axis is max-pooled, and only then are padded queries
    # masked, on a tensor p times smaller. (A p x p block has a valid pair iff it has a valid query
    # row and a valid key column, so masking the two axes one after the other is exact.)
    key_bias = torch.zeros(B, 1, 1, L, dtype=scores.dtype, device=scores.device)
    key_bias.masked_fill_(~mask[:, None, None, :], float("-inf"))
    x = scores.add_(key_bias) if inplace else scores + key_bias  # (B, H, L, L)
    if p > 1:
        # ceil_mode: the partial last window pools only the keys that exist
        x = F.max_pool1d(x.reshape(B * H, L, L), p, ceil_mode=True).view(B, H, L, n)
    q_mask = mask if n * p == L else F.pad(mask, (0, n * p - L), value=False)
    if n * p != L:
        x = F.pad(x, (0, 0, 0, n * p - L), value=float("-inf"))
    q_fill = x.masked_fill_ if inplace else x.masked_fill  # x is ours when inplace
    x = q_fill(~q_mask[:, None, :, None], float("-inf"))  # (B, H, n*p, n)
    if p > 1:
        x = x.view(B, H, n, p, n).amax(dim=3)  # (B, H, n, n)
    v = pooled_mask(mask, p)  # (B, n)
    valid = v[:, :, None] & v[:, None, :]  # (B, n, n)
    # Blocks without a valid pair are exactly the ones left at -inf, which is SCORE_MASKED.
    return x, valid
