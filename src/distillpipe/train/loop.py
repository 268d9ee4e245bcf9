"""The student training loop, shared by every student, dataset and objective (``train``, ``train_aug`` and
``finetune``), on one process or several (torchrun, DDP).

It never branches on which student it trains: the student's forward returns a StudentOutput, the
objective (train/objective.py) turns it and the cached teacher rows into loss terms, the schedule
(train/schedule.py) weights the terms and shapes the learning rate and temperature step by step.

The loop is made of named parts that the benchmarks call too: :func:`build_run` (the student, the
objective, the optimizer, the data and the run's identity), :func:`restore` (resume from a checkpoint),
:func:`train_step`, :func:`evaluate` and :func:`record_evaluation`, :func:`checkpoint`, and
:func:`finish` (the outputs). :func:`train_student` strings them together.

Data parallel: under torchrun every process builds the same run (same seed, same initial weights; DDP
averages the gradients), reads its streams' part of each global batch (:mod:`distillpipe.store.loader`),
and steps in lock step. Rank 0 evaluates (the others wait for its scores), writes checkpoints (with
every rank's RNG state) and the outputs. With the same global batches, N processes give the weights of
one process up to float rounding, as long as the losses are means over rows; dropout masks are drawn per
process, so with dropout the weights differ like those of any two seeds.

Resume: atomic checkpoints (model, objective projections, optimizer, every rank's RNG state, the block
loader's position, the evaluation history, the best weights and whether early stopping fired) every
``checkpoint_every`` steps and at each evaluation. A checkpoint carries the run's identity
(:func:`run_identity`): the params, the content digests of the tokens, the teacher cache(s) and the init
student's weights, the code (the import closure of this module), the device type and the number of
processes. A restarted run with the same identity continues exactly where the checkpoint was taken (same
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from distillpipe.config.finetune import FinetuneRunConfig
from distillpipe.config.run import LoaderConfig, RunConfig
from distillpipe.config.students import StudentConfig
from distillpipe.data.schema import read_meta
from distillpipe.data.word_vectors import load_table
from distillpipe.evaluate.student import evaluate_student, primary_metric
from distillpipe.identity import code_digests, json_sha256, sha256_dir
from distillpipe.progress import Progress
from distillpipe.runtime import adamw, autocast, rng_state, seed_everything, set_rng_state
from distillpipe.scale.ddp import ProcessGroup, join, leave
from distillpipe.store.reader import open_store
from distillpipe.students import build_student, load_student, save_student
from distillpipe.students.base import INPUT_VECTORS, TaskSpec, freeze_for_tuning, set_input_vectors
from distillpipe.tracking import train_summary, write_live
from distillpipe.train.checkpoint import clear_checkpoints, load_latest, save_checkpoint
from distillpipe.train.data import Mixture, Source, TrainDataError, collate
from distillpipe.train.objective import Objective, aligned_blocks, probe_student, store_names
from distillpipe.train.schedule import Schedule, build_schedule

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


def task_spec(meta: dict, run: RunConfig, signals, teacher_config: dict) -> TaskSpec:
    """The student's task from the tokens' meta.json, the run's params and the teacher cache (its signal spec and
    its teacher's model config: a regression task is cast to the bins the teacher was fine-tuned on)."""
    kind = meta["kind"]
    bin_width = None
    if kind == "classification":
        if meta.get("task_type") == "regression":
            # CMOW paper sec. IV-A (after Raffel et al.): STS-B as classification over 0.2-wide bins, the teacher's
            bin_width = (teacher_config.get("distillpipe") or {}).get("regression_bin_width")
            if not bin_width:
                raise TrainDataError(f"{meta['name']} is a regression task, but the teacher of its cache was not "
                                     "fine-tuned on bins (its config has no distillpipe.regression_bin_width): "
                                     "fine-tune it with teacher_finetune and regression_bin_width set")
            if not signals.n_classes:
                raise TrainDataError(f"{meta['name']} is a regression task: its teacher cache must hold the logits "
                                     "over the bins (teacher_cache signals.logits: true)")
            num_labels = signals.n_classes
        else:
            names = meta.get("label_names")
            num_labels = len(names) if names else int(meta.get("num_labels") or 0)
        if signals.n_classes and signals.n_classes != num_labels:
            raise TrainDataError(f"the teacher cache has {signals.n_classes} classes, the tokens {num_labels}")
    else:
        num_labels = 0
    if (kind == "classification") != (run.head is not None):
        raise TrainDataError(f"head must be set for classification datasets and null otherwise ({meta['name']} is "
                             f"{kind})")
    tok = meta["tokenizer"]
    return TaskSpec(kind=kind, vocab_size=int(tok["vocab_size"]), max_seq_len=int(meta["max_seq_len"]),
                    pad_id=int(tok["pad_id"]), num_labels=num_labels, encoding=run.encoding, head=run.head,
                    bin_width=float(bin_width) if bin_width else None)


def _init_from(model: torch.nn.Module, init_dir: Path) -> None:
    """Copy the encoder of a trained student into ``model`` (heads stay freshly initialised); refuse any other
    difference, naming it."""
    source, record = load_student(init_dir, torch.device("cpu"))
    src = {k: v for k, v in source.state_dict().items() if not k.startswith(("head.", "mlm_head."))}
    dst = {k: v for k, v in model.state_dict().items() if not k.startswith(("head.", "mlm_head."))}
    if src.keys() != dst.keys():
        raise TrainDataError(f"cannot initialise from {init_dir}: encoder parameters differ "
                             f"(only there: {sorted(src.keys() - dst.keys())[:5]}, only here: "
                             f"{sorted(dst.keys() - src.keys())[:5]})")
    bad = [k for k in src if src[k].shape != dst[k].shape]
    if bad:
        raise TrainDataError(f"cannot initialise from {init_dir}: shapes differ for {bad[:5]}")
    model.load_state_dict(src, strict=False)
    log.info("initialised the encoder from %s (%s)", init_dir, record["name"])


def param_groups(modules: list[torch.nn.Module], weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on biases, norms and embedding tables (1-D tensors and nn.Embedding weights)."""
    decay, no_decay = [], []
    for m in modules:
        emb = {id(e.weight) for e in m.modules() if isinstance(e, torch.nn.Embedding)}
        for p in m.parameters():
            if not p.requires_grad:  # frozen by the run's `tune`: no gradient, no optimizer state
                continue
            (no_decay if p.ndim < 2 or id(p) in emb else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


CODE_MODULES = ("distillpipe.train.loop",)
"""The training code: its import closure (students, losses, objective, schedule, data, evaluation) is part
of a checkpoint's identity, so a run never continues with code other than the code it started with."""


def run_identity(*, run: RunConfig, model_cfg: StudentConfig, loader_cfg: LoaderConfig, tokens_meta: dict,
                 stores: dict[str, Any], init_dir: str | Path | None, augment: tuple | None,
                 device: torch.device, processes: int, word_vectors: str | None = None) -> dict[str, Any]:
    """Everything that decides a run's weights, as digests: what a checkpoint must match to be resumed."""
    return {
        "params": json_sha256({"run": dataclasses.asdict(run), "model": dataclasses.asdict(model_cfg),
                               "loader": dataclasses.asdict(loader_cfg)}),
        "tokens": tokens_meta["fingerprint"],
        "teacher cache": {k: s.content_sha256() for k, s in stores.items()},
        "augment tokens": read_meta(augment[1])["fingerprint"] if augment else None,
        "init weights": sha256_dir(init_dir) if init_dir is not None else None,
        "word vectors": word_vectors,
        "code": json_sha256(code_digests(CODE_MODULES)),
        "device": device.type,
        "processes": processes,
    }


def identity_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Names of the identity fields that differ (all of them for a checkpoint without an identity)."""
    if not isinstance(old, dict):
        return ["identity (a checkpoint of an older version)"]
    return [k for k in new if old.get(k) != new[k]]


class Trainable(torch.nn.Module):
    """The student and the objective's learned projections as one module: what DDP wraps and the optimizer
    updates. ``forward`` returns (loss or None, the loss terms)."""

    def __init__(self, student: torch.nn.Module, objective: Objective):
        super().__init__()
        self.student, self.objective = student, objective

    def forward(self, batch: dict[str, torch.Tensor], targets: dict[str, torch.Tensor], *,
                multipliers: dict[str, float], temperature: float, always_loss: bool = False):
        """``always_loss``: when no term applies to the batch (unlabeled rows, hard loss only), return a zero
        loss that touches every parameter instead of None, so that DDP's gradient reduction still runs on
        every process (the step is then skipped, as it is on one process)."""
        out = self.student(batch, return_hidden=self.objective.needs_hidden)
        loss, parts = self.objective(out, targets, multipliers=multipliers, temperature=temperature)
        if loss is None and always_loss:
            loss = sum(p.sum() for p in self.parameters()) * 0.0
        return loss, parts


@dataclass
class TrainingRun:
    """A built run and where it stands: everything the named parts of the loop share."""

    name: str
    run: RunConfig
    model_cfg: StudentConfig
    task: TaskSpec
    meta: dict
    group: ProcessGroup
    device: torch.device
    trainable: Trainable
    engine: torch.nn.Module
    """What the forward goes through: ``trainable``, or DDP around it."""
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    data: Mixture
    sources: list[Source]
    schedule: Schedule
    total: int
    dev_rows: Any
    prepared_dir: Path | None
    metric: str
    identity: dict[str, Any]
    ckpt_dir: Path
    step: int = 0
    best_step: int = 0
    bad_evals: int = 0
    stopped_early: bool = False
    last_eval: int = -1
    best: dict[str, float] | None = None
    best_state: dict[str, torch.Tensor] | None = None
    steps_log: list[dict[str, Any]] = field(default_factory=list)
    dev_log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def student(self) -> torch.nn.Module:
        return self.trainable.student

    @property
    def pairs(self) -> bool:
        return self.run.encoding == "diffcat"


def build_run(name: str, *, model_cfg: StudentConfig, run: RunConfig, loader_cfg: LoaderConfig, device: str,
              tokens_dir: str | Path, store_path: str | Path, prepared_dir: str | Path | None, ckpt_dir: str | Path,
              init_dir: str | Path | None = None, augment: tuple[str, str | Path, str | Path] | None = None,
              loader_workers: int = 0, word_vectors: str | Path | None = None) -> TrainingRun:
    """Everything a run needs before its first step, on this process (joining the process group under
    torchrun). ``augment``: (name, tokens dir, cache) of unlabeled rows of the same kind mixed into training
    (teacher losses only). ``word_vectors``: a word_vectors table folder, copied into the student's fixed
    input vectors (ELMo-C); its digest joins the run's identity."""
    from datasets import load_from_disk

    tokens_dir = Path(tokens_dir)
    meta = read_meta(tokens_dir)
    group, dev = join(device)
    stores = {"dataset": open_store(store_path, {"tokens_fingerprint": meta["fingerprint"], "split": "train"})}
    signals = stores["dataset"].manifest.signals
    task = task_spec(meta, run, signals, stores["dataset"].manifest.teacher.config)
    opt = run.optim

    seed_everything(opt.seed)
    student = build_student(model_cfg, task)
    if init_dir is not None:
        _init_from(student, Path(init_dir))
    vectors_digest = None
    if word_vectors is not None:
        table, vectors_digest = load_table(word_vectors, tokenizer_sha256=meta["tokenizer"]["sha256"])
        try:
            set_input_vectors(student, table)
        except ValueError as e:
            raise TrainDataError(f"{name}: {e}") from None
    elif hasattr(student, INPUT_VECTORS) and init_dir is None:
        raise TrainDataError(f"{name}: this student ({model_cfg.student}) reads a fixed word-vector table: train it "
                             "as a train_lm run (word_vectors: <table>), or initialise it from one (finetune)")
    tune = run.tune if isinstance(run, FinetuneRunConfig) else "full"
    try:
        n_trainable, n_params = freeze_for_tuning(student, tune)
    except ValueError as e:
        raise TrainDataError(f"{name}: {e}") from None
    log.info("%s: %s of %s student parameters train (tune: %s)", name, f"{n_trainable:,}", f"{n_params:,}", tune)
    student.to(dev)

    names = store_names(run.objective, task.kind, signals)
    loader_kw = {"batch_size": opt.batch_size, "seed": opt.seed, "block_rows": loader_cfg.block_rows,
                 "buffer_blocks": loader_cfg.buffer_blocks, "streams": loader_cfg.streams,
                 "num_workers": loader_workers, "rank": group.rank, "world": group.world}
    source = Source(meta["name"], tokens_dir, store_path, names, **loader_kw)
    sources = [source]
    if augment is not None:
        aug_name, aug_tokens, aug_store = augment
        extra = Source(aug_name, aug_tokens, aug_store, names, **loader_kw)
        if extra.info.kind != source.info.kind or extra.info.signals.to_dict() != signals.to_dict():
            raise TrainDataError(f"augment {aug_name} must have the kind and cached signals of {meta['name']} "
                                 f"({extra.info.kind} vs {source.info.kind}; compare their teacher_cache signals)")
        sources.append(extra)
        stores["augment"] = extra.loader.dataset.store()
    data = Mixture(sources, opt.seed)
    probe_rows = source.rows.select_columns(source.columns)[:2]
    probe_batch, _ = collate(probe_rows, None, kind=task.kind, pad_id=task.pad_id, labeled=True,
                             pairs=run.encoding == "diffcat", pool=signals.pool, bin_width=task.bin_width)
    dims = probe_student(student, {k: v.to(dev) for k, v in probe_batch.items()})
    objective = Objective(run.objective, kind=task.kind, signals=signals, dims=dims).to(dev)
    trainable = Trainable(student, objective)
    engine: torch.nn.Module = trainable
    if group.distributed:
        # every rank starts from the same weights (same seed; DDP broadcasts rank 0's anyway), but draws its
        # own dropout masks from here on
        torch.manual_seed(opt.seed * 7919 + group.rank)
        engine = DistributedDataParallel(trainable, device_ids=[dev.index] if dev.type == "cuda" else None,
                                         find_unused_parameters=True)
    optimizer = adamw(param_groups([trainable], opt.weight_decay), lr=opt.lr)
    params = [p for g in optimizer.param_groups for p in g["params"]]

    per_epoch = []
    for e in range(opt.epochs):
        data.set_epoch(e)
        per_epoch.append(len(data))
    data.set_epoch(0)
    total = sum(per_epoch) if opt.max_steps is None else min(sum(per_epoch), opt.max_steps)
    schedule = build_schedule(run.objective.schedule, blocks=aligned_blocks(run.objective), total_steps=max(total, 1),
                              embedding_stage=bool(run.objective.loss_weights.get("embedding")))
    splits = load_from_disk(str(tokens_dir))
    if "dev" not in splits:
        raise TrainDataError(f"{tokens_dir} has no dev split: the loop evaluates (and early-stops) on dev; give the "
                             "dataset a dev split in prepare (splits.dev > 0)")
    identity = run_identity(run=run, model_cfg=model_cfg, loader_cfg=loader_cfg, tokens_meta=meta, stores=stores,
                            init_dir=init_dir, augment=augment, device=dev, processes=group.world,
                            word_vectors=vectors_digest)
    return TrainingRun(name=name, run=run, model_cfg=model_cfg, task=task, meta=meta, group=group, device=dev,
                       trainable=trainable, engine=engine, optimizer=optimizer, params=params, data=data,
                       sources=sources, schedule=schedule, total=total, dev_rows=splits["dev"],
                       prepared_dir=Path(prepared_dir) if prepared_dir is not None else None,
                       metric=primary_metric(task.kind, meta, lm=dims.lm), identity=identity,
                       ckpt_dir=Path(ckpt_dir))


def restore(r: TrainingRun) -> bool:
    """Resume from the newest checkpoint of the same identity (True), or start over, naming what changed."""
    state = load_latest(r.ckpt_dir)
    if state is not None:
        changed = identity_changes(state.get("identity"), r.identity)
        if changed:
            if r.group.main:
                log.warning("checkpoint in %s was made with other %s: starting over", r.ckpt_dir, ", ".join(changed))
            _barrier(r)  # every rank has read it before rank 0 removes it
            if r.group.main:
                clear_checkpoints(r.ckpt_dir)
            state = None
    if state is None:
        return False
    for source in r.sources:  # every byte the resumed run reads must be what the first part read
        open_store(source.loader.dataset.store_path, verify=True)
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
    batch, targets = collate(rows, arrays, kind=task.kind, pad_id=task.pad_id, labeled=source.info.labeled,
                             pairs=r.pairs, pool=source.info.signals.pool, bin_width=task.bin_width)
    batch = {k: v.to(r.device, non_blocking=True) for k, v in batch.items()}
    targets = {k: v.to(r.device, non_blocking=True) for k, v in targets.items()}
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
                                  batch_size=2 * r.run.optim.batch_size, pairs=r.pairs, dataset_meta=r.meta,
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


def checkpoint(r: TrainingRun) -> None:
    """Rank 0 writes a checkpoint holding every rank's RNG state; every rank returns once it is on disk."""
    rngs = [rng_state()]
    if r.group.distributed:
        rngs = [None] * r.group.world
        dist.all_gather_object(rngs, rng_state())
    if r.group.main:
        save_checkpoint(r.ckpt_dir, r.step, {
            "identity": r.identity, "model": r.trainable.state_dict(), "optimizer": r.optimizer.state_dict(),
            "loader": r.data.state_dict(), "rng": rngs, "step": r.step, "best_step": r.best_step,
            "bad_evals": r.bad_evals, "stopped_early": r.stopped_early, "last_eval": r.last_eval, "best": r.best,
            "best_state": r.best_state, "steps_log": r.steps_log, "dev_log": r.dev_log})
    _barrier(r)


def finish(r: TrainingRun, *, out_dir: str | Path, live_dir: str | Path, init_dir: str | Path | None,
           seconds: float) -> RunSummary:
    """Rank 0 writes the student (the best evaluated weights) and its dvclive folder; checkpoints go."""
    if r.group.main:
        if r.best_state is not None:
            r.student.load_state_dict(r.best_state)
        counts = [(p.numel(), p.requires_grad) for p in r.student.parameters()]
        record = {"name": r.name, "dataset": r.meta["name"], "kind": r.task.kind, "metric": r.metric, "steps": r.step,
                  "best_step": r.best_step, "dev": r.best, "init": str(init_dir) if init_dir else None,
                  "tokens_fingerprint": r.meta["fingerprint"], "tokenizer_sha256": r.meta["tokenizer"]["sha256"],
                  "note": r.run.note, "trainable_params": sum(n for n, grad in counts if grad)}
        save_student(out_dir, r.student, r.model_cfg, r.task, record)
        write_live(live_dir, summary=train_summary(r.metric, r.best, r.best_step), params=dataclasses.asdict(r.run),
                   curves=_curves(r), step=r.step)
        clear_checkpoints(r.ckpt_dir)
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
        opt = r.run.optim
        bar = Progress(total=r.total, initial=r.step, desc=f"train {name}", unit="step", disable=not r.group.main)
        r.trainable.train()
        while r.step < r.total and not r.stopped_early:
            for source, rows, arrays in r.data:
                row = train_step(r, source, rows, arrays)
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.3f}")
                if opt.eval_every and r.step % opt.eval_every == 0:
                    record_evaluation(r, evaluate(r))
                    checkpoint(r)
                elif r.step % opt.checkpoint_every == 0:
                    checkpoint(r)
                if r.step >= r.total or r.stopped_early:
                    break
            else:  # the epoch ended
                if not opt.eval_every and r.last_eval != r.step:
                    record_evaluation(r, evaluate(r))
                checkpoint(r)
        bar.close()
        if r.last_eval != r.step or r.best is None:
            record_evaluation(r, evaluate(r))
        return finish(r, out_dir=out_dir, live_dir=live_dir, init_dir=init_dir, seconds=time.time() - t0)
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
