"""The ``finetune`` section: students initialised from a ``train`` run's encoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from distillpipe.config.run import LoaderConfig, RunConfig
from distillpipe.config.students import Architecture


@dataclass(frozen=True)
class FinetuneRunConfig(RunConfig):
    """A student initialised from a ``train`` run's encoder (CMOW paper: task-specific distillation after
    general distillation), with a fresh task head."""

    init: str
    """The ``train`` run whose encoder (and model config) this run starts from."""
    student: Architecture
    """The architecture of ``init`` (checked against its record): the stage depends on that architecture's file
    only (``src/distillpipe/students/${item.student}.py``)."""
    tune: Literal["full", "adapters", "head"]
    """Which parameters train: ``full`` fine-tuning (everything); ``adapters``: only the student's adapters and
    the task head (MiniALBERT adapter tuning, sec. 3.3); ``head``: only the task head, the encoder is a frozen
    feature extractor (ELMo-style downstream use). Frozen parameters get no gradient and no optimizer state."""


@dataclass(frozen=True)
class FinetuneConfig:
    device: str
    loader: LoaderConfig
    runs: dict[str, FinetuneRunConfig]
