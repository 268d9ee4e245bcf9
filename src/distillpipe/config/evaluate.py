"""The ``evaluate`` section: scoring students beside their teachers."""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.config.students import Architecture


@dataclass(frozen=True)
class EvaluateRunConfig:
    student: Architecture
    """The architecture of the student it reads (``cmow_hybrid``, ``waldorf``, ...; checked against its record):
    the stage depends on that architecture's file only (``src/distillpipe/students/${item.student}.py``)."""
    dataset: str
    """The dataset the student was trained on (checked against the student's record)."""
    teacher: str
    """The teacher to compare with: ``models/teacher/<teacher>`` (scored on the same splits; the ``speed`` stage
    times both)."""


@dataclass(frozen=True)
class EvaluateConfig:
    device: str
    batch_size: int
    splits: list[str]
    """Splits to score (those the dataset has): dev, and test when it exists."""
    runs: dict[str, EvaluateRunConfig]
