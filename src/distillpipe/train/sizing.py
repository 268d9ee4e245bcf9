"""Sizing a copied recipe to a new dataset and a time budget (``distillpipe new-task --budget``): this machine's
rates, measured now, and the schedule they allow.

**Rates** are measured here, on the device the stages would use, with the real networks on random token batches
of the new data's mean length: a teacher training step (forward, backward, AdamW) and a teacher forward pass
(``teacher_finetune``'s dev passes, ``teacher_cache``), and a student training step and forward pass. Not
included: data loading, the losses on cached teacher signals (small for logits; WaLDORf's hidden-state and
attention losses add more), other work on the machine. So the times are estimates, good to maybe +-50%.

**Schedules.** A training stage gets its recipe (:mod:`distillpipe.train.recipes`: the papers' schedules, not the
embedded CPU-sized ones) or at most ``budget`` seconds, whichever is less:

* a student run keeps its recipe when it fits; otherwise it gets ``max_steps`` = the steps that fit after
  :data:`EVALS` dev evaluations, ``eval_every`` = max_steps / EVALS (the copied "each epoch" would evaluate once
  or never in a cut run), and ``patience`` the same share of its evaluations as the recipe had (5 of 20
  epochs -> 3 of 10);
* the teacher fine-tuning keeps its recipe (every row) when it fits; otherwise fewer epochs first (down to 1: more
  distinct rows beat repeats), then ``max_train_rows``;
* the teacher cache holds the rows the students read (their steps x batch size), or all, or as many as the
  teacher's forward pass gets through in the budget (the students then repeat them).

**Checkpoints.** Each training stage's ``checkpoint_minutes`` is the copied one (10) unless its checkpoint (the
weights and AdamW state, measured after a step) is so large on this disk (its write bandwidth, measured now) that
checkpoints that often would cost more than 2% of the run: then as many minutes as keep it at 2%
(:func:`size_checkpoints`, :func:`distillpipe.checkpoints.checkpoint_interval`).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from distillpipe.checkpoints import checkpoint_interval, state_bytes
from distillpipe.runtime import adamw
from distillpipe.students import build_student
from distillpipe.students.base import TaskSpec, freeze_for_tuning

__all__ = ["EVALS", "Rates", "measure_student", "measure_teacher", "size_checkpoints", "size_student",
           "size_teacher"]

EVALS = 10
"""Dev evaluations of a run whose schedule was cut to the budget."""
WARMUP, TIMED = 1, 5
"""Untimed and timed batches of each measurement (the median of the timed ones counts: robust to a busy spell)."""


@dataclass(frozen=True)
class Rates:
    """Seconds a training step and a forward pass take on one batch, measured here."""

    batch_size: int
    seq_len: int
    step_s: float
    forward_s: float
    checkpoint_bytes: int = 0
    """The tensors of a checkpoint: the weights and the AdamW state after a step."""

    def forward_rows_per_s(self) -> float:
        return self.batch_size / self.forward_s


def _timed(fn) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(TIMED):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _ids(batch_size: int, seq_len: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(min(1000, vocab_size // 2), vocab_size, (batch_size, seq_len), generator=g).to(device)  # B, L


def measure_teacher(base_dir: str | Path, kind: str, num_labels: int, batch_size: int, seq_len: int,
                    device: torch.device) -> Rates:
    """A training step and a forward pass of the base teacher with a fresh ``kind`` head (classification, qa)."""
    from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the new head's "newly initialized" report
    if kind == "qa":
        model = AutoModelForQuestionAnswering.from_pretrained(base_dir)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=num_labels)
    model.to(device)
    ids = _ids(batch_size, seq_len, model.config.vocab_size, device)
    opt = adamw(model.parameters(), lr=1e-5)

    def step() -> None:
        out = model(input_ids=ids)
        loss = out.logits.float().mean() if kind != "qa" else (out.start_logits.mean() + out.end_logits.mean())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def forward() -> None:
        with torch.inference_mode():
            model(input_ids=ids)

    model.train()
    step_s = _timed(step)
    model.eval()
    checkpoint = state_bytes({"model": model.state_dict(), "optimizer": opt.state_dict()})
    return Rates(batch_size, seq_len, step_s, _timed(forward), checkpoint)


def measure_student(model_cfg, task: TaskSpec, tune: str, batch_size: int, seq_len: int,
                    device: torch.device) -> Rates:
    """A training step (forward, the task's cross-entropy, backward, AdamW) and a forward pass of the student."""
    model = build_student(model_cfg, task)
    freeze_for_tuning(model, tune)
    model.to(device)
    ids = _ids(batch_size, seq_len, task.vocab_size, device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}
    if task.encoding == "diffcat":
        half = max(1, seq_len // 2)
        batch.update(a_input_ids=ids[:, :half], a_attention_mask=mask[:, :half], b_input_ids=ids[:, half:],
                     b_attention_mask=mask[:, half:])
    target = torch.zeros(batch_size, dtype=torch.long, device=device)
    opt = adamw([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def step() -> None:
        out = model(batch)
        if task.kind == "qa":
            loss = F.cross_entropy(out.start_logits, target) + F.cross_entropy(out.end_logits, target)
        else:
            loss = F.cross_entropy(out.logits, target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def forward() -> None:
        with torch.inference_mode():
            model(batch)

    model.train()
    step_s = _timed(step)
    model.eval()
    checkpoint = state_bytes({"model": model.state_dict(), "optimizer": opt.state_dict()})
    return Rates(batch_size, seq_len, step_s, _timed(forward), checkpoint)


@dataclass(frozen=True)
class Sized:
    """A stage's schedule after sizing: the params that changed (empty: the copy fits), the seconds expected, and
    what the copied recipe would have taken."""

    changes: dict
    seconds: float
    copied_seconds: float
    note: str


def size_student(optim: dict, train_rows: int, dev_rows: int, rates: Rates, budget_s: float) -> Sized:
    """The ``optim`` keys of a student run to change so that it fits ``budget_s`` (see the module docstring)."""
    per_epoch = math.ceil(train_rows / optim["batch_size"])
    steps = per_epoch * optim["epochs"]
    if optim["max_steps"] is not None:
        steps = min(steps, optim["max_steps"])
    evals = max(1, math.ceil(steps / optim["eval_every"]) if optim["eval_every"] else optim["epochs"])
    dev_s = dev_rows / rates.forward_rows_per_s()
    copied = steps * rates.step_s + evals * dev_s
    if copied <= budget_s:
        return Sized({}, copied, copied, f"{steps:,} steps, {evals} evaluations")
    fit = int((budget_s - EVALS * dev_s) / rates.step_s)
    if fit < EVALS:
        raise ValueError(f"{budget_s / 60:.1f} min leave no room for {EVALS} steps and {EVALS} dev evaluations "
                         f"({rates.step_s:.2f} s a step, {dev_s:.1f} s a dev pass of {dev_rows:,} rows)")
    changes = {"epochs": max(1, math.ceil(fit / per_epoch)), "max_steps": fit, "eval_every": max(1, fit // EVALS)}
    if optim["patience"] is not None:
        changes["patience"] = max(2, round(optim["patience"] / evals * EVALS))
    changes = {k: v for k, v in changes.items() if v != optim[k]}
    seconds = fit * rates.step_s + EVALS * dev_s
    return Sized(changes, seconds, copied, f"{fit:,} of the recipe's {steps:,} steps ({fit / per_epoch:.2f} epochs of "
                                           f"{per_epoch:,}), {EVALS} evaluations")


def size_teacher(task: dict, train_rows: int, dev_rows: int, rates: Rates, budget_s: float) -> Sized:
    """The ``teacher_finetune.tasks`` keys to change so that fine-tuning fits ``budget_s``: with an ``lr_grid``, once
    at each of its rates and ``lr``, the budget shared equally."""
    n_rates = 1 + len(task.get("lr_grid") or ())
    each = f" at each of {n_rates} learning rates" if n_rates > 1 else ""
    rows = train_rows if task["max_train_rows"] is None else min(train_rows, task["max_train_rows"])
    train_rps = rates.batch_size / rates.step_s
    dev_s = dev_rows / rates.forward_rows_per_s()
    copied = n_rates * task["epochs"] * (rows / train_rps + dev_s)
    budget_s = budget_s / n_rates  # a rate's share
    if copied <= n_rates * budget_s:
        return Sized({}, copied, copied, f"{task['epochs']} epochs of {rows:,} rows{each}")
    for epochs in range(task["epochs"], 0, -1):  # fewer epochs first, then fewer rows
        fit = int((budget_s / epochs - dev_s) * train_rps)
        if fit >= rows or epochs == 1:
            break
    if fit < task["batch_size"]:
        raise ValueError(f"{budget_s / 60:.1f} min leave no room for one teacher batch ({train_rps:.1f} rows/s, "
                         f"{dev_s:.1f} s a dev pass of {dev_rows:,} rows)")
    fit = min(fit, rows)
    changes = {"epochs": epochs, "max_train_rows": None if fit >= train_rows else fit}
    changes = {k: v for k, v in changes.items() if v != task[k]}
    seconds = n_rates * epochs * (fit / train_rps + dev_s)
    return Sized(changes, seconds, copied, f"{epochs} epoch(s) of {fit:,} rows{each} (the recipe: {task['epochs']} "
                                           f"of {rows:,})")


def size_checkpoints(keys: dict, rates: Rates, run_s: float, write_bytes_per_s: float) -> str:
    """Set ``keys["checkpoint_minutes"]`` (a teacher task's keys or a run's ``optim``) so that checkpointing costs at
    most 2% of the run, the copied interval being the least; returns the line that says so."""
    minutes, why = checkpoint_interval(rates.checkpoint_bytes, write_bytes_per_s,
                                       at_least_minutes=keys["checkpoint_minutes"])
    keys["checkpoint_minutes"] = minutes
    steps = max(1, round(60 * minutes / rates.step_s))
    return (f"    checkpoint_minutes {minutes:g}: {why}; one every ~{steps:,} steps, "
            f"{int(run_s // (60 * minutes))} in the run (written in the background)")
