"""What every student run shares (``train``, ``finetune`` and ``train_aug`` runs): objective, schedule,
optimisation and the block loader."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from distillpipe.config.base import ConfigError
from distillpipe.config.students import HeadConfig


@dataclass(frozen=True)
class SlowBuildConfig:
    """WaLDORf's slow build (sec. 3.3, eqs. (8)-(9)): the embedding loss alone for one stage of tau* steps,
    then block j's hidden and attention losses join at step (j+1) tau* and stay on, then the output losses
    (soft KD and ground truth) join for the final phase, which runs to the end of training.

    Exactly one of ``phase_steps`` and ``build_fraction`` is set: ``phase_steps`` is the paper's tau*;
    ``build_fraction`` sizes the build-up by the run's length (known only in epochs before training), so
    tau* = floor(build_fraction * total_steps / (n_blocks + 1)) and the final phase keeps the rest. The
    learning rate is constant during the build-up (after an optional warm-up) and decays linearly to 0
    over the final phase, while the KD temperature decays linearly from ``temperature`` to 1."""

    kind: Literal["slow_build"]
    phase_steps: int | None
    """tau* of eq. (9): optimizer steps per build stage (null: use build_fraction)."""
    build_fraction: float | None
    """Fraction of all optimizer steps spent on the n_blocks + 1 build stages (null: use phase_steps)."""
    warmup_fraction: float
    """Fraction of all steps with a linear LR warm-up from 0, inside the first build stages (0: none, as in
    the paper)."""
    temperature: float
    """KD temperature T0 at the start of the final phase; it decays linearly to 1 by the end of training."""

    def __post_init__(self) -> None:
        if (self.phase_steps is None) == (self.build_fraction is None):
            raise ConfigError("slow_build: set exactly one of phase_steps (steps per stage) and build_fraction "
                              "(fraction of all steps for the build-up); make the other null")
        if self.phase_steps is not None and self.phase_steps < 1:
            raise ConfigError(f"slow_build: phase_steps={self.phase_steps} must be >= 1")
        if self.build_fraction is not None and not 0 < self.build_fraction < 1:
            raise ConfigError(f"slow_build: build_fraction={self.build_fraction} must be in (0, 1): the final "
                              "phase (soft and hard losses) needs the rest of the steps")
        if not 0 <= self.warmup_fraction < 1 or self.temperature < 1:
            raise ConfigError(f"slow_build: need warmup_fraction in [0, 1) and temperature >= 1 "
                              f"(got {self.warmup_fraction}, {self.temperature})")


@dataclass(frozen=True)
class AllAtOnceConfig:
    """Every loss term on from the first step (CMOW, MiniALBERT; WaLDORf's ablation without slow build):
    linear LR warm-up, then linear decay to 0."""

    kind: Literal["all_at_once"]
    warmup_fraction: float
    """Fraction of all steps with a linear LR warm-up from 0; the LR then decays linearly to 0."""
    temperature: float
    """KD temperature T0."""
    temperature_decay: bool
    """false: T0 throughout; true: T decays linearly from T0 at step 0 to 1 at the end of training."""

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_fraction < 1 or self.temperature < 1:
            raise ConfigError(f"all_at_once: need warmup_fraction in [0, 1) and temperature >= 1 "
                              f"(got {self.warmup_fraction}, {self.temperature})")


ScheduleConfig = SlowBuildConfig | AllAtOnceConfig


@dataclass(frozen=True)
class ObjectiveConfig:
    """What the student learns from: a weighted sum of loss terms (CMOW sec. III-A; WaLDORf eqs. 1-8)."""

    loss_weights: dict[str, float]
    """Weight of each loss term by its name (missing = 0). The terms, what each is and what it reads, are the rows
    of the table :data:`distillpipe.train.terms.TERMS` (the config layer sits below it, so a name the table lacks
    is refused when training starts). CMOW's alpha * hard + (1 - alpha) * soft with alpha = 0.5 is
    ``{hard: 0.5, soft: 0.5}``."""
    hidden_loss: Literal["mse", "cosine"]
    """Distance for ``hidden`` (WaLDORf: mse; MiniALBERT: cosine)."""
    layer_map: list[int]
    """Teacher layer aligned with each student layer, in order (-1 = not aligned). Its length is the number of
    layers the student exposes (CMOW/CBOW-Hybrid: 1, its per-token representations)."""
    schedule: ScheduleConfig
    """How terms, temperature and learning rate evolve over training (WaLDORf eq. (9) slow build, or all at once)."""

    def __post_init__(self) -> None:
        if any(w < 0 for w in self.loss_weights.values()) or not any(self.loss_weights.values()):
            raise ConfigError(f"loss_weights must be >= 0 with at least one > 0, got {self.loss_weights}")
        if any(j < -1 for j in self.layer_map):
            raise ConfigError(f"layer_map entries are teacher layers >= 0 or -1 (not aligned), got {self.layer_map}")


@dataclass(frozen=True)
class OptimConfig:
    """Optimisation of one student run (AdamW; learning-rate shape from the schedule)."""

    epochs: int
    """Passes over the training rows; 0 saves the seeded initialisation (a from-scratch init for finetune runs)."""
    max_steps: int | None
    """Stop after this many optimizer steps in all (null = all epochs): sizes a run to a compute budget."""
    batch_size: int
    lr: float
    """Peak learning rate."""
    weight_decay: float
    max_grad_norm: float
    eval_every: int
    """Evaluate on dev every this many steps (0 = at the end of each epoch)."""
    patience: int | None
    """Early stopping: stop after this many evaluations without a better dev score (null = never);
    the best evaluated weights are the output."""
    checkpoint_minutes: float
    """Wall-clock minutes between resumable checkpoints, written in the background (also one at each evaluation
    that improves the best dev score); a kill loses at most this much training. 0 = after every step."""
    seed: int

    def __post_init__(self) -> None:
        if (self.epochs < 0 or self.batch_size < 1 or self.lr <= 0 or not self.checkpoint_minutes >= 0
                or self.eval_every < 0):
            raise ConfigError("need epochs >= 0, batch_size >= 1, lr > 0, checkpoint_minutes >= 0, eval_every >= 0")
        if (self.max_steps is not None and self.max_steps < 1) or (self.patience is not None and self.patience < 1):
            raise ConfigError("max_steps and patience must be >= 1 or null")


@dataclass(frozen=True)
class LoaderConfig:
    """How training rows are read from a teacher cache (store/loader.py). These decide the batches; how many
    processes and DataLoader workers read them is a machine setting (machine.yaml ``students``)."""

    block_rows: int
    """Rows per read: must divide the store's shard_rows and be a multiple of its inner chunk rows (64 is safe)."""
    buffer_blocks: int
    """Blocks shuffled together in memory (a window)."""
    streams: int
    """Windows are dealt to this many streams; a batch is one equal slice from each. Training on N processes
    (torchrun) needs a multiple of N: each process reads only its streams' blocks. 1 = one sequence of
    batches from all windows."""

    def __post_init__(self) -> None:
        if min(self.block_rows, self.buffer_blocks, self.streams) < 1:
            raise ConfigError("loader: need block_rows, buffer_blocks and streams >= 1")


TEACHER_FOLDER = re.compile(r"^models/teacher/[\w.-]+$")


def check_teacher(teacher: str, dataset: str) -> None:
    """A run's ``teacher``: its dataset's cache ``data/teacher/<dataset>.zarr``, or a teacher folder
    ``models/teacher/<name>`` run live on each batch; anything else is refused, naming both forms."""
    if teacher != f"data/teacher/{dataset}.zarr" and not TEACHER_FOLDER.match(teacher):
        raise ConfigError(f"teacher={teacher!r}: the run's teacher targets come from its dataset's cache "
                          f"(data/teacher/{dataset}.zarr) or from a teacher folder run live (models/teacher/<name>, "
                          f"e.g. the one teacher_cache.datasets.{dataset}.teacher names)")


def teacher_is_live(teacher: str) -> bool:
    """Whether a run's ``teacher`` is a teacher folder to run live (not a cache)."""
    return bool(TEACHER_FOLDER.match(teacher))


@dataclass(frozen=True)
class RunConfig:
    """The fields every student run has; ``train``, ``finetune`` and ``train_aug`` runs add theirs."""

    dataset: str
    """Tokens ``data/tokens/<dataset>`` (its train split; dev for evaluation) and teacher cache
    ``data/teacher/<dataset>.zarr``. Rows without ground truth (augmented questions) get teacher losses only."""
    encoding: Literal["joint", "diffcat"]
    """How a sentence pair is encoded: ``joint`` (BERT-like ``[CLS] a [SEP] b [SEP]``) or ``diffcat``
    (CMOW paper: ``[a, |a - b|, b]`` of two separate encodings)."""
    head: HeadConfig | None
    """Classification head (null for MLM corpora and QA)."""
    objective: ObjectiveConfig
    optim: OptimConfig
    note: str
    """One line for the report: what this run is (e.g. which ablation row)."""
