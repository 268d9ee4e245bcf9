"""The ``teacher_finetune`` section: fine-tuning a teacher on each task."""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.config.base import ConfigError


@dataclass(frozen=True)
class TeacherFinetuneTaskConfig:
    epochs: int
    batch_size: int
    lr: float
    lr_grid: list[float] | None
    """More learning rates to fine-tune at besides ``lr``, each from the same base and seed; the one with the best
    dev headline score is kept and the choice recorded (BERT's recipe: ``lr`` 5e-5, ``lr_grid`` [3e-5, 2e-5]).
    null: ``lr`` only. Each rate costs one more fine-tuning."""
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
        rates = [self.lr, *(self.lr_grid or ())]
        if self.lr_grid is not None and (not self.lr_grid or len(set(rates)) != len(rates) or min(rates) <= 0):
            raise ConfigError(f"lr_grid={self.lr_grid}: give other positive rates than lr={self.lr}, each once "
                              "(or null to train at lr only)")
        if self.regression_bin_width is not None and self.regression_bin_width <= 0:
            raise ConfigError("regression_bin_width must be > 0 (or null)")


@dataclass(frozen=True)
class TeacherFinetuneConfig:
    device: str
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    tasks: dict[str, TeacherFinetuneTaskConfig]
