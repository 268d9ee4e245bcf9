"""The bytes a teacher cache takes on disk, estimated before they are written: for ``distillpipe plan``
(:mod:`distillpipe.teacher.plan`) and for the build's message when the disk fills up (:mod:`distillpipe.teacher.cache`).

Per row and stored array, the uncompressed bytes are exact (:func:`~distillpipe.store.schema.stored_layout`: a signal
stored in int8 is its int8 values and float16 scales); on disk they are
estimated as the bytes of the real values only: padding, unused MLM slots and ``-inf`` score blocks compress to almost
nothing (lz4), or are not stored (the ``raw`` per-position arrays leave out their blocks of padding positions, so
a row's real positions count rounded up to a block), while float16 activations barely compress; the MLM top-k arrays
do compress, by a measured factor (:data:`COMPRESSION`). The share of real values comes from the rows' token counts
(and masked positions), when they are known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from distillpipe.store.schema import (
    ATTN_PROBS,
    ATTN_SCORES,
    CODECS,
    EMBEDDING_CONSTANTS,
    END_LOGITS,
    HIDDEN,
    MLM,
    RAW,
    START_LOGITS,
    SignalSpec,
    array_group,
    array_layout,
    dense_scores,
    stored_layout,
    subspace_arrays,
)

COMPRESSION = {MLM: 0.66}
"""Bytes on disk / bytes of the real values, for the signal groups that do compress: the MLM top-k (logits sorted
in each slot, ids, positions), measured 0.65 with the store's Blosc lz4 on the embedded wiki store (MiniLM-L6 + its
MLM head, 512 rows: logits 0.59, ids 0.72, positions 0.53, logsumexp 0.71; zstd gave 0.54). Every other group: 1
(float16 activations barely compress)."""
SCORE_SCALES = "attn_scores scales"
"""Occupancy key of the float16 scales of int8 attention scores: one per (head, query) row."""
FACTORS = "factors"
"""Occupancy key of the low-rank factors of attention maps: a value per real position (of the pooled length for
scores, the token length for probabilities)."""


@dataclass(frozen=True)
class ArrayPlan:
    name: str
    group: str
    dtype: str
    row_shape: tuple[int, ...]
    row_bytes: int
    """Uncompressed bytes a row."""
    occupancy: float
    """Fraction of the row that holds real values (not padding or unused slots): 1 when unknown."""
    compression: float
    """Bytes on disk / bytes of the real values (:data:`COMPRESSION`)."""
    overhead: float = 0.0
    """Bytes a row of the shard files' framing: an index entry a chunk (16 B), a crc32c a stored chunk (4 B), and a
    Blosc header a compressed chunk (16 B)."""

    @property
    def est_row_bytes(self) -> float:
        """Estimated bytes a row on disk."""
        return self.row_bytes * self.occupancy * self.compression + self.overhead


def array_plans(spec: SignalSpec, lengths: np.ndarray | None, masked: np.ndarray | None,
                shard_rows: int = 1024) -> list[ArrayPlan]:
    """The store's arrays as stored (:func:`~distillpipe.store.schema.stored_layout`, chunked as in shards of
    ``shard_rows``) with the share of each row that holds real values, from the rows' token counts ``lengths`` (n,)
    and masked positions ``masked`` (n,) (None: unknown, every position counts as real)."""
    L, Lp, p = spec.max_seq_len, spec.pooled_len, spec.pool
    occupancy: dict[str, float] = {}
    if lengths is not None and lengths.size:
        n = lengths.astype(np.float64)
        groups = np.ceil(n / p)
        occupancy = {HIDDEN: groups.mean() / Lp, ATTN_SCORES: (groups**2).mean() / Lp**2,
                     ATTN_PROBS: (n**2).mean() / L**2, START_LOGITS: n.mean() / L, END_LOGITS: n.mean() / L,
                     (FACTORS, ATTN_SCORES): groups.mean() / Lp, (FACTORS, ATTN_PROBS): n.mean() / L}
        occupancy[SCORE_SCALES] = groups.mean() / Lp  # a scale per (head, query) row: real query rows
        if masked is not None and spec.mlm_max_masked:
            occupancy[MLM] = masked.mean() / spec.mlm_max_masked
    scales = {e.scale for name, e in spec.encodings().items() if dense_scores(name)}
    plans = []
    for a in stored_layout(spec, 0, shard_rows):
        factor = a.name.split(".")[0].endswith(("/left", "/right"))
        key = (SCORE_SCALES if a.name in scales else None if factor and a.name.endswith(".scale")  # (head, component)
               else (FACTORS, array_group(a.name)) if factor else array_group(a.name))
        occ = float(occupancy.get(key, 1.0))
        chunks_a_row = math.prod(a.row_shape) / math.prod(a.chunks[1:]) / a.chunks[0]
        stored = chunks_a_row
        if a.codec == RAW and lengths is not None and lengths.size:  # whole blocks of positions are stored
            real = np.ceil(lengths.astype(np.float64) / p)  # hidden states: pooled positions
            block, positions = a.chunks[1], a.row_shape[0]
            occ = float(np.minimum(np.ceil(real / block) * block, positions).mean() / positions)
            stored = chunks_a_row * occ
        framing = 16 * chunks_a_row + (4 + (16 if CODECS[a.codec] else 0)) * stored
        plans.append(ArrayPlan(a.name, array_group(a.name), str(a.dtype), a.row_shape, a.row_nbytes, occ,
                               COMPRESSION.get(array_group(a.name), 1.0), framing))
    return plans


def constant_shapes(spec: SignalSpec, config: dict) -> dict[str, tuple[int, ...]]:
    """The shape of each constant a store of ``spec`` holds (float32), for a teacher of BERT-architecture
    ``config`` (config.json): the subspaces' means (d,) and bases (d, r), the embedding tables."""
    d, e = spec.hidden_size, spec.embedding_size
    out: dict[str, tuple[int, ...]] = {}
    for j in spec.hidden_layers if spec.hidden_rank else ():
        mean, basis = subspace_arrays(j)
        out[mean], out[basis] = (d,), (d, spec.hidden_rank)
    if e:
        rows = (int(config["vocab_size"]), int(config["max_position_embeddings"]), int(config["type_vocab_size"]))
        out.update(zip(EMBEDDING_CONSTANTS, [(n, e) for n in rows] + [(e,), (e,)]))
    return out


def float16_row_bytes(spec: SignalSpec) -> int:
    """Uncompressed bytes a row of every array as computed and read (float16 whatever the precision: what a shard
    writer holds before it encodes, :func:`~distillpipe.store.schema.array_layout`)."""
    return sum(a.row_nbytes for a in array_layout(spec, 0, 1))


def estimated_bytes(spec: SignalSpec, lengths: np.ndarray, masked: np.ndarray | None, shard_rows: int) -> float:
    """Estimated bytes on disk of the data files of the rows whose token counts are ``lengths`` (and masked positions
    ``masked``), as ``distillpipe plan`` estimates a store's."""
    return len(lengths) * sum(a.est_row_bytes for a in array_plans(spec, lengths, masked, shard_rows))


def fmt_bytes(n: float | None) -> str:
    """Bytes in decimal units (kB, MB, GB, TB), as disks are sold; ``?`` for unknown."""
    if n is None:
        return "?"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"
