"""The ``teacher_finetune`` section: fine-tuning a teacher on each task."""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.config.base import ConfigError


@dataclass(frozen=True)
class TeacherFinetuneTaskConfig:
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_fraction: float
    """Fraction of the steps with linear LR warm-up; then linear decay to 0."""
    max_grad_norm: float
    max_train_rows: int | None
    """Fine-tune on a seeded random subset of this many training rows (null: all rows)."""
    regression_bin_width: float | None
    """Regression tasks (STS-B): labels cast to classes of this width (CMOW paper, after Raffel
    et al.: 0.2); must be null for classification and QA."""
    checkpoint_minutes: float
    """Wall-clock minutes between resumable checkpoints, written in the background (a kill loses at most this
    much training; 0 = after every step). A run shorter than this writes none: the stage saves the
    model at its end."""
    seed: int

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or not self.checkpoint_minutes >= 0:
            raise ConfigError("epochs and batch_size must be >= 1, checkpoint_minutes >= 0")
        if not 0 <= self.warmup_fraction < 1:
            raise ConfigError(f"warmup_fraction={self.warmup_fraction} must be in [0, 1)")
        if self.regression_bin_width is not None and self.regression_bin_width <= 0:
            raise ConfigError("regression_bin_width must be > 0 (or null)")


@dataclass(frozen=True)
class TeacherFinetuneConfig:
    device: str
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    tasks: dict[str, TeacherFinetuneTaskConfig]
