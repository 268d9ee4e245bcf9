"""What a teacher-cache store holds: the signal spec and the array layout it implies.

A :class:`SignalSpec` says which teacher signals are cached (task logits, MLM top-k, pooled
hidden states, pooled attention scores, optional attention probabilities and embeddings) and the
sizes that fix their shapes. It is the one description of a store's signals: the capture
(:func:`distillpipe.teacher.capture.capture_batch`) computes what a spec selects, the store
manifest serializes it, and training reads it back. The user's params
(:class:`distillpipe.config.teacher_cache.SignalsConfig`) become a spec in one place,
:func:`distillpipe.teacher.cache.signal_spec`. :func:`array_layout` turns a spec, the row count ``N``
and the shard size into the exact list of Zarr arrays (name, shape, inner chunks, shards, dtype,
fill value).

Array names are spelled here only (:data:`LOGITS`, :func:`hidden_array`, ...): the capture's outputs,
the layout, the objective's reads and the collation's crops all use these.

Layout rules (format version 5). Each array has one of three codec chains (:data:`CODECS`), chosen per array
group from a measurement (``benchmarks/store_codecs.py``: ratio on real values and on padding, encode and decode
GB/s a core), each ending with a crc32c per inner chunk:

* Every array is sharded along rows only: one Zarr shard = ``shard_rows`` rows = one work shard,
  i.e. one file per array per shard. Inner chunks never split the row's last axes beyond axis 1.
* ``raw`` (``bytes`` -> ``crc32c``) for per-position arrays (``hidden/L{j}``, ``embeddings`` and their int8 codes):
  dense float16 or int8 values do not compress (lz4 1.00x on real positions), so a compressor only cost CPU; the
  padding is kept free instead by inner chunks of one row and :func:`position_block` positions: a chunk that is all
  padding (the fill value) is not stored (Zarr's ``write_empty_chunks=False``). A row stores its real positions
  rounded up to a block (~8 KiB, and at most 1/32 of the positions).
* ``lz4`` (Blosc lz4, clevel 1, no shuffle) for the attention maps (``attn_scores/L{j}``, ``attn_probs/L{j}`` and
  int8 codes), 8-64 rows a chunk: their padding is quadratic (padded queries AND padded keys), which no block of
  positions leaves out exactly (blocks of 8 x 8 keep ~10% more bytes, and cutting them out costs a strided copy);
  lz4 without shuffle at clevel 1 removes it at ~2 GB/s a core (2-3x the shuffled clevel 5 it replaces, same
  ratio), and passes the real values at 1.0x.
* ``lz4+shuffle`` (Blosc lz4, clevel 5, byte shuffle) for the small per-row arrays (row index, lengths, task logits,
  the MLM top-k, scales): ids and sorted logits do compress (0.66), and they are KBs a row. Inner chunks of both
  lz4 chains hold 8-64 rows (a power of two dividing ``shard_rows``), the largest that stays under
  :data:`TARGET_CHUNK_BYTES` uncompressed. Capping at 64 rows keeps every chunk boundary on a 64-row grid, so a
  loader block of any multiple of 64 rows is aligned for every array.
* Sequence axes are padded to ``L = max_seq_len`` (pooled: ``ceil(L / pool)``); ``length`` (N,)
  int32 holds the real token count so readers can crop or mask.
* ``attn_scores/L{j}`` marks masked (padding) query/key positions with :data:`ATTN_MASKED`
  (float16 ``-inf``), which is also the array's fill value. ``-inf`` rather than a finite sentinel
  such as -65504 because (1) no finite teacher score can collide with it, (2) ``softmax`` of the
  stored scores is then exactly the teacher's masked attention (exp(-inf) = 0), and (3) a loss that
  forgets to mask turns into ``inf``/``nan`` at once instead of a silently huge but finite error.
  The mask is recoverable as ``isfinite(scores)`` or from ``length``.
* ``mlm/positions`` (N, M) holds the token position of each of the M top-k slots, ``-1`` for unused
  slots (rows with fewer than M masked tokens); the other ``mlm/*`` arrays hold fill values there.

Two layouts: :func:`array_layout` is what readers and training see (the float16 arrays above, whatever the
precision); :func:`stored_layout` is what is on disk. They differ only for the signals whose
:class:`SignalPrecision` is not float16: such an array ``X`` is stored as two plain Zarr arrays, ``X.q`` (int8, or
the MLM's uint8 ``X.steps``) and ``X.scale`` (float16, or the MLM's float32 ``X.anchor``), decoded by the formula
:data:`FORMULAS` spells (also in the manifest's ``encoding`` and in docs/precision.md), so any Zarr reader can decode
them. The math is :mod:`distillpipe.store.quant`.

Limits: ``N * prod(row shape)`` is unbounded (hundreds of GB is fine), but one shard of every
array is held in memory while it is written (:mod:`distillpipe.store.writer`), so ``shard_rows``
must be chosen so that a shard fits in RAM (e.g. attention probabilities of BERT-Large at L=384
are 4.7 MB/row/layer: 1,024 rows is 4.8 GB per layer).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

TASKS = ("none", "classification", "qa")
ATTN_MASKED = np.float16(-np.inf)
"""Value stored at masked (padding) positions of ``attn_scores/L{j}``; see the module docstring."""
MLM_UNUSED_POSITION = -1
"""Value of ``mlm/positions`` for top-k slots beyond the row's number of masked tokens."""
TARGET_CHUNK_BYTES = 4 * 2**20
MIN_CHUNK_ROWS = 8
MAX_CHUNK_ROWS = 64
RAW_BLOCK_BYTES = 8 * 2**10
"""A ``raw`` array's inner chunk holds at least this many bytes of positions (when the row has them): smaller blocks
leave less padding in a row's last block but cost a crc32c call and an index entry each (16 + 4 bytes)."""
RAW_MIN_BLOCK_BYTES = 512
RAW_MAX_BLOCKS_SHARE = 32
"""A ``raw`` array's block holds at most 1/32 of a row's positions."""
RAW, LZ4, LZ4_SHUFFLE = "raw", "lz4", "lz4+shuffle"
CODECS = {RAW: None, LZ4: ("lz4", 1, "noshuffle"), LZ4_SHUFFLE: ("lz4", 5, "shuffle")}
"""Each codec chain's Blosc settings (cname, clevel, shuffle) between ``bytes`` and ``crc32c``; None: no compressor."""

# --- array names: the one place that spells them
ROW_INDEX = "row_index"
"""(N,) int64: the row of the tokens split each store row holds."""
LENGTH = "length"
"""(N,) int32: the real token count of each row."""
LOGITS = "logits"
"""(N, C) classification logits."""
START_LOGITS, END_LOGITS = "start_logits", "end_logits"
"""(N, L) QA span logits."""
MLM = "mlm"
MLM_POSITIONS, MLM_TOPK_IDS = f"{MLM}/positions", f"{MLM}/topk_ids"
MLM_TOPK_LOGITS, MLM_LOGSUMEXP = f"{MLM}/topk_logits", f"{MLM}/logsumexp"
MLM_ARRAYS = (MLM_POSITIONS, MLM_TOPK_IDS, MLM_TOPK_LOGITS, MLM_LOGSUMEXP)
"""The MLM top-k signal: (N, M) positions, (N, M, k) ids and logits, (N, M) full-vocabulary logsumexp."""
EMBEDDINGS = "embeddings"
"""The embedding-layer output (B, L, e), unpooled: a signal the store derives (:data:`EMBEDDING_CONSTANTS`), never an
array of rows."""
HIDDEN, ATTN_SCORES, ATTN_PROBS = "hidden", "attn_scores", "attn_probs"
"""The per-layer groups: ``<group>/L{j}``, one signal per teacher layer j."""
CONSTANTS = "constants"
"""The group of the arrays a store holds once, not per row (:func:`constant_names`)."""


def hidden_array(j: int) -> str:
    """Layer j's hidden states, average-pooled p x: (N, ceil(L/p), d), or their coordinates in the layer's principal
    subspace (N, ceil(L/p), r) when the spec's ``hidden_rank`` is r > 0."""
    return f"{HIDDEN}/L{j}"


def attn_scores_array(j: int) -> str:
    """Layer j's pre-softmax attention scores, max-pooled p x p: (N, H, ceil(L/p), ceil(L/p)); with ``attn_rank`` r > 0
    the signal is stored as the two arrays of :func:`attn_factor_arrays` instead."""
    return f"{ATTN_SCORES}/L{j}"


def attn_probs_array(j: int) -> str:
    """Layer j's attention probabilities, unpooled: (N, H, L, L); with ``attn_rank`` r > 0 stored as the two arrays of
    :func:`attn_factor_arrays` instead."""
    return f"{ATTN_PROBS}/L{j}"


def attn_factor_arrays(signal: str) -> tuple[str, str]:
    """The rank-r factors ``left`` and ``right`` (N, H, r, n) of attention signal ``signal`` (``attn_scores/L{j}``:
    the pooled scores are ``left^T right`` per head over the real blocks; ``attn_probs/L{j}``: the probabilities are
    the softmax over the real keys of ``left^T right``, the scores with each query's mean taken out, which the softmax
    ignores), n the signal's sequence length (:mod:`distillpipe.compact`)."""
    return f"{signal}/left", f"{signal}/right"


def subspace_arrays(j: int) -> tuple[str, str]:
    """The constants of layer j's principal subspace: ``mean`` (d,) and ``basis`` (d, r), float32."""
    return f"{CONSTANTS}/{HIDDEN}/L{j}/mean", f"{CONSTANTS}/{HIDDEN}/L{j}/basis"


EMBEDDING_CONSTANTS = tuple(f"{CONSTANTS}/{EMBEDDINGS}/{t}" for t in
                            ("word", "position", "token_type", "norm_weight", "norm_bias"))
"""The teacher's embedding tables (float32): the derived embedding output is ``LayerNorm(word[ids] + position[pos] +
token_type[types])`` (:class:`distillpipe.compact.DerivedEmbeddings`)."""


def array_group(name: str) -> str:
    """``hidden``, ``attn_scores``, ``attn_probs`` or ``mlm`` for the arrays of those groups; else the name itself."""
    return name.split("/", 1)[0]


def dense_scores(name: str) -> bool:
    """Whether ``name`` is a dense pooled score map (``attn_scores/L{j}``, ``-inf`` on masked blocks), not factors."""
    return array_group(name) == ATTN_SCORES and name.count("/") == 1


# --- precision: the stored forms of the quantizable signals
PRECISION_CHOICES = {"hidden": ("float16", "int8"), "attention": ("float16", "int8"),
                     "mlm_topk": ("float16", "uint8")}
"""The stored precisions of each quantizable signal: ``attention`` is the dense pooled scores or the factors of either
attention signal (dense attention probabilities and task logits stay float16)."""
INT8_ROWS, INT8_SCORES, UINT8_STEPS = "int8_rows", "int8_scores", "uint8_steps"
"""The encodings: symmetric int8 per row vector (hidden states or their subspace coordinates, score factors), the
same keeping the ``-inf`` of masked scores (dense attention scores), uint8 steps below an anchor (MLM top-k logits)."""
MLM_STEP = 1 / 16
"""Nats per uint8 step of the MLM top-k logits: steps reach 255 / 16 = 15.9 nats below the top-1 logit (a token
further below has a probability under e^-15.9 = 1.2e-7 of the top-1's, and is stored at 15.9); the rounding error is
at most 1/32 nats a logit, a KL of ~(1/16)^2 / 24 = 1.6e-4 nats at most over the top-k."""
SCORES_MASKED_Q = -128
"""The int8 code of a masked (``-inf``) attention score; finite scores use -127..127."""
FORMULAS = {
    INT8_ROWS: "X = float16(float32(X.q) * float32(X.scale)[..., None]); the product of an int8 and a float16 is "
               "exact in float32, so one rounding to float16. Written as X.scale = max|x| / 127 over the last axis, "
               "rounded to float16 upwards and at least 2^-24 (the smallest float16: an all-zero vector's; never "
               "0), X.q = round_half_even(x / scale); in a vector with 127 * scale > 65504 clipped to "
               "+-floor(65504 / scale) so that every code decodes finite",
    INT8_SCORES: "X = float16(float32(X.q) * float32(X.scale)[..., None]), and X = -inf where X.q == -128 (a masked "
                 "position); otherwise as int8_rows, max|x| over the finite scores of the (head, query) row (a fully "
                 "masked row: scale 2^-24 and every X.q -128)",
    UINT8_STEPS: "X = float16(float32(X.anchor)[..., None] - float32(X.steps) / 16) in float32 arithmetic (steps / 16 "
                 "is exact; then one float32 and one float16 rounding). Written as X.steps = min(255, "
                 "round_half_even(16 * (max(x) - x))) over the last (rank) axis, and "
                 "X.anchor = float32(logsumexp(x) - logsumexp(-X.steps / 16)) in float64: the decoded top-k logits "
                 "hold the teacher's top-k probability mass (so mlm/logsumexp, stored as it was, keeps the tail "
                 "mass 1 - sum(exp(X - logsumexp)) exact up to the float16 rounding a float16 store has too)",
}
"""How each stored form decodes (and was encoded): the text the manifest's ``encoding`` carries."""


COMPACT_FORMULAS = {
    "hidden": "h = mean + coords @ basis.T per position (coords: hidden/L{j}, (N, ceil(L/p), r); mean (d,) and basis "
              "(d, r): constants/hidden/L{j}/mean and /basis, float32, orthonormal columns): the layer's pooled states "
              "in its top-r principal subspace, fitted on hidden_fit_rows of the cached rows; 0 at pooled positions "
              "past the row's length (length, ceil(length / p))",
    "attn_scores": "scores[h] = left[h].T @ right[h] (left, right: attn_scores/L{j}/left and /right, (N, H, r, "
                   "ceil(L/p))) on the n x n real blocks, n = ceil(length / p); -inf on every other block",
    "attn_probs": "probs[h] = softmax over the row's real keys of left[h].T @ right[h] (attn_probs/L{j}/left and "
                  "/right, (N, H, r, L): the scores with each query's mean over the real keys taken out); 0 at "
                  "padded queries and keys",
    "embeddings": "e = LayerNorm(word[ids] + position[pos] + token_type[types]) with weight norm_weight, bias "
                  "norm_bias and the constants.json info's eps (constants/embeddings/*, float32); pos = 0, 1, ... "
                  "(positions 'absolute') or, over the ids that are not pad_id, pad_id + 1, pad_id + 2, ... "
                  "(RoBERTa's 'after_padding'); 0 at padding",
}
"""How each compact signal reconstructs from what the store holds (after the int8 decoding of :data:`FORMULAS`): the
text the manifest's ``compact`` carries, for a reader with Zarr and numpy only."""


@dataclass(frozen=True)
class SignalPrecision:
    """How each quantizable signal is stored: ``float16`` (as computed, the default) or a compressed form
    (:data:`PRECISION_CHOICES`); part of the :class:`SignalSpec`, so of the store's identity. Readers always see
    float16 (:func:`array_layout`); only the bytes on disk differ (:func:`stored_layout`)."""

    hidden: str = "float16"
    attention: str = "float16"
    mlm_topk: str = "float16"

    def __post_init__(self) -> None:
        for name, choices in PRECISION_CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"precision.{name}={getattr(self, name)!r}: one of {list(choices)}")


@dataclass(frozen=True)
class Encoding:
    """The stored form of one quantized array: its encoding (:data:`FORMULAS`) and its two stored arrays."""

    kind: str
    values: str
    """int8 codes (``X.q``) or uint8 steps (``X.steps``): the array's shape."""
    scale: str
    """float16 scales (``X.scale``) or float32 anchors (``X.anchor``): the array's shape without its last axis."""

    @property
    def formula(self) -> str:
        return FORMULAS[self.kind]


def logit_arrays(task: str) -> tuple[str, ...]:
    """The task-logit arrays of ``task`` (one of :data:`TASKS`)."""
    return {"none": (), "classification": (LOGITS,), "qa": (START_LOGITS, END_LOGITS)}[task]


@dataclass(frozen=True, kw_only=True)
class SignalSpec:
    """Which teacher signals a store caches, and the sizes that fix their shapes.

    Built from the user's :class:`~distillpipe.config.teacher_cache.SignalsConfig` and the teacher by
    :func:`distillpipe.teacher.cache.signal_spec`; the capture checks a spec against the model it runs
    (:func:`distillpipe.teacher.capture.check_spec`). Serialized as the manifest's ``signals``
    (:meth:`to_dict`): part of the store's identity."""

    max_seq_len: int
    """L: token sequence length that per-token arrays are padded to."""
    pool: int
    """p: hidden states are average-pooled p x along the sequence, attention scores max-pooled
    p x p. 1 = no pooling (MiniALBERT uses unpooled maps)."""
    task: str
    """'none' (general distillation), 'classification' (``logits`` (N, C)) or 'qa'
    (``start_logits``/``end_logits`` (N, L))."""
    n_classes: int
    """C for task='classification' (regression is cast to classes upstream); 0 otherwise."""
    vocab_size: int
    """Teacher vocabulary size; picks the dtype of ``mlm/topk_ids``."""
    mlm_topk: int
    """k: MLM logits kept per masked position (0 = no MLM signal, e.g. no MLM head)."""
    mlm_max_masked: int
    """M: most masked positions in any row; 0 when mlm_topk is 0."""
    hidden_layers: tuple[int, ...]
    """Layers j whose hidden states are cached as ``hidden/L{j}``; strictly increasing."""
    hidden_size: int
    """d: teacher hidden size."""
    attn_layers: tuple[int, ...]
    """Layers j whose pre-softmax attention scores are cached as ``attn_scores/L{j}``."""
    n_heads: int
    """H: teacher attention heads."""
    attn_probs_layers: tuple[int, ...]
    """Layers j whose attention probabilities (unpooled) are cached as ``attn_probs/L{j}``."""
    embedding_size: int
    """e: width of the embedding-layer output (B, L, e), derived from the teacher's embedding tables the store keeps
    once (:data:`EMBEDDING_CONSTANTS`); 0 = not kept."""
    hidden_rank: int = 0
    """r: hidden states stored as their coordinates in each layer's top-r principal subspace (fitted while caching:
    :mod:`distillpipe.compact`); 0 = the full width d."""
    hidden_fit_rows: int = 0
    """Rows (evenly spaced over the cached ones) whose states fit the subspaces; 0 exactly when ``hidden_rank`` is."""
    attn_rank: int = 0
    """r: attention maps (pooled scores, or probabilities) stored as rank-r factors per head
    (:func:`attn_factor_arrays`); 0 = dense maps."""
    precision: SignalPrecision = SignalPrecision()
    """How the quantizable signals are stored; a compressed precision only for signals the spec keeps (the build
    writes float16 for the others: :func:`distillpipe.teacher.cache.spec_for`), so that an unused setting never
    changes a store's identity."""

    def __post_init__(self) -> None:
        if isinstance(self.precision, dict):  # from a manifest
            object.__setattr__(self, "precision", SignalPrecision(**self.precision))
        kept = {"hidden": bool(self.hidden_layers),
                "attention": bool(self.attn_layers) or bool(self.attn_rank and self.attn_probs_layers),
                "mlm_topk": bool(self.mlm_topk)}
        unused = [k for k, on in kept.items() if not on and getattr(self.precision, k) != "float16"]
        if unused:
            raise ValueError(f"SignalSpec.precision: {unused} not float16, but the spec keeps no such signal")
        for name in ("hidden_layers", "attn_layers", "attn_probs_layers"):
            value = tuple(int(j) for j in getattr(self, name))
            object.__setattr__(self, name, value)
            if any(j < 0 for j in value) or list(value) != sorted(set(value)):
                raise ValueError(f"SignalSpec.{name} must be strictly increasing layer indices >= 0, got {value}")
        for name in ("max_seq_len", "pool", "vocab_size", "hidden_size", "n_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"SignalSpec.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("n_classes", "mlm_topk", "mlm_max_masked", "embedding_size", "hidden_rank", "hidden_fit_rows",
                     "attn_rank"):
            if getattr(self, name) < 0:
                raise ValueError(f"SignalSpec.{name} must be >= 0, got {getattr(self, name)}")
        for name, signal, on in (("hidden_rank", "hidden_layers", self.hidden_layers),
                                 ("attn_rank", "attention layers", self.attn_layers or self.attn_probs_layers)):
            if getattr(self, name) and not on:
                raise ValueError(f"SignalSpec.{name}={getattr(self, name)} but the spec keeps no {signal}")
        if self.hidden_rank > self.hidden_size:
            raise ValueError(f"SignalSpec.hidden_rank={self.hidden_rank} exceeds hidden_size={self.hidden_size}")
        if (self.hidden_rank > 0) != (self.hidden_fit_rows > 0):
            raise ValueError(f"SignalSpec.hidden_fit_rows must be > 0 exactly when hidden_rank is (hidden_rank="
                             f"{self.hidden_rank}, hidden_fit_rows={self.hidden_fit_rows})")
        if self.task not in TASKS:
            raise ValueError(f"SignalSpec.task must be one of {TASKS}, got {self.task!r}")
        if (self.task == "classification") != (self.n_classes > 0):
            raise ValueError(
                f"SignalSpec.n_classes must be > 0 exactly when task='classification' "
                f"(task={self.task!r}, n_classes={self.n_classes})"
            )
        if (self.mlm_topk > 0) != (self.mlm_max_masked > 0):
            raise ValueError(
                f"SignalSpec.mlm_topk and mlm_max_masked must both be 0 (no MLM) or both > 0, "
                f"got mlm_topk={self.mlm_topk}, mlm_max_masked={self.mlm_max_masked}"
            )
        if self.mlm_topk > self.vocab_size:
            raise ValueError(f"SignalSpec.mlm_topk={self.mlm_topk} exceeds vocab_size={self.vocab_size}")
        if self.mlm_max_masked > self.max_seq_len:
            raise ValueError(f"SignalSpec.mlm_max_masked={self.mlm_max_masked} exceeds max_seq_len={self.max_seq_len}")

    @property
    def pooled_len(self) -> int:
        """ceil(L / p): length of pooled sequence axes."""
        return math.ceil(self.max_seq_len / self.pool)

    def encodings(self) -> dict[str, Encoding]:
        """{array name: its stored form} for the arrays stored compressed (float16 ones are stored as they are)."""
        p, out = self.precision, {}
        if p.hidden == "int8":
            out.update({hidden_array(j): _encoding(INT8_ROWS, hidden_array(j)) for j in self.hidden_layers})
        if p.attention == "int8":
            for j in self.attn_layers:
                if self.attn_rank:
                    out.update({a: _encoding(INT8_ROWS, a) for a in attn_factor_arrays(attn_scores_array(j))})
                else:
                    out[attn_scores_array(j)] = _encoding(INT8_SCORES, attn_scores_array(j))
            for j in self.attn_probs_layers if self.attn_rank else ():
                out.update({a: _encoding(INT8_ROWS, a) for a in attn_factor_arrays(attn_probs_array(j))})
        if p.mlm_topk == "uint8" and self.mlm_topk:
            out[MLM_TOPK_LOGITS] = _encoding(UINT8_STEPS, MLM_TOPK_LOGITS)
        return out

    def compact(self) -> dict[str, str]:
        """{signal group: how it reconstructs} for the compact forms this spec stores (:data:`COMPACT_FORMULAS`)."""
        kept = {"hidden": bool(self.hidden_rank), "attn_scores": bool(self.attn_rank and self.attn_layers),
                "attn_probs": bool(self.attn_rank and self.attn_probs_layers), "embeddings": bool(self.embedding_size)}
        return {k: COMPACT_FORMULAS[k] for k, on in kept.items() if on}

    @property
    def mlm_ids_dtype(self) -> np.dtype:
        return np.dtype(np.uint16) if self.vocab_size < 2**16 else np.dtype(np.int32)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("hidden_layers", "attn_layers", "attn_probs_layers"):
            d[name] = list(d[name])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SignalSpec:
        names = {f.name for f in fields(cls)}
        unknown, missing = sorted(set(d) - names), sorted(names - set(d))
        if unknown or missing:
            raise ValueError(f"signal spec: unknown keys {unknown}, missing keys {missing}")
        return cls(**d)


def _encoding(kind: str, name: str) -> Encoding:
    if kind == UINT8_STEPS:
        return Encoding(kind, f"{name}.steps", f"{name}.anchor")
    return Encoding(kind, f"{name}.q", f"{name}.scale")


@dataclass(frozen=True)
class ArraySpec:
    """One Zarr array of a store: row axis first, sharded along rows only."""

    name: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    shards: tuple[int, ...]
    dtype: np.dtype
    fill_value: Any
    dimension_names: tuple[str, ...]
    codec: str = LZ4_SHUFFLE
    """The codec chain (:data:`CODECS`)."""

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_nbytes(self) -> int:
        return math.prod(self.row_shape) * self.dtype.itemsize

    @property
    def chunk_rows(self) -> int:
        return self.chunks[0]

    @property
    def nbytes(self) -> int:
        """Uncompressed size of the whole array."""
        return self.shape[0] * self.row_nbytes


def chunk_rows_for(row_nbytes: int, shard_rows: int) -> int:
    """Rows per inner chunk: the largest power of two in [8, 64] dividing ``shard_rows`` whose
    chunk stays under TARGET_CHUNK_BYTES (at least 8 rows however big a row is). When
    ``shard_rows`` is not a multiple of 8 the largest power of two dividing it is used."""
    rows = MAX_CHUNK_ROWS
    while rows > MIN_CHUNK_ROWS and rows * row_nbytes > TARGET_CHUNK_BYTES:
        rows //= 2
    while shard_rows % rows:
        rows //= 2
    return rows


def position_block(n_positions: int, position_nbytes: int) -> int:
    """Positions per inner chunk of a ``raw`` array: a divisor of ``n_positions`` (Zarr's shard shape must be a
    multiple of its inner chunks), at most 1/32 of them (a row stores its real positions rounded up to a block: so
    at most ~3% more than its real values, ~1.5% on average), and the smallest such one whose block holds at least
    :data:`RAW_BLOCK_BYTES` (each chunk costs a crc32c call and an index entry), else the largest; but never a block
    under :data:`RAW_MIN_BLOCK_BYTES` where a larger divisor reaches it (tiny rows: the framing would outweigh the
    padding saved)."""
    divisors = [b for b in range(1, n_positions + 1) if n_positions % b == 0]
    small = [b for b in divisors if b <= max(1, n_positions // RAW_MAX_BLOCKS_SHARE)]
    block = next((b for b in small if b * position_nbytes >= RAW_BLOCK_BYTES), small[-1])
    if block * position_nbytes < RAW_MIN_BLOCK_BYTES:
        block = next((b for b in divisors if b * position_nbytes >= RAW_MIN_BLOCK_BYTES), n_positions)
    return block


def codec_of(name: str) -> str:
    """The codec chain of array ``name`` (of either layout; see the module docstring)."""
    base = name.rsplit(".", 1)
    if len(base) == 2 and base[1] in ("scale", "anchor"):
        return LZ4_SHUFFLE
    group = array_group(base[0])
    if group in (HIDDEN, EMBEDDINGS):
        return RAW
    if group in (ATTN_SCORES, ATTN_PROBS):
        return LZ4
    return LZ4_SHUFFLE


def inner_chunks(name: str, row_shape: tuple[int, ...], itemsize: int, shard_rows: int) -> tuple[int, ...]:
    """The inner chunk shape of array ``name``: one row and a block of positions (``raw``), or 8-64 whole rows (``lz4``,
    ``lz4+shuffle``: fewer, larger chunks cost less a byte; lz4 leaves the padding out whatever the chunk)."""
    codec = codec_of(name)
    if codec == RAW:
        block = position_block(row_shape[0], math.prod(row_shape[1:]) * itemsize)
        return (1, block, *row_shape[1:])
    return (chunk_rows_for(math.prod(row_shape) * itemsize, shard_rows), *row_shape)


def _row_arrays(spec: SignalSpec) -> list[tuple[str, tuple[int, ...], np.dtype, Any, tuple[str, ...]]]:
    """(name, row shape, dtype, fill value, dimension names without 'row') for every array."""
    L, Lp, H = spec.max_seq_len, spec.pooled_len, spec.n_heads
    f16, f32 = np.dtype(np.float16), np.dtype(np.float32)
    rows: list[tuple[str, tuple[int, ...], np.dtype, tuple[str, ...]]] = [
        (ROW_INDEX, (), np.dtype(np.int64), ()),
        (LENGTH, (), np.dtype(np.int32), ()),
    ]
    if spec.task == "classification":
        rows.append((LOGITS, (spec.n_classes,), f16, ("class",)))
    elif spec.task == "qa":
        rows.append((START_LOGITS, (L,), f16, ("pos",)))
        rows.append((END_LOGITS, (L,), f16, ("pos",)))
    if spec.mlm_topk:
        M, k = spec.mlm_max_masked, spec.mlm_topk
        pos_dtype = np.dtype(np.int16) if L < 2**15 else np.dtype(np.int32)
        rows.append((MLM_POSITIONS, (M,), pos_dtype, ("slot",)))
        rows.append((MLM_TOPK_IDS, (M, k), spec.mlm_ids_dtype, ("slot", "rank")))
        rows.append((MLM_TOPK_LOGITS, (M, k), f16, ("slot", "rank")))
        rows.append((MLM_LOGSUMEXP, (M,), f32, ("slot",)))
    for j in spec.hidden_layers:
        if spec.hidden_rank:
            rows.append((hidden_array(j), (Lp, spec.hidden_rank), f16, ("pos", "component")))
        else:
            rows.append((hidden_array(j), (Lp, spec.hidden_size), f16, ("pos", "feature")))
    for j in spec.attn_layers:
        if spec.attn_rank:
            rows += [(a, (H, spec.attn_rank, Lp), f16, ("head", "component", "pos"))
                     for a in attn_factor_arrays(attn_scores_array(j))]
        else:
            rows.append((attn_scores_array(j), (H, Lp, Lp), f16, ("head", "query", "key")))
    for j in spec.attn_probs_layers:
        if spec.attn_rank:
            rows += [(a, (H, spec.attn_rank, L), f16, ("head", "component", "pos"))
                     for a in attn_factor_arrays(attn_probs_array(j))]
        else:
            rows.append((attn_probs_array(j), (H, L, L), f16, ("head", "query", "key")))
    # the embedding output is derived from the teacher's tables (constant_names): no array of rows
    # the fill value typed as the array (0.0 for floats, 0 for integers): it is written into the array's metadata
    return [(name, shape, dtype, (float if dtype.kind == "f" else int)(fill_value(name)), dims)
            for name, shape, dtype, dims in rows]


def signal_arrays(spec: SignalSpec) -> list[str]:
    """The arrays a teacher computes for ``spec`` (every array of the store but ``row_index``), in layout order:
    the names :func:`distillpipe.teacher.capture.capture_batch` returns."""
    return [name for name, *_ in _row_arrays(spec) if name != ROW_INDEX]


def signal_parts(spec: SignalSpec, name: str) -> tuple[str, ...]:
    """The arrays of rows that hold signal ``name`` (a loss term's ``hidden/L{j}``, ``attn_scores/L{j}``,
    ``attn_probs/L{j}``, ``embeddings``, ``logits``...) in ``spec``'s stored form: the array itself, the score factors,
    the top-k keys, or none (the embeddings are derived from constants)."""
    if name == EMBEDDINGS:
        return ()
    if array_group(name) in (ATTN_SCORES, ATTN_PROBS) and spec.attn_rank:
        return attn_factor_arrays(name)
    return (name,)


def constant_names(spec: SignalSpec) -> list[str]:
    """The arrays a store of ``spec`` holds once (group ``constants``): each subspace's mean and basis, the teacher's
    embedding tables. Their shapes come from the fit and the teacher (recorded with them:
    :mod:`distillpipe.store.constants`)."""
    names = [a for j in spec.hidden_layers for a in subspace_arrays(j)] if spec.hidden_rank else []
    return names + (list(EMBEDDING_CONSTANTS) if spec.embedding_size else [])


def fill_value(name: str) -> float:
    """The value of array ``name`` where a row has no data (padding, an unused MLM slot): the store's fill value."""
    if dense_scores(name):
        return float(ATTN_MASKED)
    if name == MLM_POSITIONS:
        return MLM_UNUSED_POSITION
    return 0


def array_layout(spec: SignalSpec, n_rows: int, shard_rows: int) -> list[ArraySpec]:
    """Every array a reader of a store for ``spec`` with ``n_rows`` rows sharded every ``shard_rows`` rows sees, in
    a fixed order: the arrays the capture computes and training reads, float16 whatever the precision (on disk:
    :func:`stored_layout`)."""
    if n_rows < 0 or shard_rows < 1:
        raise ValueError(f"need n_rows >= 0 and shard_rows >= 1, got n_rows={n_rows}, shard_rows={shard_rows}")
    return [ArraySpec(name=name, shape=(n_rows, *row_shape),
                      chunks=inner_chunks(name, row_shape, dtype.itemsize, shard_rows),
                      shards=(shard_rows, *row_shape), dtype=dtype, fill_value=fill, dimension_names=("row", *dims),
                      codec=codec_of(name))
            for name, row_shape, dtype, fill, dims in _row_arrays(spec)]


def stored_layout(spec: SignalSpec, n_rows: int, shard_rows: int) -> list[ArraySpec]:
    """The Zarr arrays on disk, in a fixed order (also the order in which a shard's files are written): those of
    :func:`array_layout`, each compressed one (:meth:`SignalSpec.encodings`) replaced by its values and scales. Both
    keep rows per inner chunk on the 64-row grid, so a block aligned for the float16 layout is aligned for the stored
    one. Values keep the array's chunks and codec; scales are small per-row arrays (``lz4+shuffle``)."""
    encodings = spec.encodings()
    out = []
    for a in array_layout(spec, n_rows, shard_rows):
        e = encodings.get(a.name)
        if e is None:
            out.append(a)
            continue
        fill = SCORES_MASKED_Q if e.kind == INT8_SCORES else 0
        values = np.dtype(np.uint8) if e.kind == UINT8_STEPS else np.dtype(np.int8)
        scale = np.dtype(np.float32) if e.kind == UINT8_STEPS else np.dtype(np.float16)
        out.append(ArraySpec(name=e.values, shape=a.shape, chunks=a.chunks, shards=a.shards, dtype=values,
                             fill_value=fill, dimension_names=a.dimension_names, codec=a.codec))
        out.append(ArraySpec(name=e.scale, shape=a.shape[:-1],
                             chunks=inner_chunks(e.scale, a.shape[1:-1], scale.itemsize, shard_rows),
                             shards=a.shards[:-1], dtype=scale, fill_value=0.0,
                             dimension_names=a.dimension_names[:-1], codec=codec_of(e.scale)))
    return out
