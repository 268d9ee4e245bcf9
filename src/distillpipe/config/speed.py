"""The ``speed`` section: the inference-speed protocol of the ``speed`` stage."""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.config.base import ConfigError
from distillpipe.config.students import Architecture


@dataclass(frozen=True)
class SpeedRunConfig:
    student: Architecture
    """The architecture of the student it reads (``cmow_hybrid``, ``waldorf``, ...; checked against its record):
    the stage depends on that architecture's file only (``src/distillpipe/students/${item.student}.py``)."""
    teacher: str
    """The teacher timed beside the student (``models/teacher/<teacher>``)."""


@dataclass(frozen=True)
class SpeedConfig:
    """Inference speed protocol (CMOW paper Table V: batches of 256 random sequences of length 64, no grad).

    Timing is kept out of ``evaluate``'s metrics so that those are a pure function of the student and the
    data (byte-identical on a re-run); the ``speed`` stage writes ``metrics/speed/<run>.json`` instead."""

    device: str
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    batch_size: int
    seq_len: int
    warmup: int
    """Untimed batches first (allocator, kernel selection, caches)."""
    repeats: int
    """Timed repeats; the median rate is reported."""
    batches_per_repeat: int
    """Batches per timed repeat (on a GPU one batch is mostly launch and sync overhead: time many)."""
    runs: dict[str, SpeedRunConfig]
    """Evaluated students to time (stage ``speed@<run>``). Speed depends on the architecture and its size, not on
    what it learned, so one run per student architecture (and dataset panel of the plot) is enough; runs not listed
    show no speed in the report."""

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.seq_len < 2 or self.warmup < 0 or self.repeats < 1 \
                or self.batches_per_repeat < 1:
            raise ConfigError("speed: need batch_size >= 1, seq_len >= 2, warmup >= 0, repeats >= 1, "
                              "batches_per_repeat >= 1")
