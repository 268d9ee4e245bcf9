"""The compact forms of teacher signals: store the lesson, not the tensor (shared by the capture and the losses).

A WaLDORf row of BERT-Large is 3.2 MB as dense float16 (embedding output, 8 pooled hidden layers, 8 pooled score
maps), so a student reading a cache of them is bound by the disk, and a live teacher is faster. Each signal has a
form a tenth of that size which keeps what its loss uses; the measurements behind each choice are in
docs/precision.md. Pure torch, batched, on any device:

* **Hidden states in the teacher's principal subspace** (:func:`fit_subspace`, :func:`to_coords`): per cached layer,
  the mean ``mu`` (d,) and the top-r eigenvectors ``U`` (d, r) of the covariance of its pooled states, fitted once on
  a sample of rows while caching (centred, not standardised: the WaLDORf loss is an MSE in the teacher's own
  coordinates, and PCA of the raw centred states keeps exactly the part of that MSE a subspace can keep); a row
  stores ``c = U^T (h - mu)`` (r values a position instead of d). The losses compare the student in the same
  subspace (:func:`subspace_mse`, :func:`subspace_cosine`): reconstructing the target and using the full MSE would
  also push the student's part outside the subspace to zero, a target the teacher never gave.
* **Pooled attention scores as low-rank factors per head** (:func:`low_rank_factors`): each head's max-pooled map
  (n x n over the row's real blocks) is ``left^T right`` with ``left``, ``right`` (r, n), from a randomized subspace
  iteration (Halko, Martinsson and Tropp 2011, Alg. 4.4 with a Rayleigh-Ritz step): batched matmuls and
  eigendecompositions of (r + 8) x (r + 8) matrices only, so a GPU runs it for thousands of maps at once (cuSOLVER's
  batched SVD stops at 32 x 32; BERT-Large's pooled maps are 96 x 96). :func:`scores_from_factors` rebuilds the
  dense map the WaLDORf attention MSE (eq. 4) compares.
* **Attention probabilities as low-rank factors of their scores** (``center_rows``): the softmax ignores each query's
  mean score, so the factors are of the row-centred map, and :func:`probs_from_factors` gives back the dense
  probabilities the MiniALBERT attention KL (eq. 7) compares. Measured on the embedded MiniLM, rank 8 (16 int8
  values a query) loses less (KL 0.008-0.09 nats a query) than the top-8 keys with one tail bucket (24 bytes a query:
  0.08-0.15 nats), most of all in the last layers, whose attention is broad.
* **The embedding-layer output is derived**, not stored: it is a lookup of the input ids plus a LayerNorm
  (:class:`DerivedEmbeddings`), computed from the teacher's tables that the store keeps once; the capture checks
  the derived values against the teacher's own on every batch it caches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

LOW_RANK_OVERSAMPLING = 8
"""Extra directions of the randomized range finder: the subspace iteration runs on r + 8 (Halko et al. sec. 4.2)."""
LOW_RANK_ITERATIONS = 2
"""Power iterations: with a spectrum that decays like the pooled score maps' the residual is within ~1% of the best
rank-r one (tested against an exact SVD)."""
LOW_RANK_SEED = 20240611
"""Seed of the fixed random test matrix: the same for every map, so the factors are a function of the map."""
_EIG_FLOOR = 1e-5
"""Eigenvalues of a Gram matrix below this share of its largest are dropped: directions of a map of lower rank than
r + 8 (a short row), and any whose singular value is under 0.3% of the largest (float32 cannot orthonormalize them;
they carry under 1e-5 of the map's energy)."""


# ---------------------------------------------------------------------------------------------------------------
# hidden states: the principal subspace
# ---------------------------------------------------------------------------------------------------------------


class CovarianceSum:
    """Running sums of pooled hidden states (float64) for :func:`fit_subspace`; fed a batch's valid positions."""

    def __init__(self, d: int):
        self.n = 0
        self.sum = torch.zeros(d, dtype=torch.float64)
        self.outer = torch.zeros(d, d, dtype=torch.float64)

    def add(self, x: torch.Tensor) -> None:
        """``x`` (n, d): states of valid positions (any device and float dtype)."""
        x = x.detach().to("cpu", torch.float64)
        self.n += x.shape[0]
        self.sum += x.sum(dim=0)
        self.outer += x.T @ x


def fit_subspace(acc: CovarianceSum, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean (d,), basis (d, rank), variance of every principal component, descending (d,)), float64 on the CPU.

    The basis is the top-``rank`` eigenvectors of the covariance of the accumulated states, each signed so that its
    largest-magnitude entry is positive (an eigenvector's sign is otherwise arbitrary): a deterministic function of
    the sums on a given machine and thread count."""
    if acc.n < 2:
        raise ValueError(f"a subspace fit needs states of at least 2 positions, got {acc.n}")
    mean = acc.sum / acc.n
    cov = acc.outer / acc.n - torch.outer(mean, mean)
    cov = (cov + cov.T) / 2
    values, vectors = torch.linalg.eigh(cov)  # ascending
    values, vectors = values.flip(0).clamp(min=0.0), vectors.flip(1)
    basis = vectors[:, :rank]
    sign = torch.sign(basis.gather(0, basis.abs().argmax(dim=0, keepdim=True)))
    return mean, basis * sign, values


def variance_kept(values: torch.Tensor, ranks: list[int]) -> dict[int, float]:
    """{r: share of the total variance the top-r components keep} for the fit's component variances."""
    total = float(values.sum())
    cum = values.cumsum(0)
    return {r: float(cum[min(r, len(values)) - 1]) / total if total > 0 else 1.0 for r in ranks}


def to_coords(pooled: torch.Tensor, mean: torch.Tensor, basis: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``pooled`` (B, n, d) states -> (B, n, r) coordinates ``U^T (h - mu)`` in float32, 0 at invalid positions."""
    c = (pooled.float() - mean.float()) @ basis.float()  # (B, n, r)
    return c.masked_fill(~valid[..., None], 0.0)


# ---------------------------------------------------------------------------------------------------------------
# pooled attention scores: low-rank factors
# ---------------------------------------------------------------------------------------------------------------


def _test_matrix(n: int, k: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(LOW_RANK_SEED)
    return torch.randn(n, k, generator=g, dtype=torch.float32).to(device)


def _orthonormal(y: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning ``y`` (G, n, k) (Gram eigendecomposition: batched k x k, any rank; dropped
    directions come back as zero columns)."""
    w, v = torch.linalg.eigh(y.transpose(1, 2) @ y)  # (G, k), (G, k, k)
    keep = w > _EIG_FLOOR * w[:, -1:].clamp(min=torch.finfo(w.dtype).tiny)
    inv = torch.where(keep, w.clamp(min=torch.finfo(w.dtype).tiny).rsqrt(), torch.zeros_like(w))
    return y @ (v * inv[:, None, :])


def low_rank_factors(maps: torch.Tensor, valid: torch.Tensor, rank: int, *,
                     center_rows: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-``rank`` factors of each head's score map over its valid (query, key) pairs.

    ``maps`` (B, H, n, n) pre-softmax scores (any value, ``-inf`` included, on invalid pairs), ``valid`` (B, n) the
    valid positions -> ``left``, ``right`` (B, H, rank, n) float32 with ``left^T right`` ~ the map on the valid pairs
    (the best rank-``rank`` approximation up to the randomized method's ~1%), 0 at invalid positions; the singular
    values are split evenly between the two (``left = sqrt(s) u``, ``right = sqrt(s) v``), so both have the same
    scale, which suits a per-component int8 scale. A map of rank below ``rank`` gets zero components. Invalid pairs
    are zeroed first: the factors of the zero-padded map are those of its valid block. ``center_rows``: each query's
    mean over the valid keys is taken out first (a softmax ignores it: for attention probabilities), so no component
    is spent on it."""
    B, H, n, n2 = maps.shape
    assert n == n2 and valid.shape == (B, n), (maps.shape, valid.shape)
    pair = valid[:, None, :, None] & valid[:, None, None, :]
    with torch.autocast(maps.device.type, enabled=False):
        m = maps.float().masked_fill(~pair, 0.0)  # (B, H, n, n)
        if center_rows:
            keys = valid.sum(dim=1).clamp(min=1).float()[:, None, None, None]
            m = (m - m.sum(dim=-1, keepdim=True) / keys).masked_fill_(~pair, 0.0)
        m = m.reshape(B * H, n, n)  # (G, n, n)
        k = min(rank + LOW_RANK_OVERSAMPLING, n)
        mt = m.transpose(1, 2)
        q = _orthonormal(m @ _test_matrix(n, k, maps.device))  # (G, n, k)
        for _ in range(LOW_RANK_ITERATIONS):  # orthonormal after every product: a Gram matrix spans s^2, not s^4
            q = _orthonormal(m @ _orthonormal(mt @ q))  # (G, n, k): the range of the map
        b = q.transpose(1, 2) @ m  # (G, k, n)
        w, v = torch.linalg.eigh(b @ b.transpose(1, 2))  # ascending, (G, k), (G, k, k)
        w, v = w.flip(1)[:, :rank], v.flip(2)[:, :, :rank]  # the top singular values squared and their vectors
        r = w.shape[1]
        keep = w > _EIG_FLOOR * w[:, :1].clamp(min=torch.finfo(w.dtype).tiny)
        s = torch.where(keep, w.clamp(min=0.0).sqrt(), torch.zeros_like(w))  # (G, r) singular values
        left = (q @ v) * s.sqrt()[:, None, :]  # (G, n, r): sqrt(s) u
        inv = torch.where(keep, s.clamp(min=torch.finfo(s.dtype).tiny).rsqrt(), torch.zeros_like(s))
        right = (b.transpose(1, 2) @ v) * inv[:, None, :]  # (G, n, r): B^T v / sqrt(s) = sqrt(s) v
        if r < rank:  # a map smaller than the rank (n < rank): zero components
            left, right = F.pad(left, (0, rank - r)), F.pad(right, (0, rank - r))
    left = left.reshape(B, H, n, rank).transpose(2, 3)  # (B, H, rank, n)
    right = right.reshape(B, H, n, rank).transpose(2, 3)
    keep_pos = valid[:, None, None, :]
    return left.masked_fill(~keep_pos, 0.0), right.masked_fill(~keep_pos, 0.0)


def scores_from_factors(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """(B, H, r, n) factors -> (B, H, n, n) dense scores ``left^T right`` in float32 (0 where a position is padding:
    losses mask those blocks)."""
    return left.float().transpose(2, 3) @ right.float()


def probs_from_factors(left: torch.Tensor, right: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, H, r, L) factors of row-centred scores and the (B, L) bool mask -> (B, H, L, L) attention probabilities in
    float32: the softmax over the valid keys of ``left^T right``, 0 at padded keys and padded queries (the dense
    ``attn_probs`` a cache without factors holds)."""
    keys = mask[:, None, None, :]
    p = torch.softmax(scores_from_factors(left, right).masked_fill(~keys, float("-inf")), dim=-1)
    return p.masked_fill(~mask[:, None, :, None], 0.0)


# ---------------------------------------------------------------------------------------------------------------
# the embedding-layer output, derived
# ---------------------------------------------------------------------------------------------------------------

EMBEDDING_TABLES = ("word", "position", "token_type", "norm_weight", "norm_bias")
"""The arrays a :class:`DerivedEmbeddings` is made of (the store's ``constants/embeddings/<name>``)."""
POSITIONS = ("absolute", "after_padding")
"""How position ids are counted: ``absolute`` 0, 1, 2, ... (BERT, ELECTRA); ``after_padding`` from
``pad_id + 1`` over the tokens that are not the pad id, which keep position ``pad_id`` (RoBERTa)."""


class DerivedEmbeddings(nn.Module):
    """A BERT-family embedding layer rebuilt from its tables: ``LayerNorm(word[ids] + position[pos] +
    token_type[types])`` in float32, 0 at padding. What BERT, RoBERTa and ELECTRA's embedding modules compute in
    ``eval()`` (dropout off); :func:`distillpipe.teacher.capture.embedding_tables` reads the tables off a teacher and
    the capture checks the result against the teacher's own output on every batch."""

    def __init__(self, tables: Mapping[str, np.ndarray | torch.Tensor], *, eps: float, positions: str, pad_id: int):
        super().__init__()
        if positions not in POSITIONS:
            raise ValueError(f"positions={positions!r}: one of {POSITIONS}")
        missing = [t for t in EMBEDDING_TABLES if t not in tables]
        if missing:
            raise ValueError(f"derived embeddings need the tables {list(EMBEDDING_TABLES)}; missing {missing}")
        for name in EMBEDDING_TABLES:
            self.register_buffer(name, torch.as_tensor(np.asarray(tables[name]), dtype=torch.float32), persistent=False)
        self.eps, self.positions, self.pad_id = float(eps), positions, int(pad_id)

    @property
    def width(self) -> int:
        return int(self.word.shape[1])

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, L) ids, token types and bool mask -> (B, L, e) float32, 0 at padding."""
        B, L = input_ids.shape
        if self.positions == "absolute":
            pos = torch.arange(L, device=input_ids.device).expand(B, L)
        else:  # RoBERTa's create_position_ids_from_input_ids: counted over the tokens that are not the pad id
            real = (input_ids != self.pad_id).long()
            pos = real.cumsum(dim=1) * real + self.pad_id
        x = self.word[input_ids] + self.position[pos] + self.token_type[token_type_ids]  # (B, L, e)
        x = F.layer_norm(x, (x.shape[-1],), self.norm_weight, self.norm_bias, self.eps)
        return x.masked_fill(~mask[..., None], 0.0)


# ---------------------------------------------------------------------------------------------------------------
# a store's constants, on a device
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Constants:
    """What the compact forms need besides a row, on one device: each cached layer's principal subspace
    ``{layer: (mean (d,), basis (d, r))}`` and the derived embedding layer (None when not cached)."""

    subspaces: Mapping[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    embeddings: DerivedEmbeddings | None = None

    def to(self, device: torch.device | str) -> Constants:
        return Constants(subspaces={j: (m.to(device), u.to(device)) for j, (m, u) in self.subspaces.items()},
                         embeddings=None if self.embeddings is None else self.embeddings.to(device))
