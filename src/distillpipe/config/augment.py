"""The ``augment`` section: questions generated for unlabeled paragraphs (WaLDORf sec. 3.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from distillpipe.config.base import ConfigError
from distillpipe.config.decoding import BeamDecodingConfig, DecodingConfig, GreedyDecodingConfig


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
    cpu_threads: int
    """On CPU, torch's intra-op threads while one chunk is generated, in this process and on every dask
    worker alike: sampling follows the logits' last bits, which other thread counts can change."""
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
        if min(self.n_per_paragraph, self.max_new_tokens, self.batch_size, self.chunk_paragraphs, self.cpu_threads) < 1:
            raise ConfigError("need n_per_paragraph, max_new_tokens, batch_size, chunk_paragraphs, cpu_threads >= 1")
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
