"""The ``qg_finetune`` section: fine-tuning T5 for question generation (WaLDORf sec. 3.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from distillpipe.config.base import ConfigError


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
    checkpoint_minutes: float
    """Wall-clock minutes between resumable checkpoints, written in the background (a kill loses at most this
    much training; 0 = after every step)."""
    samples: int
    """Dev contexts whose generated (greedy) questions are logged and saved beside the model."""
    seed: int

    def __post_init__(self) -> None:
        if (min(self.epochs, self.batch_size) < 1 or not self.checkpoint_minutes >= 0
                or self.lr <= 0 or self.samples < 0):
            raise ConfigError("need epochs, batch_size >= 1, checkpoint_minutes >= 0, lr > 0 and samples >= 0")
        if self.max_source_len < 8 or self.max_target_len < 2:
            raise ConfigError("need max_source_len >= 8 and max_target_len >= 2")
        if not 0 <= self.warmup_fraction < 1:
            raise ConfigError(f"warmup_fraction={self.warmup_fraction} must be in [0, 1)")
        if self.max_train_rows is not None and self.max_train_rows < 1:
            raise ConfigError("max_train_rows must be >= 1 or null")
