"""The student training loop, shared by every student, dataset and objective (``train``, ``train_aug`` and
``finetune``), on one process or several (torchrun, DDP).

It never branches on which student it trains: the student's forward returns a StudentOutput, the
objective (train/objective.py) turns it and the cached teacher rows into loss terms, the schedule
(train/schedule.py) weights the terms and shapes the learning rate and temperature step by step.

The loop is made of named parts that the benchmarks call too: :func:`~distillpipe.train.build.build_run`
(train/build.py: the student, the objective, the optimizer, the data and the run's identity), :func:`restore`
(resume from a checkpoint),
:func:`train_step`, :func:`evaluate` and :func:`record_evaluation`, :func:`checkpoint` (by the clock, written in the
background: :class:`~distillpipe.checkpoints.Checkpointer`), and
:func:`finish` (the outputs). :func:`train_student` strings them together.

Data parallel: under torchrun every process builds the same run (same seed, same initial weights; DDP
averages the gradients), reads its streams' part of each global batch (:mod:`distillpipe.store.loader`),
and steps in lock step. Rank 0 evaluates (the others wait for its scores), writes checkpoints (with
every rank's RNG state) and the outputs. With the same global batches, N processes give the weights of
one process up to float rounding, as long as the losses are means over rows; dropout masks are drawn per
process, so with dropout the weights differ like those of any two seeds.

Resume: atomic checkpoints (model, objective projections, optimizer, every rank's RNG state, the block
loader's position, the evaluation history, the best weights and whether early stopping fired) every
``checkpoint_minutes`` of wall-clock time and at each evaluation that improves the best dev score, written in the
background while training goes on (rank 0's clock decides for every rank). None at the end: the student is written
right after and the checkpoints cleared. A checkpoint carries the run's identity
(:func:`~distillpipe.train.build.run_identity`): the params, the content digests of the tokens, the teacher
cache(s) and the init student's weights, the code (the training stages' whole import closure), the device type and
the number of processes. A restarted run with the same identity continues exactly where the checkpoint was taken (same
batches, same dropout masks), so N steps straight give the same weights as N/2, kill, resume, N/2;
before it does, it verifies the teacher cache's checksums. Any other identity starts over, naming what
changed.

Outputs: the student (``model.pt`` + ``student.json``; the best-on-dev weights when evaluation is
on) and a dvclive folder (:mod:`distillpipe.tracking`): the summary metrics, the run's params, and the
per-step and per-evaluation curves, written at the end from the logs the checkpoints carry.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distillpipe.checkpoints import Checkpointer, resume_or_restart
from distillpipe.config.run import LoaderConfig, RunConfig
from distillpipe.config.students import StudentConfig
from distillpipe.data.collate import collate
from distillpipe.evaluate.student import evaluate_student
from distillpipe.progress import Progress
from distillpipe.runtime import autocast, rng_state, set_rng_state
from distillpipe.scale.ddp import leave
from distillpipe.store.reader import open_store
from distillpipe.students import save_student
from distillpipe.tracking import train_summary, write_live
from distillpipe.train.build import TrainingRun, build_run
from distillpipe.train.data import Source, teacher_targets

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    name: str
    steps: int
    seconds: float
    best_step: int
    metric: str
    dev: dict[str, float]
    stopped_early: bool

    def one_line(self) -> str:
        score = self.dev.get(self.metric, float("nan"))
        early = ", stopped early" if self.stopped_early else ""
        return (f"student {self.name}: {self.steps} steps in {self.seconds:.1f} s{early}; best dev {self.metric} "
                f"{score:.4f} at step {self.best_step}")


def restore(r: TrainingRun) -> bool:
    """Resume from the newest checkpoint of the same identity (True), or start over, naming what changed."""
    state = resume_or_restart(r.ckpt_dir, r.identity, key="identity", main=r.group.main, barrier=lambda: _barrier(r))
    if state is None:
        return False
    for source in r.sources:  # every byte the resumed run reads must be what the first part read
        if source.store is not None:
            open_store(source.store.root, verify=True)
    r.trainable.load_state_dict(state["model"])
    r.optimizer.load_state_dict(state["optimizer"])
    r.data.load_state_dict(state["loader"])
    set_rng_state(state["rng"][r.group.rank])
    for k in ("step", "best_step", "bad_evals", "stopped_early", "last_eval", "best", "best_state", "steps_log",
              "dev_log"):
        setattr(r, k, state[k])
    log.info("resuming %s at step %d/%d", r.name, r.step, r.total)
    return True


def train_step(r: TrainingRun, source: Source, rows: dict, arrays: dict) -> dict[str, Any]:
    """One optimizer step on this process's part of a global batch; returns the step's log row (the loss
    and its terms averaged over every process's part)."""
    task, opt = r.task, r.run.optim
    batch, targets = collate(rows, kind=task.kind, pad_id=task.pad_id, labeled=source.info.labeled, pairs=r.pairs,
                             bin_width=task.bin_width)
    targets |= teacher_targets(arrays, batch["attention_mask"], source.info.signals.pool)
    batch = {k: v.to(r.device, non_blocking=True) for k, v in batch.items()}
    targets = {k: v.to(r.device, non_blocking=True) for k, v in targets.items()}
    source.complete(batch, targets)
    lr = opt.lr * r.schedule.lr_factor(r.step)
    for g in r.optimizer.param_groups:
        g["lr"] = lr
    with autocast(r.device):
        loss, parts = r.engine(batch, targets, multipliers=r.schedule.weights(r.step),
                               temperature=r.schedule.temperature(r.step), always_loss=r.group.distributed)
    skip = loss is None or not parts  # no term applied to this batch
    if loss is not None:
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{r.name}: loss is {loss.item()} at step {r.step} ({parts}); lower optim.lr "
                                     "or check the teacher cache with `distillpipe inspect --verify`")
        loss.backward()
        if not skip:
            torch.nn.utils.clip_grad_norm_(r.params, opt.max_grad_norm)
            r.optimizer.step()
    r.optimizer.zero_grad(set_to_none=True)
    if skip:
        loss = None
    epoch = r.data.epoch
    r.step += 1
    values = _mean_over_processes(r, [loss.item() if loss is not None else float("nan"),
                                      *(float(v) for v in parts.values())])
    row = {"step": r.step, "epoch": epoch, "lr": lr, "phase": r.schedule.phase(r.step - 1), "loss": values[0],
           **dict(zip(parts, values[1:]))}
    r.steps_log.append(row)
    return row


def evaluate(r: TrainingRun) -> dict[str, float]:
    """Dev scores of the student now: computed by rank 0, the same on every rank."""
    scores = None
    if r.group.main:
        scores = evaluate_student(r.student, r.dev_rows, kind=r.task.kind, pad_id=r.task.pad_id, device=r.device,
                                  batch_size=2 * r.run.optim.batch_size, pairs=r.pairs,
                                  prepared_dir=r.prepared_dir, split="dev", bin_width=r.task.bin_width)
    if r.group.distributed:
        box = [scores]
        dist.broadcast_object_list(box, src=0)
        scores = box[0]
    return scores


def record_evaluation(r: TrainingRun, scores: dict[str, float]) -> bool:
    """Record an evaluation (and the best weights so far); True when early stopping says stop."""
    r.dev_log.append({"step": r.step, **scores})
    r.last_eval = r.step
    log.info("step %d: dev %s", r.step, ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
    if r.best is None or scores[r.metric] > r.best[r.metric]:
        r.best, r.best_step, r.bad_evals = scores, r.step, 0
        if r.group.main:
            r.best_state = {k: v.detach().to("cpu", copy=True) for k, v in r.student.state_dict().items()}
    else:
        r.bad_evals += 1
    patience = r.run.optim.patience
    r.stopped_early = r.stopped_early or (patience is not None and r.bad_evals >= patience)
    return r.stopped_early


def checkpoint_due(r: TrainingRun, checkpoints: Checkpointer) -> bool:
    """Whether a checkpoint is due now: rank 0's clock decides, for every rank (a checkpoint is collective)."""
    due = checkpoints.due()
    if not r.group.distributed:
        return due
    flag = torch.tensor([float(due)], device=r.device if r.device.type == "cuda" else "cpu")
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def checkpoint(r: TrainingRun, checkpoints: Checkpointer) -> None:
    """Rank 0 checkpoints every rank's RNG state with its own state: staged in host memory at once, written in the
    background (:class:`~distillpipe.checkpoints.Checkpointer`); every rank goes on as soon as it is staged."""
    rngs = [rng_state()]
    if r.group.distributed:
        rngs = [None] * r.group.world
        dist.all_gather_object(rngs, rng_state())
    if r.group.main:
        checkpoints.save(r.step, {
            "identity": r.identity, "model": r.trainable.state_dict(), "optimizer": r.optimizer.state_dict(),
            "loader": r.data.state_dict(), "rng": rngs, "step": r.step, "best_step": r.best_step,
            "bad_evals": r.bad_evals, "stopped_early": r.stopped_early, "last_eval": r.last_eval, "best": r.best,
            "best_state": r.best_state, "steps_log": r.steps_log, "dev_log": r.dev_log})


def finish(r: TrainingRun, checkpoints: Checkpointer, *, out_dir: str | Path, live_dir: str | Path,
           init_dir: str | Path | None, seconds: float) -> RunSummary:
    """Rank 0 writes the student (the best evaluated weights) and its dvclive folder; checkpoints go."""
    if r.group.main:
        if r.best_state is not None:
            r.student.load_state_dict(r.best_state)
        counts = [(p.numel(), p.requires_grad) for p in r.student.parameters()]
        record = {"name": r.name, "dataset": r.meta["name"], "kind": r.task.kind, "metric": r.metric, "steps": r.step,
                  "best_step": r.best_step, "dev": r.best, "init": str(init_dir) if init_dir else None,
                  "tokens_fingerprint": r.meta["fingerprint"], "tokenizer_sha256": r.meta["tokenizer"]["sha256"],
                  "note": r.run.note, "trainable_params": sum(n for n, grad in counts if grad),
                  "code": r.identity["code"]}
        save_student(out_dir, r.student, r.model_cfg, r.task, record)
        write_live(live_dir, summary=train_summary(r.metric, r.best, r.best_step), params=dataclasses.asdict(r.run),
                   curves=_curves(r), step=r.step)
        checkpoints.clear()
    return RunSummary(r.name, r.step, seconds, r.best_step, r.metric, r.best or {}, r.stopped_early)


def train_student(name: str, *, model_cfg: StudentConfig, run: RunConfig, loader_cfg: LoaderConfig, device: str,
                  tokens_dir: str | Path, store_path: str | Path, prepared_dir: str | Path | None,
                  out_dir: str | Path, ckpt_dir: str | Path, live_dir: str | Path, init_dir: str | Path | None = None,
                  augment: tuple[str, str | Path, str | Path] | None = None, loader_workers: int = 0,
                  word_vectors: str | Path | None = None) -> RunSummary:
    """Train one student run: build, resume, step, evaluate, checkpoint, write the outputs."""
    t0 = time.time()
    r = build_run(name, model_cfg=model_cfg, run=run, loader_cfg=loader_cfg, device=device, tokens_dir=tokens_dir,
                  store_path=store_path, prepared_dir=prepared_dir, ckpt_dir=ckpt_dir, init_dir=init_dir,
                  augment=augment, loader_workers=loader_workers, word_vectors=word_vectors)
    try:
        restore(r)
        checkpoints = Checkpointer(r.ckpt_dir, r.run.optim.checkpoint_minutes, main=r.group.main)
        opt = r.run.optim
        bar = Progress(total=r.total, initial=r.step, desc=f"train {name}", unit="step", disable=not r.group.main)
        r.trainable.train()
        while r.step < r.total and not r.stopped_early:
            for source, rows, arrays in r.data:
                row = train_step(r, source, rows, arrays)
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.3f}")
                improved = False
                if opt.eval_every and r.step % opt.eval_every == 0:
                    record_evaluation(r, evaluate(r))
                    improved = r.best_step == r.step
                if r.step < r.total and (improved or checkpoint_due(r, checkpoints)):  # none at the end: see above
                    checkpoint(r, checkpoints)
                if r.step >= r.total or r.stopped_early:
                    break
            else:  # the epoch ended
                if not opt.eval_every and r.last_eval != r.step:
                    record_evaluation(r, evaluate(r))
                    if r.best_step == r.step and r.step < r.total:
                        checkpoint(r, checkpoints)
        bar.close()
        if r.last_eval != r.step or r.best is None:
            record_evaluation(r, evaluate(r))
        checkpoints.wait()  # a write still in flight: on disk (or its error raised) before the outputs
        return finish(r, checkpoints, out_dir=out_dir, live_dir=live_dir, init_dir=init_dir,
                      seconds=time.time() - t0)
    finally:
        leave(r.group)


def _mean_over_processes(r: TrainingRun, values: list[float]) -> list[float]:
    if not r.group.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=r.device if r.device.type == "cuda" else "cpu")
    dist.all_reduce(t)
    return (t / r.group.world).tolist()


def _barrier(r: TrainingRun) -> None:
    if r.group.distributed:
        dist.barrier()


def _curves(r: TrainingRun) -> list[tuple[int, dict[str, float]]]:
    """(step, values) for dvclive from the logs: each step's loss, lr, temperature and loss terms (``train/``),
    each evaluation's dev metrics (``dev/``) after that step's training values."""
    rows: list[tuple[int, dict[str, float]]] = []
    for row in r.steps_log:  # "step" counts steps done: the step's schedule values are at step - 1
        values = {"loss": row["loss"], "lr": row["lr"], "temperature": r.schedule.temperature(row["step"] - 1)}
        values |= {k: v for k, v in row.items() if k not in ("step", "epoch", "phase", "loss", "lr")}
        rows.append((row["step"], {f"train/{k}": v for k, v in values.items()}))
    for row in r.dev_log:
        rows.append((row["step"], {f"dev/{k}": v for k, v in row.items() if k != "step"}))
    return sorted(rows, key=lambda sv: sv[0])  # stable: a step's training values before its evaluation
