"""Typed pipeline configuration: one frozen dataclass per ``params.yaml`` section.

``params.yaml`` is the single source of every pipeline parameter: no field here has a default.
:func:`load_section` reads one section and builds its dataclass recursively, failing with the
key path and the file named when a key is unknown, missing or of the wrong type.

Supported field types: ``int``, ``float``, ``str``, ``bool``, ``Literal[...]``, ``X | None``,
``list[X]``, ``dict[str, X]``, nested dataclasses, and unions of dataclasses told apart by
their ``Literal`` tag fields (``source``, ``asset``, ``format``, ``kind``), a tagged union.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import yaml


class ConfigError(ValueError):
    """A params.yaml value is missing, unknown or of the wrong type."""


# --------------------------------------------------------------------------------------------
# prepare: where each dataset comes from
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitFractions:
    dev: float
    """Fraction of the unit of splitting (article, sentence) that goes to ``dev``."""
    test: float
    """Fraction that goes to ``test``; the rest is ``train``."""

    def __post_init__(self) -> None:
        if not (0 <= self.dev < 1 and 0 <= self.test < 1 and self.dev + self.test < 1):
            raise ConfigError(f"split fractions dev={self.dev}, test={self.test} must be >= 0 and sum to < 1")


@dataclass(frozen=True)
class EmbeddedWikiConfig:
    """gensim's bundled English Wikipedia sample as an MLM corpus, split by article."""

    source: Literal["embedded"]
    asset: Literal["wiki"]
    min_paragraph_chars: int
    """Paragraphs shorter than this (after markup removal) are dropped and counted."""
    splits: SplitFractions
    seed: int


@dataclass(frozen=True)
class EmbeddedPolarityConfig:
    """gensim's 200 Pang & Lee polarity sentences (fastText ``__label__`` format)."""

    source: Literal["embedded"]
    asset: Literal["polarity"]
    encoding: str
    """The file is cp1252; another value shows what happens with the wrong one."""
    splits: SplitFractions
    seed: int


@dataclass(frozen=True)
class EmbeddedWikiPairsConfig:
    """Paragraph pairs from the Wikipedia sample: same article or not (balanced), split by article."""

    source: Literal["embedded"]
    asset: Literal["wiki_pairs"]
    min_paragraph_chars: int
    pairs_per_article: int
    """Positive pairs drawn per article; as many negatives are drawn."""
    splits: SplitFractions
    seed: int


@dataclass(frozen=True)
class EmbeddedWikiQAConfig:
    """SQuAD-v2-format cloze QA built from the Wikipedia sample, split by article."""

    source: Literal["embedded"]
    asset: Literal["wiki_qa"]
    min_paragraph_chars: int
    questions_per_paragraph: int
    unanswerable_fraction: float
    """Fraction of questions made unanswerable by pairing them with a paragraph of another article."""
    splits: SplitFractions
    seed: int

    def __post_init__(self) -> None:
        if not 0 <= self.unanswerable_fraction < 1:
            raise ConfigError(f"unanswerable_fraction={self.unanswerable_fraction} must be in [0, 1)")


GlueTask = Literal["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]


@dataclass(frozen=True)
class LocalGlueConfig:
    """A GLUE task from its original TSV files."""

    source: Literal["local"]
    format: Literal["glue"]
    task: GlueTask
    files: dict[str, str]
    """split name -> TSV path (MNLI: e.g. ``dev_matched``, ``dev_mismatched``)."""
    encoding: str
    on_bad_rows: Literal["error", "skip"]


@dataclass(frozen=True)
class LocalSquadConfig:
    """Extractive QA from SQuAD v1.1 / v2.0 JSON files."""

    source: Literal["local"]
    format: Literal["squad"]
    files: dict[str, str]
    encoding: str


@dataclass(frozen=True)
class LocalTextConfig:
    """A plain-text corpus: documents separated by blank lines, or a JSONL corpus with a text field."""

    source: Literal["local"]
    format: Literal["text", "jsonl"]
    files: dict[str, str]
    text_field: str
    """JSONL only: the key holding the document text (ignored for ``text``)."""
    encoding: str
    on_bad_rows: Literal["error", "skip"]


@dataclass(frozen=True)
class HubConfig:
    """A dataset from the Hugging Face hub, e.g. ``glue/sst2``, ``squad_v2``, ``wikimedia/wikipedia``."""

    source: Literal["hub"]
    name: str
    """``glue/<task>``, ``squad``/``squad_v2`` or any corpus with a text column."""
    subset: str | None
    """Hub configuration name (``20231101.en`` for wikipedia); null when there is none."""
    splits: dict[str, str]
    """our split -> hub split (``train: train``, ``dev: validation``)."""
    text_field: str
    """Corpora only: the column holding the text."""


PrepareDatasetConfig = Union[
    EmbeddedWikiConfig,
    EmbeddedPolarityConfig,
    EmbeddedWikiPairsConfig,
    EmbeddedWikiQAConfig,
    LocalGlueConfig,
    LocalSquadConfig,
    LocalTextConfig,
    HubConfig,
]


@dataclass(frozen=True)
class PrepareConfig:
    datasets: dict[str, PrepareDatasetConfig]


# --------------------------------------------------------------------------------------------
# tokenize: how each prepared dataset becomes teacher-tokenized rows
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizeMLMConfig:
    """MLM corpus: pack documents into blocks, then mask each block ``mask_views`` times (static)."""

    kind: Literal["mlm"]
    mask_views: int
    """Seeded masked views per block; the teacher cache holds logits for exactly these masks."""
    mask_prob: float
    """Fraction of (non-special) tokens selected per view (BERT: 0.15)."""
    mask_token_fraction: float
    """Of selected tokens, fraction replaced by [MASK] (BERT: 0.8)."""
    random_token_fraction: float
    """Of selected tokens, fraction replaced by a random token (BERT: 0.1); the rest stay unchanged."""
    seed: int

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ConfigError(f"seed={self.seed} must be >= 0")
        if self.mask_views < 1:
            raise ConfigError(f"mask_views={self.mask_views} must be >= 1")
        if not 0 < self.mask_prob < 1:
            raise ConfigError(f"mask_prob={self.mask_prob} must be in (0, 1)")
        if not (0 <= self.mask_token_fraction and 0 <= self.random_token_fraction
                and self.mask_token_fraction + self.random_token_fraction <= 1):
            raise ConfigError("mask_token_fraction + random_token_fraction must be within [0, 1]")


@dataclass(frozen=True)
class TokenizeClassificationConfig:
    """Single-sentence / sentence-pair tasks: joint BERT encoding and separate A / B encodings."""

    kind: Literal["classification"]


@dataclass(frozen=True)
class TokenizeQAConfig:
    """Extractive QA: question + context windows of ``max_seq_len`` with ``doc_stride`` overlap."""

    kind: Literal["qa"]
    doc_stride: int
    """Tokens of overlap between consecutive context windows."""
    max_query_len: int
    """Questions longer than this are truncated (and counted)."""


TokenizeDatasetConfig = Union[TokenizeMLMConfig, TokenizeClassificationConfig, TokenizeQAConfig]


@dataclass(frozen=True)
class TokenizeConfig:
    tokenizer: str
    """Teacher tokenizer: ``embedded:minilm-l6``, a local directory, or a hub model name."""
    max_seq_len: int
    datasets: dict[str, TokenizeDatasetConfig]

    def __post_init__(self) -> None:
        if self.max_seq_len < 8:
            raise ConfigError(f"tokenize.max_seq_len={self.max_seq_len} is too small (>= 8)")
        for name, ds in self.datasets.items():
            if isinstance(ds, TokenizeQAConfig) and not 0 < ds.doc_stride < self.max_seq_len - ds.max_query_len - 3:
                raise ConfigError(f"tokenize.datasets.{name}.doc_stride must be in "
                                  "(0, max_seq_len - max_query_len - 3): "
                                  "a window must hold the question, 3 special tokens and more context than the stride")


# --------------------------------------------------------------------------------------------
# teacher_import / teacher_finetune: the teachers, as DVC-tracked model folders
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TeacherImportConfig:
    models: dict[str, str]
    """name -> model spec (``embedded:minilm-l6``, a local directory or a hub name); each is saved
    to ``models/teacher/<name>/`` so every machine of a team uses byte-identical teacher weights."""


@dataclass(frozen=True)
class TeacherFinetuneTaskConfig:
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_fraction: float
    """Fraction of the steps with linear LR warm-up; then linear decay to 0."""
    max_grad_norm: float
    max_train_rows: int | None
    """Fine-tune on a seeded random subset of this many training rows (null: all rows)."""
    regression_bin_width: float | None
    """Regression tasks (STS-B): labels cast to classes of this width (CMOW paper, after Raffel
    et al.: 0.2); must be null for classification and QA."""
    checkpoint_every: int
    """Write a resumable checkpoint every this many optimizer steps (and at each epoch end)."""
    seed: int

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.checkpoint_every < 1:
            raise ConfigError("epochs, batch_size and checkpoint_every must be >= 1")
        if not 0 <= self.warmup_fraction < 1:
            raise ConfigError(f"warmup_fraction={self.warmup_fraction} must be in [0, 1)")
        if self.regression_bin_width is not None and self.regression_bin_width <= 0:
            raise ConfigError("regression_bin_width must be > 0 (or null)")


@dataclass(frozen=True)
class TeacherFinetuneConfig:
    device: str
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    tasks: dict[str, TeacherFinetuneTaskConfig]


# --------------------------------------------------------------------------------------------
# teacher_cache: which teacher signals are stored for each dataset
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignalsConfig:
    """What the teacher cache keeps. Never keep what no loss uses: every array costs disk and I/O."""

    logits: bool
    """Task logits (QA: start/end logits). Needs a fine-tuned task teacher."""
    mlm_topk: int
    """Top-k MLM logits (+ full-vocab logsumexp) at the statically masked positions; 0 = off.
    Needs a teacher with an MLM head."""
    hidden_layers: list[int]
    """Encoder layers (1..n_layers; 0 = embedding output) whose outputs are kept, average-pooled
    ``pool`` x along the sequence."""
    attn_layers: list[int]
    """Encoder layers whose pre-softmax attention scores are kept, max-pooled ``pool`` x ``pool``."""
    pool: int
    """Pooling factor p (WaLDORf eqs. 3 and 5: 4); 1 = unpooled (MiniALBERT)."""
    attn_probs: bool
    """Also keep unpooled attention probabilities of ``attn_layers`` (MiniALBERT attention KL): large."""
    embeddings: bool
    """Also keep the embedding-layer output, unpooled (WaLDORf embedding loss): large."""

    def __post_init__(self) -> None:
        if self.pool < 1 or self.mlm_topk < 0:
            raise ConfigError("pool must be >= 1 and mlm_topk >= 0")
        for name, low in (("hidden_layers", 0), ("attn_layers", 1)):
            layers = getattr(self, name)
            if any(j < low for j in layers) or layers != sorted(set(layers)):
                raise ConfigError(f"{name}={layers}: layers are increasing and numbered from {low}")
        if self.attn_probs and not self.attn_layers:
            raise ConfigError("attn_probs needs attn_layers")
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
    signals: SignalsConfig

    def __post_init__(self) -> None:
        if self.signals.logits and self.head not in ("classification", "qa"):
            raise ConfigError(f"signals.logits needs head classification or qa (head is {self.head})")
        if self.signals.mlm_topk and self.head != "mlm":
            raise ConfigError(f"signals.mlm_topk needs head mlm (head is {self.head})")


@dataclass(frozen=True)
class TeacherCacheConfig:
    device: str
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    batch_size: int
    shard_rows: int
    """Rows per shard: the unit of work, of resume and of one writer (DESIGN: ~1,024)."""
    datasets: dict[str, TeacherCacheDatasetConfig]

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.shard_rows < 1:
            raise ConfigError("batch_size and shard_rows must be >= 1")


# --------------------------------------------------------------------------------------------
# students: one config dataclass per architecture (the ``student`` key picks it)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CMOWHybridConfig:
    """Bidirectional CMOW/CBOW-Hybrid matrix-embedding student (CMOW paper, sec. III-B)."""

    student: Literal["cmow_hybrid"]
    variant: Literal["hybrid", "cmow", "cbow"]
    """``cmow``: matrix embeddings only; ``cbow``: vector embeddings only; ``hybrid``: both, concatenated."""
    bidirectional: bool
    """Add a second set of matrices multiplied in reverse order (and CBOW suffix sums per token)."""
    d: int
    """Side of the CMOW matrices: each direction gives a d*d-dimensional encoding (paper: 20 -> 400)."""
    d_vec: int
    """CBOW vector size (paper: 400)."""
    init_std: float
    """CMOW matrices start as I + N(0, init_std^2) (paper: 0.01), so long products stay well-conditioned."""
    dropout: float
    """Dropout on the embeddings and on the aggregated representations (paper: 0.1)."""

    def __post_init__(self) -> None:
        if self.d < 1 or self.d_vec < 1 or self.init_std < 0 or not 0 <= self.dropout < 1:
            raise ConfigError("need d >= 1, d_vec >= 1, init_std >= 0 and dropout in [0, 1)")


@dataclass(frozen=True)
class WaLDORfConfig:
    """WaLDORf conv + transformer QA student (WaLDORf sec. 3.2, Fig. 1; Table 1 gives the paper's sizes).

    Factorised embeddings -> conv_1 + max-pool 2 -> conv_2 + max-pool 2 -> time-distributed expansion to
    ``d_model`` -> ``n_layers`` transformer blocks on sequence/4 -> two (up-sample 2, two convs, skip,
    LayerNorm) stages back to the full length -> start/end logits. Vocabulary and maximum length come from
    the task (the teacher's tokenizer)."""

    student: Literal["waldorf"]
    embedding_size: int
    """Width of the factorised token/position/type embeddings, e' in eq. (1) (Table 1: 96)."""
    conv_channels: list[int]
    """Filters of conv_1 and conv_2, the two down-sampling convolutions (Table 1: [96, 192])."""
    conv_kernel: int
    """Width of every 1D convolution, odd so that 'same' padding keeps the length. The paper does not
    state it; 3 gives 24.4 M parameters for Table 1 (the paper says 24.6 M)."""
    d_model: int
    """Hidden size of the transformer blocks and of the up-sampling convolutions conv_3-6 (Table 1: 480)."""
    n_layers: int
    """Transformer blocks (Table 1: 8); each exposes its hidden states and pre-softmax attention scores."""
    n_heads: int
    """Attention heads (Table 1: 16); the attention-score loss needs as many as the teacher has."""
    d_ff: int
    """Feed-forward size inside each block (Table 1: 1440)."""
    dropout: float
    """Dropout on embeddings, attention probabilities and residual branches (BERT: 0.1)."""
    init_std: float
    """Weights of linear, convolution and embedding layers start as N(0, init_std^2) (BERT: 0.02)."""

    def __post_init__(self) -> None:
        sizes = {"embedding_size": self.embedding_size, "d_model": self.d_model, "n_layers": self.n_layers,
                 "n_heads": self.n_heads, "d_ff": self.d_ff}
        small = [k for k, v in sizes.items() if v < 1]
        if small:
            raise ConfigError(f"waldorf: {small} must be >= 1")
        if self.d_model % self.n_heads:
            raise ConfigError(f"waldorf: d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                              f"(each head gets d_model / n_heads dimensions)")
        if len(self.conv_channels) != 2 or min(self.conv_channels) < 1:
            raise ConfigError(f"waldorf: conv_channels must be two filter counts >= 1 (conv_1, conv_2; "
                              f"Table 1: [96, 192]), got {self.conv_channels}")
        if self.conv_kernel < 1 or self.conv_kernel % 2 == 0:
            raise ConfigError(f"waldorf: conv_kernel={self.conv_kernel} must be odd and >= 1 ('same' padding)")
        if not 0 <= self.dropout < 1 or self.init_std <= 0:
            raise ConfigError(f"waldorf: need dropout in [0, 1) and init_std > 0 (got {self.dropout}, {self.init_std})")


@dataclass(frozen=True)
class SlowBuildConfig:
    """WaLDORf's slow build (sec. 3.3, eqs. (8)-(9)): the embedding loss alone for one stage of tau* steps,
    then block j's hidden and attention losses join at step (j+1) tau* and stay on, then the output losses
    (soft KD and ground truth) join for the final phase, which runs to the end of training.

    Exactly one of ``phase_steps`` and ``build_fraction`` is set: ``phase_steps`` is the paper's tau*;
    ``build_fraction`` sizes the build-up by the run's length (known only in epochs before training), so
    tau* = floor(build_fraction * total_steps / (n_blocks + 1)) and the final phase keeps the rest. The
    learning rate is constant during the build-up (after an optional warm-up) and decays linearly to 0
    over the final phase, while the KD temperature decays linearly from ``temperature`` to 1."""

    kind: Literal["slow_build"]
    phase_steps: int | None
    """tau* of eq. (9): optimizer steps per build stage (null: use build_fraction)."""
    build_fraction: float | None
    """Fraction of all optimizer steps spent on the n_blocks + 1 build stages (null: use phase_steps)."""
    warmup_fraction: float
    """Fraction of all steps with a linear LR warm-up from 0, inside the first build stages (0: none, as in
    the paper)."""
    temperature: float
    """KD temperature T0 at the start of the final phase; it decays linearly to 1 by the end of training."""

    def __post_init__(self) -> None:
        if (self.phase_steps is None) == (self.build_fraction is None):
            raise ConfigError("slow_build: set exactly one of phase_steps (steps per stage) and build_fraction "
                              "(fraction of all steps for the build-up); make the other null")
        if self.phase_steps is not None and self.phase_steps < 1:
            raise ConfigError(f"slow_build: phase_steps={self.phase_steps} must be >= 1")
        if self.build_fraction is not None and not 0 < self.build_fraction < 1:
            raise ConfigError(f"slow_build: build_fraction={self.build_fraction} must be in (0, 1): the final "
                              "phase (soft and hard losses) needs the rest of the steps")
        if not 0 <= self.warmup_fraction < 1 or self.temperature < 1:
            raise ConfigError(f"slow_build: need warmup_fraction in [0, 1) and temperature >= 1 "
                              f"(got {self.warmup_fraction}, {self.temperature})")


@dataclass(frozen=True)
class AllAtOnceConfig:
    """Every loss term on from the first step (CMOW, MiniALBERT; WaLDORf's ablation without slow build):
    linear LR warm-up, then linear decay to 0."""

    kind: Literal["all_at_once"]
    warmup_fraction: float
    """Fraction of all steps with a linear LR warm-up from 0; the LR then decays linearly to 0."""
    temperature: float
    """KD temperature T0."""
    temperature_decay: bool
    """false: T0 throughout; true: T decays linearly from T0 at step 0 to 1 at the end of training."""

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_fraction < 1 or self.temperature < 1:
            raise ConfigError(f"all_at_once: need warmup_fraction in [0, 1) and temperature >= 1 "
                              f"(got {self.warmup_fraction}, {self.temperature})")


ScheduleConfig = SlowBuildConfig | AllAtOnceConfig


@dataclass(frozen=True)
class HeadConfig:
    """The task head put on a student's encoding (CMOW paper, supplement A)."""

    type: Literal["linear", "mlp", "cnn", "bilstm"]
    """``linear`` probe / ``mlp`` on the sequence encoding; ``cnn`` (2D) on the aggregated CMOW
    matrices; ``bilstm`` over the per-token representations."""
    hidden_size: int
    """Hidden units of the MLP and of each BiLSTM direction; ignored by ``linear`` and ``cnn``."""
    dropout: float
    """Dropout inside the head (paper: 0.1 MLP, 0.4 CNN, 0.5 BiLSTM)."""

    def __post_init__(self) -> None:
        if self.hidden_size < 1 or not 0 <= self.dropout < 1:
            raise ConfigError("head: need hidden_size >= 1 and dropout in [0, 1)")


StudentConfig = CMOWHybridConfig | WaLDORfConfig

# Loss terms a run can weight (losses.py has the formulas):
LOSS_TERMS = ("hard", "soft", "mlm_kd", "hidden", "attn", "embedding")


# --------------------------------------------------------------------------------------------
# train / finetune: students trained against the teacher cache
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectiveConfig:
    """What the student learns from: a weighted sum of loss terms (CMOW sec. III-A; WaLDORf eqs. 1-8)."""

    loss_weights: dict[str, float]
    """Weight of each term in LOSS_TERMS (missing = 0): ``hard`` ground truth (task CE, QA span CE or MLM CE at
    the static masks; never on unlabeled rows), ``soft`` teacher logits with temperature (T^2 scaled), ``mlm_kd``
    top-k teacher MLM logits, ``hidden`` hidden states through one shared learned projection, ``attn`` pre-softmax
    attention scores, ``embedding`` the embedding output through a learned projection. CMOW's
    alpha * hard + (1 - alpha) * soft with alpha = 0.5 is ``{hard: 0.5, soft: 0.5}``."""
    hidden_loss: Literal["mse", "cosine"]
    """Distance for ``hidden`` (WaLDORf: mse; MiniALBERT: cosine)."""
    layer_map: list[int]
    """Teacher layer aligned with each student layer, in order (-1 = not aligned). Its length is the number of
    layers the student exposes (CMOW/CBOW-Hybrid: 1, its per-token representations)."""
    schedule: ScheduleConfig
    """How terms, temperature and learning rate evolve over training (WaLDORf eq. (9) slow build, or all at once)."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.loss_weights) - set(LOSS_TERMS))
        if unknown:
            raise ConfigError(f"loss_weights: unknown term(s) {unknown}; known: {list(LOSS_TERMS)}")
        if any(w < 0 for w in self.loss_weights.values()) or not any(self.loss_weights.values()):
            raise ConfigError(f"loss_weights must be >= 0 with at least one > 0, got {self.loss_weights}")
        if any(j < -1 for j in self.layer_map):
            raise ConfigError(f"layer_map entries are teacher layers >= 0 or -1 (not aligned), got {self.layer_map}")


@dataclass(frozen=True)
class OptimConfig:
    """Optimisation of one student run (AdamW; learning-rate shape from the schedule)."""

    epochs: int
    """Passes over the training rows; 0 saves the seeded initialisation (a from-scratch init for finetune runs)."""
    max_steps: int | None
    """Stop after this many optimizer steps in all (null = all epochs): sizes a run to a compute budget."""
    batch_size: int
    lr: float
    """Peak learning rate."""
    weight_decay: float
    max_grad_norm: float
    eval_every: int
    """Evaluate on dev every this many steps (0 = at the end of each epoch)."""
    patience: int | None
    """Early stopping: stop after this many evaluations without a better dev score (null = never);
    the best evaluated weights are the output."""
    checkpoint_every: int
    """Steps between resumable checkpoints (also written at each evaluation)."""
    seed: int

    def __post_init__(self) -> None:
        if self.epochs < 0 or self.batch_size < 1 or self.lr <= 0 or self.checkpoint_every < 1 or self.eval_every < 0:
            raise ConfigError("need epochs >= 0, batch_size >= 1, lr > 0, checkpoint_every >= 1, eval_every >= 0")
        if (self.max_steps is not None and self.max_steps < 1) or (self.patience is not None and self.patience < 1):
            raise ConfigError("max_steps and patience must be >= 1 or null")


@dataclass(frozen=True)
class TrainRunConfig:
    """A student trained from random initialisation: general distillation on a corpus, or a task from scratch."""

    dataset: str
    """Tokens ``data/tokens/<dataset>`` (its train split; dev for evaluation) and teacher cache
    ``data/teacher/<dataset>.zarr``. Rows without ground truth (augmented questions) get teacher losses only."""
    model: StudentConfig
    encoding: Literal["joint", "diffcat"]
    head: HeadConfig | None
    """Classification head (null for MLM corpora and QA)."""
    objective: ObjectiveConfig
    optim: OptimConfig
    note: str
    """One line for the report: what this run is (e.g. which ablation row)."""


@dataclass(frozen=True)
class FinetuneRunConfig:
    """A student initialised from a ``train`` run's encoder (CMOW paper: task-specific distillation after
    general distillation), with a fresh task head."""

    init: str
    """The ``train`` run whose encoder (and model config) this run starts from."""
    dataset: str
    encoding: Literal["joint", "diffcat"]
    head: HeadConfig | None
    objective: ObjectiveConfig
    optim: OptimConfig
    note: str


@dataclass(frozen=True)
class TrainAugRunConfig(TrainRunConfig):
    """A ``train`` run (random initialisation) on ``dataset`` plus unlabeled augmented rows mixed in
    (WaLDORf sec. 3.4): both have their own teacher cache, so nothing is computed twice."""

    augment: str
    """The augmented dataset (augment's output): ``data/tokens/<augment>``, ``data/teacher/<augment>.zarr``.
    Its batches are interleaved with the dataset's, in proportion to their sizes; only teacher losses apply."""


@dataclass(frozen=True)
class TrainAugConfig:
    device: str
    loader: LoaderConfig
    runs: dict[str, TrainAugRunConfig]


@dataclass(frozen=True)
class LoaderConfig:
    """How training rows are read from a teacher cache (store/loader.py)."""

    block_rows: int
    """Rows per read: must divide the store's shard_rows and be a multiple of its inner chunk rows (64 is safe)."""
    buffer_blocks: int
    """Blocks shuffled together in memory."""
    num_workers: int
    """DataLoader worker processes (0 = in the training process)."""


@dataclass(frozen=True)
class TrainConfig:
    device: str
    loader: LoaderConfig
    runs: dict[str, TrainRunConfig]


@dataclass(frozen=True)
class FinetuneConfig:
    device: str
    loader: LoaderConfig
    runs: dict[str, FinetuneRunConfig]


# --------------------------------------------------------------------------------------------
# evaluate / report
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeedConfig:
    """Inference speed protocol (CMOW paper Table V: batches of 256 random sequences of length 64, no grad)."""

    batch_size: int
    seq_len: int
    warmup: int
    """Untimed batches first (allocator, kernel selection, caches)."""
    repeats: int
    """Timed repeats; the median rate is reported."""
    batches_per_repeat: int
    """Batches per timed repeat (on a GPU one batch is mostly launch and sync overhead: time many)."""

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.seq_len < 2 or self.warmup < 0 or self.repeats < 1 \
                or self.batches_per_repeat < 1:
            raise ConfigError("speed: need batch_size >= 1, seq_len >= 2, warmup >= 0, repeats >= 1, "
                              "batches_per_repeat >= 1")


@dataclass(frozen=True)
class EvaluateRunConfig:
    dataset: str
    """The dataset the student was trained on (checked against the student's record)."""
    teacher: str
    """The teacher to compare with: ``models/teacher/<teacher>`` (scored on the same splits, timed in the same run)."""


@dataclass(frozen=True)
class EvaluateConfig:
    device: str
    batch_size: int
    splits: list[str]
    """Splits to score (those the dataset has): dev, and test when it exists."""
    speed: SpeedConfig
    runs: dict[str, EvaluateRunConfig]


@dataclass(frozen=True)
class ReportTableConfig:
    title: str
    caption: str
    runs: list[str]
    paper: dict[str, str] | None
    """The paper's number for each run, shown beside ours (e.g. WaLDORf Table 4 EM)."""
    metric: str | None
    """The metric shown (e.g. ``exact`` for EM); null = each run's primary metric."""


@dataclass(frozen=True)
class ReportConfig:
    tables: list[ReportTableConfig]


# --------------------------------------------------------------------------------------------
# qg_finetune / augment: question generation for unlabeled paragraphs (WaLDORf sec. 3.4)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QgScratchModelConfig:
    """A small T5 built from this config, with a SentencePiece unigram vocabulary that the stage trains
    on the QA train set's contexts and questions (the embedded default: no pretrained seq2seq ships
    in a package)."""

    source: Literal["scratch"]
    vocab_size: int
    """SentencePiece pieces, <pad>/</s>/<unk> included (a soft limit: a corpus too small for it gets fewer)."""
    character_coverage: float
    """Fraction of characters the vocabulary covers; the rarest others map to <unk> (1.0 = all)."""
    d_model: int
    d_kv: int
    """Size of each attention head's keys/values (T5 does not tie it to d_model / n_heads)."""
    d_ff: int
    n_encoder_layers: int
    n_decoder_layers: int
    n_heads: int
    relative_attention_num_buckets: int
    relative_attention_max_distance: int
    feed_forward_proj: Literal["relu", "gated-gelu"]
    """``relu``: T5 v1.0; ``gated-gelu``: T5 v1.1 / Flan-T5."""
    dropout: float

    def __post_init__(self) -> None:
        if self.vocab_size < 16 or min(self.d_model, self.d_kv, self.d_ff, self.n_heads) < 1:
            raise ConfigError("need vocab_size >= 16 and d_model, d_kv, d_ff, n_heads >= 1")
        if self.n_encoder_layers < 1 or self.n_decoder_layers < 1 or not 0 <= self.dropout < 1:
            raise ConfigError("need n_encoder_layers, n_decoder_layers >= 1 and dropout in [0, 1)")
        if not 0 < self.character_coverage <= 1:
            raise ConfigError(f"character_coverage={self.character_coverage} must be in (0, 1]")


@dataclass(frozen=True)
class QgPretrainedModelConfig:
    """Fine-tune a pretrained ``T5ForConditionalGeneration`` and keep its tokenizer (WaLDORf: T5-Large)."""

    source: Literal["pretrained"]
    base: str
    """Model spec: a hub name (``t5-large``, ``google/flan-t5-base``) or a local save_pretrained folder."""


QgModelConfig = Union[QgScratchModelConfig, QgPretrainedModelConfig]


@dataclass(frozen=True)
class QgFinetuneConfig:
    """Fine-tune T5 on (context [+ answer hint] -> question) pairs of a QA set's answerable train rows."""

    device: str
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    model: QgModelConfig
    answer_hint: bool
    """Input ``generate question: <answer> context: <context>`` instead of ``generate question: context:
    <context>``. The augment stage has no answers, so it refuses a model trained with hints."""
    max_source_len: int
    """Source tokens kept; pairs whose answer lies beyond them are dropped (counted): the question is about
    text the model would not see."""
    max_target_len: int
    """Question tokens kept (longer questions are truncated, counted)."""
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_fraction: float
    """Fraction of the steps with linear LR warm-up; then linear decay to 0."""
    max_grad_norm: float
    max_train_rows: int | None
    """Train on a seeded random subset of this many pairs (null: all)."""
    checkpoint_every: int
    """Optimizer steps between resumable checkpoints (also written at each epoch end)."""
    samples: int
    """Dev contexts whose generated (greedy) questions are logged and saved beside the model."""
    seed: int

    def __post_init__(self) -> None:
        if min(self.epochs, self.batch_size, self.checkpoint_every) < 1 or self.lr <= 0 or self.samples < 0:
            raise ConfigError("need epochs, batch_size, checkpoint_every >= 1, lr > 0 and samples >= 0")
        if self.max_source_len < 8 or self.max_target_len < 2:
            raise ConfigError("need max_source_len >= 8 and max_target_len >= 2")
        if not 0 <= self.warmup_fraction < 1:
            raise ConfigError(f"warmup_fraction={self.warmup_fraction} must be in [0, 1)")
        if self.max_train_rows is not None and self.max_train_rows < 1:
            raise ConfigError("max_train_rows must be >= 1 or null")


@dataclass(frozen=True)
class GreedyDecodingConfig:
    """The most likely token at each step: one question per paragraph."""

    kind: Literal["greedy"]


@dataclass(frozen=True)
class BeamDecodingConfig:
    """Beam search; the ``n_per_paragraph`` best beams are kept."""

    kind: Literal["beam"]
    num_beams: int
    length_penalty: float
    """Exponent of the length normalisation of beam scores (> 0 favours longer questions)."""

    def __post_init__(self) -> None:
        if self.num_beams < 2:
            raise ConfigError(f"num_beams={self.num_beams} must be >= 2 (use kind: greedy for 1)")


@dataclass(frozen=True)
class SampleDecodingConfig:
    """Seeded sampling (temperature, top-k, nucleus): diverse questions, reproducible for a seed."""

    kind: Literal["sample"]
    temperature: float
    top_k: int
    """Sample among the k most likely tokens (0 = no limit)."""
    top_p: float
    """Nucleus: sample within the smallest set of tokens of this total probability (1.0 = no limit)."""

    def __post_init__(self) -> None:
        if self.temperature <= 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ConfigError("need temperature > 0, top_k >= 0 and top_p in (0, 1]")


DecodingConfig = Union[GreedyDecodingConfig, BeamDecodingConfig, SampleDecodingConfig]


@dataclass(frozen=True)
class AugmentFiltersConfig:
    """Generated questions that are dropped (each counted under the first filter that drops it)."""

    min_question_words: int
    """Questions with fewer words are dropped (empty ones are counted apart)."""
    drop_context_copies: bool
    """Drop a question that, normalised (lower case, no punctuation), is a verbatim piece of its context:
    a copied sentence rather than a question."""
    dedupe: Literal["global", "paragraph", "off"]
    """Drop a normalised question already kept for any paragraph (``global``) or for the same one."""

    def __post_init__(self) -> None:
        if self.min_question_words < 1:
            raise ConfigError(f"min_question_words={self.min_question_words} must be >= 1")


@dataclass(frozen=True)
class AugmentConfig:
    """Generate questions for unlabeled paragraphs: a QA set without answers that the teacher labels."""

    device: str
    """``auto`` (CUDA when available; generation then runs under bf16 autocast), ``cpu`` or ``cuda[:i]``."""
    static_kv_cache: bool
    """CUDA only: generate with a static KV cache (T5 supports it; transformers then compiles the decoding
    step). The CPU path always uses the default dynamic cache."""
    exclude_article_splits: list[str]
    """Splits of the QA set whose articles (titles = the corpus doc_id) are left out, so no dev/test
    article leaks into training. Paragraphs that are a QA context (any split) are always left out."""
    min_paragraph_chars: int
    max_paragraphs: int | None
    """Use a seeded random sample of this many paragraphs (kept in corpus order); null: all."""
    n_per_paragraph: int
    """Questions generated per paragraph (greedy: 1; beam: <= num_beams)."""
    decoding: DecodingConfig
    max_source_len: int
    """Paragraph tokens the generator reads (longer ones are truncated, counted)."""
    max_new_tokens: int
    no_repeat_ngram_size: int
    """Forbid repeating any n-gram of this size within a question (0 = off)."""
    batch_size: int
    """Paragraphs per generate() call; a chunk's paragraphs are sorted by length first."""
    chunk_paragraphs: int
    """Paragraphs per chunk: the unit of work and of resume."""
    filters: AugmentFiltersConfig
    seed: int

    def __post_init__(self) -> None:
        if min(self.n_per_paragraph, self.max_new_tokens, self.batch_size, self.chunk_paragraphs) < 1:
            raise ConfigError("need n_per_paragraph, max_new_tokens, batch_size, chunk_paragraphs >= 1")
        if self.max_source_len < 8 or self.no_repeat_ngram_size < 0 or self.min_paragraph_chars < 0:
            raise ConfigError("need max_source_len >= 8, no_repeat_ngram_size >= 0, min_paragraph_chars >= 0")
        if self.max_paragraphs is not None and self.max_paragraphs < 1:
            raise ConfigError("max_paragraphs must be >= 1 or null")
        if isinstance(self.decoding, GreedyDecodingConfig) and self.n_per_paragraph != 1:
            raise ConfigError(f"greedy decoding gives one question per paragraph (n_per_paragraph="
                              f"{self.n_per_paragraph}); use kind: beam or sample for more")
        if isinstance(self.decoding, BeamDecodingConfig) and self.n_per_paragraph > self.decoding.num_beams:
            raise ConfigError(f"n_per_paragraph={self.n_per_paragraph} exceeds decoding.num_beams="
                              f"{self.decoding.num_beams}")


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------

SECTIONS: dict[str, type] = {
    "prepare": PrepareConfig,
    "tokenize": TokenizeConfig,
    "teacher_import": TeacherImportConfig,
    "teacher_finetune": TeacherFinetuneConfig,
    "teacher_cache": TeacherCacheConfig,
    "qg_finetune": QgFinetuneConfig,
    "augment": AugmentConfig,
    "train": TrainConfig,
    "finetune": FinetuneConfig,
    "train_aug": TrainAugConfig,
    "evaluate": EvaluateConfig,
    "report": ReportConfig,
}


def load_params(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: params file not found (run from the repository root or pass --params)")
    with path.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return data


def load_section(name: str, path: str | Path = "params.yaml"):
    """Load the ``name`` section of ``path`` into its config dataclass."""
    if name not in SECTIONS:
        raise ConfigError(f"no config section named {name!r}; known: {sorted(SECTIONS)}")
    data = load_params(path)
    if name not in data:
        raise ConfigError(f"{path}: missing section {name!r}")
    return build(SECTIONS[name], data[name], name, path)


def build(tp: Any, value: Any, key: str, path: str | Path = "params.yaml") -> Any:
    """Build a value of type ``tp`` from plain YAML data, checking it strictly."""
    where = f"{path}: {key}"
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, key, path)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args:
            if value is None:
                return None
            rest = tuple(a for a in args if a is not type(None))
            return build(rest[0] if len(rest) == 1 else Union[rest], value, key, path)
        if all(dataclasses.is_dataclass(a) for a in args):
            return build(_pick_variant(args, value, key, path), value, key, path)
        raise TypeError(f"unsupported union {tp}")  # programming error, not a user error
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        (item,) = typing.get_args(tp)
        return [build(item, v, f"{key}[{i}]", path) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        _, item = typing.get_args(tp)
        return {str(k): build(item, v, f"{key}.{k}", path) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp}")


# Keys that tell the variants of a tagged union apart; other Literal fields are ordinary choices.
TAG_KEYS = ("source", "asset", "format", "kind", "student")


def _literal_fields(cls: type) -> dict[str, tuple]:
    hints = typing.get_type_hints(cls)
    return {k: typing.get_args(t) for k, t in hints.items() if k in TAG_KEYS and typing.get_origin(t) is Literal}


def _pick_variant(variants: tuple, value: Any, key: str, path: str | Path) -> type:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping, got {value!r}")
    matches = []
    for cls in variants:
        tags = _literal_fields(cls)
        if all(value.get(k) in allowed for k, allowed in tags.items()):
            matches.append(cls)
    if len(matches) == 1:
        return matches[0]
    if not matches:
        # Name the tag keys, with the values each variant accepts, so the fix is obvious.
        options = [
            ", ".join(f"{k}={'|'.join(map(str, v))}" for k, v in _literal_fields(cls).items())
            for cls in variants
        ]
        got = {k: value.get(k) for cls in variants for k in _literal_fields(cls)}
        raise ConfigError(f"{path}: {key}: {got} matches no known kind; expected one of: {'; '.join(options)}")
    raise TypeError(f"{key}: ambiguous config variants {matches}")


def _build_dataclass(cls: type, value: Any, key: str, path: str | Path) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping for {cls.__name__}, got {value!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ConfigError(f"{path}: {key}: unknown key(s) {unknown}; expected {names}")
    missing = [n for n in names if n not in value]
    if missing:
        raise ConfigError(f"{path}: {key}: missing key(s) {missing}")
    kwargs = {n: build(hints[n], value[n], f"{key}.{n}", path) for n in names}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{path}: {key}: {e}") from None
