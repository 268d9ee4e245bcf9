"""Student architectures and task heads: one config dataclass per student (the ``student`` key picks it).

Read by every stage that builds or loads a student (train, finetune, train_aug, evaluate, speed)."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from distillpipe.config.base import ConfigError

EmbeddingInit = Literal["random", "teacher"]
"""How a student's token-embedding table starts (``train/embedding_init.py``)."""


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
    embedding_init: EmbeddingInit
    """How the CBOW table starts: ``random``, N(0, init_std^2) as the paper's, or ``teacher``, the teacher's
    word-embedding table projected on its top d_vec principal directions, at the teacher's scale (the CMOW matrices
    stay I + noise). ``teacher`` needs the teacher's tables: ``embeddings: true`` in the run's cache
    signals, or a live teacher (``train/embedding_init.py``)."""
    dropout: float
    """Dropout on the embeddings and on the aggregated representations (paper: 0.1)."""

    def __post_init__(self) -> None:
        if self.d < 1 or self.d_vec < 1 or self.init_std < 0 or not 0 <= self.dropout < 1:
            raise ConfigError("need d >= 1, d_vec >= 1, init_std >= 0 and dropout in [0, 1)")
        if self.embedding_init == "teacher" and self.variant == "cmow":
            raise ConfigError("embedding_init: teacher initialises the CBOW table, which variant cmow has none of; "
                              "use variant hybrid or cbow, or embedding_init: random")


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
    embedding_init: EmbeddingInit
    """How the token embedding starts: ``random``, N(0, init_std^2), or ``teacher``, the teacher's word-embedding
    table projected on its top embedding_size principal directions, at the teacher's scale. ``teacher``
    needs the teacher's tables: ``embeddings: true`` in the run's cache signals, or a live teacher
    (``train/embedding_init.py``)."""

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
class MiniALBERTConfig:
    """MiniALBERT recursive student (Nouriborji et al. 2022, sec. 3.2-3.4, Fig. 2; Table 1 gives the paper's sizes).

    Factorised embeddings (vocab x ``embedding_size``, then a projection to ``d_model``, eq. 5) -> ONE BERT
    (post-LN) transformer layer applied ``n_iterations`` times (eq. 2), optionally with per-iteration bottleneck
    adapters before the attention and before the MLP (eqs. 3-4). Every iteration exposes its output and its
    pre-softmax attention scores, so each can be aligned with a teacher layer (eq. 11's g(l))."""

    student: Literal["minialbert"]
    embedding_size: int
    """Rank r of the factorised embedding matrix (paper: 128, 312, or 768 = d_model for no factorisation, in which
    case no projection is built)."""
    d_model: int
    """Hidden size H of the shared layer (paper: 768, the BERT-base teacher's width)."""
    n_heads: int
    """Attention heads; the attention KL (eq. 7) needs as many as the teacher has (BERT-base: 12)."""
    d_ff: int
    """Feed-forward size inside the shared layer (paper: 3072)."""
    n_iterations: int
    """Times the one layer is applied (the paper's L in eq. 11: 6 for a 12-layer teacher)."""
    adapter_size: int
    """Bottleneck width of each adapter (paper: d_model / 16 = 48); 0 = no adapters (Table 1's rows without)."""
    max_position_embeddings: int
    """Rows of the position embedding: the longest input the student reads. Explicit (not the tokens' length) so
    that a student general-distilled on short blocks can be fine-tuned on longer pairs; longer inputs are refused."""
    dropout: float
    """Dropout on embeddings, attention probabilities and residual branches (BERT/ALBERT: 0.1)."""
    init_std: float
    """Weights of linear and embedding layers start as N(0, init_std^2) (BERT: 0.02)."""
    embedding_init: EmbeddingInit
    """How the factorised token embedding (rank embedding_size) starts: ``random``, N(0, init_std^2), or
    ``teacher``, the teacher's word-embedding table projected on its top embedding_size principal directions, at the
    teacher's scale (the paper starts its rank-312 students from TinyBERT's table). ``teacher`` needs the
    teacher's tables: ``embeddings: true`` in the run's cache signals, or a live teacher
    (``train/embedding_init.py``)."""

    def __post_init__(self) -> None:
        sizes = {"embedding_size": self.embedding_size, "d_model": self.d_model, "n_heads": self.n_heads,
                 "d_ff": self.d_ff, "n_iterations": self.n_iterations,
                 "max_position_embeddings": self.max_position_embeddings}
        small = [k for k, v in sizes.items() if v < 1]
        if small:
            raise ConfigError(f"minialbert: {small} must be >= 1")
        if self.d_model % self.n_heads:
            raise ConfigError(f"minialbert: d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                              f"(each head gets d_model / n_heads dimensions)")
        if self.adapter_size < 0:
            raise ConfigError(f"minialbert: adapter_size={self.adapter_size} must be >= 0 (0 = no adapters)")
        if not 0 <= self.dropout < 1 or self.init_std <= 0:
            raise ConfigError(f"minialbert: need dropout in [0, 1) and init_std > 0 (got {self.dropout}, "
                              f"{self.init_std})")


@dataclass(frozen=True)
class ElmoConfig:
    """ELMo-C and its baselines (ELMo-C paper sec. 4.1, Table 1): a frozen word-vector table as the input layer,
    forward and backward LSTM language models with projection and LayerNorm after each layer's projection,
    and one output layer shared by both directions; ``output`` is the only difference between the three."""

    student: Literal["elmo"]
    d_input: int
    """Size of the word vectors of the input table (word_vectors' ``dim``; 300 for FastText_CC); checked when
    the table is copied into the student."""
    output: Literal["continuous", "adaptive", "subword"]
    """``continuous`` (ELMo-C): a linear projection to the word-vector size, trained with the cosine distance to
    the target's fixed vector (eq. 2); ``adaptive`` (ELMo-A): ``nn.AdaptiveLogSoftmaxWithLoss`` over the
    vocabulary; ``subword`` (ELMo-Sub): a full softmax over the (teacher tokenizer's subword) vocabulary."""
    d_hidden: int
    """LSTM cell size of each layer and direction (paper/ELMo: 4096)."""
    d_proj: int
    """Projection of each LSTM layer's output (paper/ELMo: 512): the width of every exposed layer and direction."""
    n_layers: int
    """LSTM layers per direction (paper/ELMo: 2)."""
    adaptive_cutoffs: list[int]
    """ELMo-A cluster boundaries over the vocabulary ids, increasing, each < the vocabulary size (used only by
    ``adaptive``; ids are the tokenizer's, so the head cluster holds its first ids)."""
    adaptive_div_value: float
    """ELMo-A: each tail cluster's projection is ``div_value`` times narrower than the previous one (Grave: 4)."""
    dropout: float
    """Dropout on the inputs and on each layer's output (ELMo: 0.1)."""
    init_std: float
    """The continuous and subword output layers start as N(0, init_std^2). LSTMs and the adaptive softmax keep
    PyTorch's initialisation (its tail clusters are two stacked projections: both at N(0, 0.02^2) they start
    near zero and learn slowly)."""

    def __post_init__(self) -> None:
        if min(self.d_input, self.d_hidden, self.d_proj, self.n_layers) < 1:
            raise ConfigError("elmo: d_input, d_hidden, d_proj and n_layers must be >= 1")
        if self.d_proj >= self.d_hidden:
            raise ConfigError(f"elmo: d_proj={self.d_proj} must be < d_hidden={self.d_hidden} (an LSTM projection "
                              "shrinks the cell output; torch's proj_size requires it)")
        c = self.adaptive_cutoffs
        if self.output == "adaptive" and (not c or c != sorted(set(c)) or c[0] < 1):
            raise ConfigError(f"elmo: adaptive_cutoffs must be increasing ids >= 1, got {c}")
        if self.adaptive_div_value < 1 or not 0 <= self.dropout < 1 or self.init_std <= 0:
            raise ConfigError("elmo: need adaptive_div_value >= 1, dropout in [0, 1) and init_std > 0")


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


StudentConfig = CMOWHybridConfig | WaLDORfConfig | MiniALBERTConfig | ElmoConfig

ARCHITECTURES: tuple[str, ...] = tuple(typing.get_args(typing.get_type_hints(c)["student"])[0]
                                       for c in typing.get_args(StudentConfig))
"""The ``student`` keys, one per architecture (each is also its module: ``students/<key>.py``)."""
Architecture = Literal[ARCHITECTURES]  # type: ignore[valid-type]
"""A ``student`` key: how finetune, evaluate and speed runs name the architecture of the student they read (checked
against its record), so that their DVC deps can hold that architecture's file only."""
