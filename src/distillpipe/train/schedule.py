"""Loss-term, temperature and learning-rate schedules: what the loop asks at each optimizer step.

At step ``step`` (0-based) of ``total_steps`` a :class:`Schedule` gives

* ``weights(step)``: the multiplier of every loss term (the objective multiplies ``loss_weights[base]``
  by it). Term names come from the table of terms (:data:`distillpipe.train.terms.TERMS`): its embedding
  terms (eq. (8): on from step 0); ``<name>/<j>`` of its layer terms for student block j (0-based), e.g.
  ``hidden/0``; its output terms (the final phase);
* ``temperature(step)``: the KD temperature;
* ``lr_factor(step)``: the factor on the peak learning rate;
* ``phase(step)``: a short name for logs.

Every value is a pure function of ``step`` (no state), so a resumed run gets exactly the values an
uninterrupted run would. Steps at or past ``total_steps`` get the end values (LR factor 0, T = 1 when
it decays).

Learning-rate shapes follow the usual linear convention (as ``transformers``'
``get_linear_schedule_with_warmup``): warm-up factor ``step / warmup`` and decay factor
``(end - step) / (end - start)``, which reaches 0 at ``step == total_steps``, one past the last step.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence

from distillpipe.config.base import ConfigError
from distillpipe.config.run import AllAtOnceConfig, ScheduleConfig, SlowBuildConfig
from distillpipe.train.terms import EMBEDDING_TERMS, LAYER_TERMS, OUTPUT_TERMS

log = logging.getLogger(__name__)


def block_terms(j: int) -> tuple[str, ...]:
    """The loss terms of student block j: WaLDORf eqs. (2) and (4), MiniALBERT's attention KL (eq. 7)."""
    return tuple(f"{name}/{j}" for name in LAYER_TERMS)


def all_terms(blocks: Sequence[int]) -> list[str]:
    return [*EMBEDDING_TERMS, *(t for j in blocks for t in block_terms(j)), *OUTPUT_TERMS]


class Weights(dict):
    """Term -> multiplier. Reading a term that was not scheduled (``w["hidden/9"]`` for 4 blocks) raises
    a KeyError naming the known terms, rather than silently counting it as on or off."""

    def __missing__(self, term: str) -> float:
        raise KeyError(
            f"loss term {term!r} is not in the schedule; it knows {sorted(self)} "
            "(was the schedule built for fewer student blocks?)"
        )


class AllOnes(Weights):
    """All-at-once multipliers: 1 for every name, scheduled or not."""

    def __missing__(self, term: str) -> float:
        return 1.0


def _linear_decay(step: int, start: int, end: int) -> float:
    """1 at ``start``, linear to 0 at ``end`` (clamped outside)."""
    if step <= start:
        return 1.0
    return max(0.0, (end - step) / (end - start))


class Schedule(ABC):
    total_steps: int
    blocks: list[int]
    """The student blocks with block losses (aligned in ``objective.layer_map``), in build order."""

    @abstractmethod
    def weights(self, step: int) -> dict[str, float]: ...

    @abstractmethod
    def temperature(self, step: int) -> float: ...

    @abstractmethod
    def lr_factor(self, step: int) -> float: ...

    @abstractmethod
    def phase(self, step: int) -> str: ...

    def _check(self, step: int) -> None:
        if step < 0:
            raise ValueError(f"schedule step must be >= 0, got {step}")


class SlowBuild(Schedule):
    """WaLDORf eqs. (8)-(9): L(tau) = alpha L_e + sum_j chi_j(tau) (beta L_h,j + gamma L_a,j)
    + chi_n(tau) (delta L_d + epsilon L_g), with chi_j(tau) = Theta(tau - (j + 1) tau*).

    The paper (sec. 3.3): "we start with training only using the embedding loss, then combine that loss
    with the hidden state and attention score losses for layer 0, then for layer 1, etc. After each
    intermediate layer is trained for some time, we then add the final softmax layer distillation loss
    and the ground truth loss." Terms are added and never removed: chi_j is a Heaviside step of tau,
    which stays 1 once tau passes (j + 1) tau*, and L_e has no chi at all. We take Theta(0) = 1, so
    stage s (0 = embedding only, s = j + 1 adds block j, s = n_blocks + 1 the output losses) starts at
    step s * tau* and stage 0 is exactly tau* steps long.

    Only blocks that have losses are stages: a student block that ``layer_map`` leaves unaligned (-1)
    has no L_h,j or L_a,j, so a stage for it would train exactly what the stage before trained. The
    k-th aligned block (``blocks[k]``) joins at stage k + 1.
    """

    def __init__(self, cfg: SlowBuildConfig, *, blocks: Sequence[int], total_steps: int,
                 embedding_stage: bool = True):
        self.blocks, self.total_steps = list(blocks), total_steps
        self.n_blocks = len(self.blocks)
        # Without an embedding loss (no embeddings in the teacher cache) stage 0 would train nothing:
        # the build then starts with the first aligned block.
        self.first = 1 if embedding_stage else 0
        stages = self.n_blocks + self.first  # embedding-only (when there is one), then one per aligned block
        if cfg.phase_steps is not None:
            tau = cfg.phase_steps
        else:
            tau = int(cfg.build_fraction * total_steps / stages)
            if tau < 1:
                raise ConfigError(
                    f"schedule slow_build: build_fraction={cfg.build_fraction} of {total_steps} steps "
                    f"leaves less than one step for each of the {stages} build stages; raise "
                    "build_fraction, train longer or set phase_steps"
                )
        self.tau = tau
        self.final_start = stages * tau
        """First step of the final phase (soft + hard losses, LR and temperature decay)."""
        if self.final_start >= total_steps:
            raise ConfigError(
                f"schedule slow_build: {stages} build stages x phase_steps {tau} = {self.final_start} "
                f"steps leave no final phase in a run of {total_steps} steps; lower phase_steps "
                f"(at most {max(0, (total_steps - 1) // stages)}), use build_fraction, or train longer"
            )
        self.warmup = round(cfg.warmup_fraction * total_steps)
        if self.warmup > self.final_start:
            raise ConfigError(
                f"schedule slow_build: warm-up of {self.warmup} steps runs past the build-up "
                f"({self.final_start} steps); lower warmup_fraction"
            )
        self.t0 = cfg.temperature

    def stage(self, step: int) -> int:
        """0 = embedding only, k + 1 = up to the k-th aligned block, n_blocks + 1 = final phase (without
        an embedding stage the count starts at 1)."""
        self._check(step)
        return min(step // self.tau + 1 - self.first, self.n_blocks + 1)

    def weights(self, step: int) -> dict[str, float]:
        s = self.stage(step)
        w = Weights.fromkeys(EMBEDDING_TERMS, 1.0)  # eq. (8): alpha L_e has no chi, on from step 0
        for k, j in enumerate(self.blocks):
            on = float(step >= (k + self.first) * self.tau)  # eq. (9): chi_j(tau) = Theta(tau - (j + 1) tau*)
            for t in block_terms(j):
                w[t] = on
        for t in OUTPUT_TERMS:  # eq. (8): chi_n, the final phase
            w[t] = float(s == self.n_blocks + 1)
        return w

    def _final_progress(self, step: int) -> float:
        """0 at the start of the final phase, 1 at ``total_steps``."""
        return 1.0 - _linear_decay(step, self.final_start, self.total_steps)

    def temperature(self, step: int) -> float:
        self._check(step)
        return self.t0 + (1.0 - self.t0) * self._final_progress(step)

    def lr_factor(self, step: int) -> float:
        self._check(step)
        if step < self.warmup:
            return step / self.warmup
        return _linear_decay(step, self.final_start, self.total_steps)

    def phase(self, step: int) -> str:
        s = self.stage(step)
        if s == 0:
            return "build/embedding"
        if s <= self.n_blocks:
            return f"build/block{self.blocks[s - 1]}"
        return "final"


class AllAtOnce(Schedule):
    """Every term from step 0 (multiplier 1 for any name); linear warm-up then linear decay of the LR;
    temperature T0, or linear from T0 to 1 over the run when ``temperature_decay``."""

    def __init__(self, cfg: AllAtOnceConfig, *, blocks: Sequence[int], total_steps: int):
        self.blocks, self.total_steps = list(blocks), total_steps
        self.warmup = round(cfg.warmup_fraction * total_steps)
        self.t0, self.decay = cfg.temperature, cfg.temperature_decay

    def weights(self, step: int) -> dict[str, float]:
        self._check(step)
        return AllOnes.fromkeys(all_terms(self.blocks), 1.0)

    def temperature(self, step: int) -> float:
        self._check(step)
        if not self.decay:
            return self.t0
        return self.t0 + (1.0 - self.t0) * (1.0 - _linear_decay(step, 0, self.total_steps))

    def lr_factor(self, step: int) -> float:
        self._check(step)
        if step < self.warmup:
            return step / self.warmup
        return _linear_decay(step, self.warmup, self.total_steps)

    def phase(self, step: int) -> str:
        self._check(step)
        return "warmup" if step < self.warmup else "decay"


def build_schedule(cfg: ScheduleConfig, *, blocks: Sequence[int], total_steps: int,
                   embedding_stage: bool = True) -> Schedule:
    """The schedule for a run of ``total_steps`` optimizer steps whose block losses sit on student blocks
    ``blocks`` (the aligned entries of ``objective.layer_map``; terms ``hidden/<j>``, ``attn/<j>``). The
    slow build has one stage per aligned block. ``embedding_stage=False``: the objective has no embedding
    loss, so the slow build skips its stage."""
    blocks = list(blocks)
    if total_steps < 1 or any(j < 0 for j in blocks) or len(set(blocks)) != len(blocks):
        raise ValueError(f"need total_steps >= 1 and distinct block indices >= 0, got {total_steps}, {blocks}")
    if isinstance(cfg, SlowBuildConfig):
        s: Schedule = SlowBuild(cfg, blocks=blocks, total_steps=total_steps, embedding_stage=embedding_stage)
        log.info(
            "slow build: %d stages of %d steps (blocks %s), final phase from step %d of %d",
            len(blocks) + s.first,
            s.tau,
            blocks,
            s.final_start,
            total_steps,
        )
        return s
    if isinstance(cfg, AllAtOnceConfig):
        return AllAtOnce(cfg, blocks=blocks, total_steps=total_steps)
    raise TypeError(f"unknown schedule config {type(cfg).__name__}")
