"""How generated questions are decoded (``augment.decoding``; ``qg_finetune`` uses greedy for its samples)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from distillpipe.config.base import ConfigError


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
