"""The ``tokenize`` section: how each prepared dataset becomes teacher-tokenized rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from distillpipe.config.base import ConfigError


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
    max_seq_len: int | None
    """Tokens per row for this dataset; null = ``tokenize.max_seq_len`` (the global length)."""
    max_eval_blocks: int | None
    """Keep this many blocks of the dev and of the test split, evenly spaced over each (a block keeps its id, so
    its masks are those of the whole split); null = all. An MLM corpus's dev split only follows training (every
    evaluation scores all of it, and at Wikipedia's scale a 1% split is a million blocks); the train split is
    never cut. The kept splits are held in memory while tokenizing (4 B a token)."""

    def __post_init__(self) -> None:
        if self.max_eval_blocks is not None and self.max_eval_blocks < 1:
            raise ConfigError(f"max_eval_blocks={self.max_eval_blocks} must be >= 1 or null")
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
    max_seq_len: int | None
    """Tokens per row for this dataset; null = ``tokenize.max_seq_len`` (the global length)."""


@dataclass(frozen=True)
class TokenizeQAConfig:
    """Extractive QA: question + context windows of ``max_seq_len`` with ``doc_stride`` overlap."""

    kind: Literal["qa"]
    doc_stride: int
    """Tokens of overlap between consecutive context windows."""
    max_query_len: int
    """Questions longer than this are truncated (and counted)."""
    max_seq_len: int | None
    """Tokens per row for this dataset; null = ``tokenize.max_seq_len`` (the global length)."""


TokenizeDatasetConfig = Union[TokenizeMLMConfig, TokenizeClassificationConfig, TokenizeQAConfig]


@dataclass(frozen=True)
class TokenizeConfig:
    tokenizer: str
    """Teacher tokenizer: ``embedded:minilm-l6``, a local directory, or a hub model name."""
    max_seq_len: int
    """Tokens per row of every dataset whose own ``max_seq_len`` is null."""
    datasets: dict[str, TokenizeDatasetConfig]

    def seq_len(self, name: str) -> int:
        """The row length of dataset ``name``: its own ``max_seq_len``, else the global one."""
        own = self.datasets[name].max_seq_len
        return self.max_seq_len if own is None else own

    def __post_init__(self) -> None:
        if self.max_seq_len < 8:
            raise ConfigError(f"tokenize.max_seq_len={self.max_seq_len} is too small (>= 8)")
        for name, ds in self.datasets.items():
            if ds.max_seq_len is not None and ds.max_seq_len < 8:
                raise ConfigError(f"tokenize.datasets.{name}.max_seq_len={ds.max_seq_len} is too small (>= 8; "
                                  "null = the global tokenize.max_seq_len)")
            if isinstance(ds, TokenizeQAConfig) and not 0 < ds.doc_stride < self.seq_len(name) - ds.max_query_len - 3:
                raise ConfigError(f"tokenize.datasets.{name}.doc_stride must be in "
                                  "(0, max_seq_len - max_query_len - 3): "
                                  "a window must hold the question, 3 special tokens and more context than the stride")
