"""The student training loop, shared by every student, dataset and objective (``train`` and ``finetune``).

It never branches on which student it trains: the student's forward returns a StudentOutput, the
objective (train/objective.py) turns it and the cached teacher rows into loss terms, the schedule
(train/schedule.py) weights the terms and shapes the learning rate and temperature step by step.

Resume: atomic checkpoints (model, objective projections, optimizer, RNG states, the block loader's
position, the evaluation history and the best weights) every ``checkpoint_every`` steps and at each
evaluation. A checkpoint carries the run's identity (:func:`run_identity`): the params, the content
digests of the tokens, the teacher cache(s) and the init student's weights, the code (the import closure
of this module) and the device type. A restarted run with the same identity continues exactly where the
checkpoint was taken (same batches, same dropout masks), so N steps straight give the same weights as
N/2, kill, resume, N/2; before it does, it verifies the teacher cache's checksums. Any other identity
starts over, naming what changed.

Outputs: the student (``model.pt`` + ``student.json``; the best-on-dev weights when evaluation is
on), a metrics JSON and per-step/per-evaluation CSVs for ``dvc plots``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from distillpipe.config.run import LoaderConfig, RunConfig
from distillpipe.config.students import StudentConfig
from distillpipe.data.schema import read_meta
from distillpipe.evaluate.student import evaluate_student, primary_metric
from distillpipe.identity import code_digests, json_sha256, sha256_dir
from distillpipe.runtime import adamw, autocast, resolve_device, rng_state, seed_everything, set_rng_state
from distillpipe.store.reader import open_store
from distillpipe.students import build_student, load_student, save_student
from distillpipe.students.base import TaskSpec
from distillpipe.train.checkpoint import clear_checkpoints, load_latest, save_checkpoint
from distillpipe.train.data import Mixture, Source, TrainDataError, collate
from distillpipe.train.objective import Objective, probe_student, store_names
from distillpipe.train.schedule import build_schedule

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


def task_spec(meta: dict, run: RunConfig, signals) -> TaskSpec:
    kind = meta["kind"]
    if kind == "classification":
        if meta.get("task_type") == "regression":
            raise TrainDataError(f"{meta['name']} is a regression task: student training on regression is not "
                                 "supported yet (the teacher's bins are not recorded with the tokens)")
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
                    pad_id=int(tok["pad_id"]), num_labels=num_labels, encoding=run.encoding, head=run.head)


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
            (no_decay if p.ndim < 2 or id(p) in emb else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


CODE_MODULES = ("distillpipe.train.loop",)
"""The training code: its import closure (students, losses, objective, schedule, data, evaluation) is part
of a checkpoint's identity, so a run never continues with code other than the code it started with."""


def run_identity(*, run: RunConfig, model_cfg: StudentConfig, loader_cfg: LoaderConfig, tokens_meta: dict,
                 stores: dict[str, Any], init_dir: str | Path | None, augment: tuple | None,
                 device: torch.device) -> dict[str, Any]:
    """Everything that decides a run's weights, as digests: what a checkpoint must match to be resumed."""
    return {
        "params": json_sha256({"run": dataclasses.asdict(run), "model": dataclasses.asdict(model_cfg),
                               "loader": dataclasses.asdict(loader_cfg)}),
        "tokens": tokens_meta["fingerprint"],
        "teacher cache": {k: s.content_sha256() for k, s in stores.items()},
        "augment tokens": read_meta(augment[1])["fingerprint"] if augment else None,
        "init weights": sha256_dir(init_dir) if init_dir is not None else None,
        "code": json_sha256(code_digests(CODE_MODULES)),
        "device": device.type,
    }


def identity_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Names of the identity fields that differ (all of them for a checkpoint without an identity)."""
    if not isinstance(old, dict):
        return ["identity (a checkpoint of an older version)"]
    return [k for k in new if old.get(k) != new[k]]


def train_student(name: str, *, model_cfg: StudentConfig, run: RunConfig, loader_cfg: LoaderConfig, device: str,
                  tokens_dir: str | Path, store_path: str | Path, prepared_dir: str | Path | None,
                  out_dir: str | Path, ckpt_dir: str | Path, metrics_path: str | Path, plots_dir: str | Path,
                  init_dir: str | Path | None = None,
                  augment: tuple[str, str | Path, str | Path] | None = None) -> RunSummary:
    """Train one student run. ``augment``: (name, tokens dir, cache) of unlabeled rows of the same kind mixed
    into training (teacher losses only)."""
    from datasets import load_from_disk

    t0 = time.time()
    tokens_dir, out_dir, ckpt_dir = Path(tokens_dir), Path(out_dir), Path(ckpt_dir)
    meta = read_meta(tokens_dir)
    dev_device = resolve_device(device)
    stores = {"dataset": open_store(store_path, {"tokens_fingerprint": meta["fingerprint"], "split": "train"})}
    signals = stores["dataset"].manifest.signals
    task = task_spec(meta, run, signals)
    pairs = run.encoding == "diffcat"
    opt = run.optim

    seed_everything(opt.seed)
    model = build_student(model_cfg, task)
    if init_dir is not None:
        _init_from(model, Path(init_dir))
    model.to(dev_device)

    names = store_names(run.objective, task.kind, signals)
    loader_kw = {"batch_size": opt.batch_size, "seed": opt.seed, "block_rows": loader_cfg.block_rows,
                 "buffer_blocks": loader_cfg.buffer_blocks, "num_workers": loader_cfg.num_workers}
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
    probe_batch, _ = collate(probe_rows, None, kind=task.kind, pad_id=task.pad_id, labeled=True, pairs=pairs,
                             pool=signals.pool)
    dims = probe_student(model, {k: v.to(dev_device) for k, v in probe_batch.items()})
    objective = Objective(run.objective, kind=task.kind, signals=signals, dims=dims).to(dev_device)
    optimizer = adamw(param_groups([model, objective], opt.weight_decay), lr=opt.lr)
    params = [p for g in optimizer.param_groups for p in g["params"]]

    per_epoch = []
    for e in range(opt.epochs):
        data.set_epoch(e)
        per_epoch.append(len(data))
    data.set_epoch(0)
    total = sum(per_epoch) if opt.max_steps is None else min(sum(per_epoch), opt.max_steps)
    schedule = build_schedule(run.objective.schedule, n_blocks=len(run.objective.layer_map), total_steps=max(total, 1),
                              embedding_stage=bool(run.objective.loss_weights.get("embedding")))

    splits = load_from_disk(str(tokens_dir))
    if "dev" not in splits:
        raise TrainDataError(f"{tokens_dir} has no dev split: the loop evaluates (and early-stops) on dev; give the "
                             "dataset a dev split in prepare (splits.dev > 0)")
    dev_rows = splits["dev"]
    metric = primary_metric(task.kind, meta)

    def evaluate() -> dict[str, float]:
        return evaluate_student(model, dev_rows, kind=task.kind, pad_id=task.pad_id, device=dev_device,
                                batch_size=2 * opt.batch_size, pairs=pairs, dataset_meta=meta,
                                prepared_dir=prepared_dir, split="dev")

    # Resume only the same run on the same inputs and code; anything else starts over, naming what changed.
    identity = run_identity(run=run, model_cfg=model_cfg, loader_cfg=loader_cfg, tokens_meta=meta, stores=stores,
                            init_dir=init_dir, augment=augment, device=dev_device)
    step, best_step, bad_evals, stopped_early = 0, 0, 0, False
    best: dict[str, float] | None = None
    best_state: dict[str, torch.Tensor] | None = None
    steps_log: list[dict[str, Any]] = []
    dev_log: list[dict[str, Any]] = []
    state = load_latest(ckpt_dir)
    if state is not None:
        changed = identity_changes(state.get("identity"), identity)
        if changed:
            log.warning("checkpoint in %s was made with other %s: starting over", ckpt_dir, ", ".join(changed))
            clear_checkpoints(ckpt_dir)
            state = None
    if state is not None:
        for store in stores.values():  # every byte the resumed run reads must be what the first part read
            open_store(store.root, verify=True)
        model.load_state_dict(state["model"])
        objective.load_state_dict(state["objective"])
        optimizer.load_state_dict(state["optimizer"])
        data.load_state_dict(state["loader"])
        set_rng_state(state["rng"])
        step, best_step, bad_evals = state["step"], state["best_step"], state["bad_evals"]
        best, best_state, steps_log, dev_log = state["best"], state["best_state"], state["steps_log"], state["dev_log"]
        log.info("resuming %s at step %d/%d", name, step, total)

    def checkpoint() -> None:
        save_checkpoint(ckpt_dir, step, {
            "identity": identity, "model": model.state_dict(), "objective": objective.state_dict(),
            "optimizer": optimizer.state_dict(), "loader": data.state_dict(), "rng": rng_state(),
            "step": step, "best_step": best_step, "bad_evals": bad_evals, "best": best, "best_state": best_state,
            "steps_log": steps_log, "dev_log": dev_log})

    def after_eval(scores: dict[str, float]) -> bool:
        """Record an evaluation; True when early stopping says stop."""
        nonlocal best, best_state, best_step, bad_evals
        dev_log.append({"step": step, **scores})
        log.info("step %d: dev %s", step, ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
        if best is None or scores[metric] > best[metric]:
            best, best_step, bad_evals = scores, step, 0
            best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        else:
            bad_evals += 1
        return opt.patience is not None and bad_evals >= opt.patience

    bar = tqdm(total=total, initial=step, desc=f"train {name}", unit="step")
    model.train()
    last_eval = dev_log[-1]["step"] if dev_log else -1
    while step < total and not stopped_early:
        epoch = data.epoch
        for src, rows, arrays in data:
            batch, targets = collate(rows, arrays, kind=task.kind, pad_id=task.pad_id,
                                     labeled=src.info.labeled, pairs=pairs, pool=signals.pool)
            batch = {k: v.to(dev_device, non_blocking=True) for k, v in batch.items()}
            targets = {k: v.to(dev_device, non_blocking=True) for k, v in targets.items()}
            lr = opt.lr * schedule.lr_factor(step)
            for g in optimizer.param_groups:
                g["lr"] = lr
            with autocast(dev_device):
                out = model(batch, return_hidden=objective.needs_hidden)
                loss, parts = objective(out, targets, multipliers=schedule.weights(step),
                                        temperature=schedule.temperature(step))
            if loss is not None:
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"{name}: loss is {loss.item()} at step {step} ({parts}); lower optim.lr "
                                             "or check the teacher cache with `distillpipe inspect --verify`")
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, opt.max_grad_norm)
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            steps_log.append({"step": step, "epoch": epoch, "lr": lr, "phase": schedule.phase(step - 1),
                              "loss": loss.item() if loss is not None else float("nan"),
                              **{k: float(v) for k, v in parts.items()}})
            bar.update(1)
            bar.set_postfix(loss=f"{steps_log[-1]['loss']:.3f}")
            if opt.eval_every and step % opt.eval_every == 0:
                stopped_early = after_eval(evaluate())
                last_eval = step
                checkpoint()
            elif step % opt.checkpoint_every == 0:
                checkpoint()
            if step >= total or stopped_early:
                break
        else:  # the epoch ended
            if not opt.eval_every and last_eval != step:
                stopped_early = after_eval(evaluate())
                last_eval = step
            checkpoint()
    bar.close()
    if last_eval != step or best is None:
        stopped_early = after_eval(evaluate()) or stopped_early
    if best_state is not None:
        model.load_state_dict(best_state)

    record = {"name": name, "dataset": meta["name"], "kind": task.kind, "metric": metric, "steps": step,
              "best_step": best_step, "dev": best, "init": str(init_dir) if init_dir else None,
              "tokens_fingerprint": meta["fingerprint"], "tokenizer_sha256": meta["tokenizer"]["sha256"],
              "note": run.note}
    save_student(out_dir, model, model_cfg, task, record)
    seconds = time.time() - t0
    _write_json(metrics_path, {**{k: record[k] for k in ("name", "dataset", "metric", "steps", "best_step")},
                               "dev": best, "stopped_early": stopped_early,
                               "train_rows": sum(s.loader.dataset.store().n_rows for s in sources)})
    _write_plots(Path(plots_dir), steps_log, dev_log)
    clear_checkpoints(ckpt_dir)
    return RunSummary(name, step, seconds, best_step, metric, best or {}, stopped_early)


def _write_json(path: str | Path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=_plain) + "\n")


def _plain(x):
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(type(x))


def _write_plots(folder: Path, steps_log: list[dict], dev_log: list[dict]) -> None:
    """``steps.csv`` (loss, lr and each term per step) and ``dev.csv`` (each evaluation) for ``dvc plots``."""
    folder.mkdir(parents=True, exist_ok=True)
    for fname, rows in (("steps.csv", steps_log), ("dev.csv", dev_log)):
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(folder / fname, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys, restval="")
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else v) for k, v in r.items()})

