"""The ``train`` section: students trained from random initialisation."""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.config.run import LoaderConfig, RunConfig
from distillpipe.config.students import StudentConfig


@dataclass(frozen=True)
class TrainRunConfig(RunConfig):
    """A student trained from random initialisation: general distillation on a corpus, or a task from scratch."""

    model: StudentConfig


@dataclass(frozen=True)
class TrainConfig:
    device: str
    loader: LoaderConfig
    runs: dict[str, TrainRunConfig]
