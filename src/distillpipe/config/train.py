"""The ``train`` section: students trained from random initialisation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from distillpipe.config.base import ConfigError
from distillpipe.config.run import LoaderConfig, RunConfig, check_teacher, teacher_is_live
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

    mlm_views: Literal["static", "fresh"]
    """MLM rows: ``static``, the K masked views per block the tokenize stage drew (``mask_views``), the same every
    epoch; ``fresh``, every block masked anew each epoch (epoch 0: the static views), with the teacher live scoring
    the masks the student sees (Beyer et al. 2022: a patient, consistent teacher). ``fresh`` needs ``teacher`` to be a
    teacher folder: a cache holds the teacher's outputs at the static masks only."""

    def __post_init__(self) -> None:
        check_teacher(self.teacher, self.dataset)
        if self.mlm_views == "fresh" and not teacher_is_live(self.teacher):
            raise ConfigError(f"mlm_views=fresh needs the teacher live: a cache ({self.teacher}) holds the teacher's "
                              "outputs at the static masks only; set teacher to the teacher folder "
                              "(models/teacher/<name>) or mlm_views to static")


@dataclass(frozen=True)
class TrainConfig:
    device: str
    loader: LoaderConfig
    runs: dict[str, TrainRunConfig]
