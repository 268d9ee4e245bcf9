"""The ``train`` section: students trained from random initialisation."""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.config.run import LoaderConfig, RunConfig, check_teacher
from distillpipe.config.students import StudentConfig


@dataclass(frozen=True)
class ScratchRunConfig(RunConfig):
    """A student trained from random initialisation (``train``, ``train_aug`` and ``train_lm`` runs)."""

    model: StudentConfig


@dataclass(frozen=True)
class TrainRunConfig(ScratchRunConfig):
    """A student trained from random initialisation: general distillation on a corpus, or a task from scratch."""

    teacher: str
    """Where the run's teacher targets come from: ``data/teacher/<dataset>.zarr``, the dataset's cache (computed
    once, read by every run), or ``models/teacher/<name>``, the teacher folder itself, run on each batch (the
    dataset's ``teacher_cache`` entry says which signals, rows and constants: the same targets as its cache's, up to
    float16 rounding and int8 steps). A path because the stage's DVC deps are this value: a live run depends on the
    teacher folder, not on a store (switch with one ``dvc exp run -S``)."""

    def __post_init__(self) -> None:
        check_teacher(self.teacher, self.dataset)


@dataclass(frozen=True)
class TrainConfig:
    device: str
    loader: LoaderConfig
    runs: dict[str, TrainRunConfig]
