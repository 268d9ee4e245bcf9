"""The ``teacher_cache`` section: which teacher signals are stored for each dataset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from distillpipe.config.base import ConfigError


@dataclass(frozen=True)
class PrecisionConfig:
    """How each quantizable signal is stored (docs/precision.md: formulas, measured fidelity and effect on students).
    Readers and training see float16 either way; a compressed precision halves the bytes on disk and on the network.
    Part of the store's identity (a change rebuilds it); a setting for a signal the cache does not keep is ignored."""

    hidden: Literal["float16", "int8"]
    """Hidden states (or their subspace coordinates): ``int8`` = symmetric int8 with a float16 scale per position."""
    attention: Literal["float16", "int8"]
    """Attention factors (``attn_rank``): int8 with a float16 scale per component of each head; dense pooled scores:
    int8 with a float16 scale per (head, query) row, the ``-inf`` of masked blocks kept exactly. (Dense attention
    probabilities and task logits are always float16.)"""
    mlm_topk: Literal["float16", "uint8"]
    """MLM top-k logits: ``uint8`` = steps of 1/16 nat below the top-1, the top-k probability mass (so the tail mass)
    kept."""


@dataclass(frozen=True)
class SignalsConfig:
    """What the teacher cache keeps: the user's choice. Never keep what no loss uses: every array costs disk and
    I/O. :func:`distillpipe.teacher.cache.signal_spec` turns it, with the teacher's and the tokens' sizes, into
    the store's :class:`distillpipe.store.schema.SignalSpec`, which names the arrays and fixes their shapes."""

    logits: bool
    """Task logits (QA: start/end logits). Needs a fine-tuned task teacher."""
    mlm_topk: int
    """Top-k MLM logits (+ full-vocab logsumexp) at the statically masked positions; 0 = off.
    Needs a teacher with an MLM head."""
    hidden_layers: list[int]
    """Encoder layers (1..n_layers; 0 = embedding output) whose outputs are kept, average-pooled
    ``pool`` x along the sequence."""
    hidden_rank: int | None
    """Keep each hidden layer as its coordinates in the layer's top-r principal subspace, fitted on
    ``hidden_fit_rows`` of the cached rows (r values a position instead of the teacher's width; the loss is computed
    in the subspace); null (or at least the width) = the full states. docs/precision.md has the variance kept and
    the students' loss against the full states at each r."""
    hidden_fit_rows: int
    """Rows, evenly spaced over the cached ones, whose states fit the subspaces (with ``hidden_rank``)."""
    attn_layers: list[int]
    """Encoder layers whose pre-softmax attention scores are kept, max-pooled ``pool`` x ``pool``."""
    attn_rank: int | None
    """Keep each head's attention map (the pooled scores, or with ``attn_probs`` the scores the probabilities are the
    softmax of) as rank-r factors: 2 r values a position instead of a row of the map; null = dense maps."""
    pool: int
    """Pooling factor p (WaLDORf eqs. 3 and 5: 4); 1 = unpooled (MiniALBERT)."""
    attn_probs: bool
    """How ``attn_layers`` are kept: false = pre-softmax scores max-pooled ``pool`` x ``pool`` (the spec's
    ``attn_layers``, the WaLDORf attention MSE); true = unpooled attention probabilities instead (the spec's
    ``attn_probs_layers``, the MiniALBERT attention KL, loss term ``attn_kl``). They cost H x L^2 x 2 bytes a row
    and layer (MiniLM at L 64: 98 KB; BERT-base at L 256: 1.6 MB; BERT-Large at L 384: 4.7 MB): size rows, length
    and layers with care."""
    embeddings: bool
    """Also keep the embedding-layer output, unpooled (WaLDORf embedding loss): derived at training time from the
    teacher's embedding tables, which the store keeps once (no bytes a row); the build checks the derived values
    against the teacher's own on every batch."""
    precision: PrecisionConfig
    """How the hidden states, embeddings, attention scores and MLM top-k are stored (float16 or compressed)."""

    def __post_init__(self) -> None:
        if self.pool < 1 or self.mlm_topk < 0:
            raise ConfigError("pool must be >= 1 and mlm_topk >= 0")
        for name in ("hidden_rank", "attn_rank"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1 or null (dense)")
        if self.hidden_fit_rows < 2:
            raise ConfigError(f"hidden_fit_rows={self.hidden_fit_rows}: a subspace is fitted on at least 2 rows")
        for name, low in (("hidden_layers", 0), ("attn_layers", 1)):
            layers = getattr(self, name)
            if any(j < low for j in layers) or layers != sorted(set(layers)):
                raise ConfigError(f"{name}={layers}: layers are increasing and numbered from {low}")
        if self.attn_probs and not self.attn_layers:
            raise ConfigError("attn_probs: true keeps the attention probabilities of attn_layers, which is empty: "
                              "list the teacher layers the attention KL aligns with (objective.layer_map)")
        if not (self.logits or self.mlm_topk or self.hidden_layers or self.attn_layers or self.embeddings):
            raise ConfigError("no signal selected: the cache would be empty")


@dataclass(frozen=True)
class TeacherCacheDatasetConfig:
    teacher: str
    """Teacher name: the folder ``models/teacher/<teacher>`` (from teacher_import or teacher_finetune)."""
    head: Literal["base", "mlm", "classification", "qa"]
    """Which model head to load: ``base`` for hidden/attention only."""
    split: str
    """The tokens split to cache (students train on it)."""
    max_rows: int | None
    """Cache only this many rows of the split, evenly spaced over it (rows ``round(i * (N - 1) / (max_rows - 1))``;
    the store's ``row_index`` names them, and students train on exactly them); null = every row. Sizes a cache of
    big signals (attention probabilities) to a disk and time budget."""
    signals: SignalsConfig

    def __post_init__(self) -> None:
        if self.signals.logits and self.head not in ("classification", "qa"):
            raise ConfigError(f"signals.logits needs head classification or qa (head is {self.head})")
        if self.signals.mlm_topk and self.head != "mlm":
            raise ConfigError(f"signals.mlm_topk needs head mlm (head is {self.head})")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"max_rows={self.max_rows} must be >= 1 or null (every row)")


@dataclass(frozen=True)
class TeacherCacheConfig:
    device: str
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    batch_size: int
    """Rows per teacher forward. Part of the store's identity: padding and kernel choice follow it."""
    cpu_threads: int
    """On CPU, the intra-op threads of one shard's computation (``torch.set_num_threads``), in this process
    and on every dask worker alike. Part of the store's identity: a CPU matmul split over other thread
    counts can round differently. (How many workers compute shards at once is a machine setting.)"""
    shard_rows: int
    """Rows per shard: the unit of work, of resume and of one writer (DESIGN: ~1,024)."""
    datasets: dict[str, TeacherCacheDatasetConfig]

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.shard_rows < 1 or self.cpu_threads < 1:
            raise ConfigError("batch_size, cpu_threads and shard_rows must be >= 1")
