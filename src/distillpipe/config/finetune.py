"""The ``finetune`` section: students initialised from a ``train`` run's encoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from distillpipe.config.run import LoaderConfig, RunConfig, check_teacher
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
    teacher: str
    """Where the run's teacher targets come from: ``data/teacher/<dataset>.zarr``, the dataset's cache (computed
    once, read by every run), or ``models/teacher/<name>``, the teacher folder itself, run on each batch (the
    dataset's ``teacher_cache`` entry says which signals, rows and constants: the same targets as its cache's, up to
    float16 rounding and int8 steps). A path because the stage's DVC deps are this value: a live run depends on the
    teacher folder, not on a store (switch with one ``dvc exp run -S``)."""

    def __post_init__(self) -> None:
        check_teacher(self.teacher, self.dataset)


@dataclass(frozen=True)
class FinetuneConfig:
    device: str
    loader: LoaderConfig
    runs: dict[str, FinetuneRunConfig]
