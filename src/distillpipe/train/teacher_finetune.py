"""Teacher fine-tuning (the ``teacher_finetune`` stage); it is scored by :mod:`distillpipe.evaluate.teacher`.

``finetune_teacher`` fine-tunes an imported teacher on a tokenized task: classification, regression
cast to classification by bins (CMOW paper, after Raffel et al.: STS-B in 0.2 bins), extractive QA
(start/end), or, on an MLM corpus, an MLM prediction head for a teacher that has none
(:mod:`distillpipe.teacher.mlm_head`). It resumes from its own checkpoints (model, optimizer,
scheduler, RNG, position in the epoch) and writes the model in ``save_pretrained`` layout with its
dev (and test) metrics and the per-example records behind them (``predictions.json``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distillpipe.assets import tokenizer_files, tokenizer_sha256, weights_sha256
from distillpipe.checkpoints import Checkpointer, resume_or_restart
from distillpipe.config.teacher_finetune import TeacherFinetuneTaskConfig
from distillpipe.data.batching import collate_tokens, length_batches
from distillpipe.data.schema import read_meta, regression_bins
from distillpipe.errors import UserError
from distillpipe.evaluate.baseline import teacher_check, weak_teacher_message
from distillpipe.evaluate.size import count_parameters
from distillpipe.evaluate.teacher import METRICS_FILE, PREDICTIONS_FILE, score_teacher
from distillpipe.identity import json_sha256, stage_code
from distillpipe.progress import Progress
from distillpipe.runtime import adamw, autocast, resolve_device, rng_state, seed_everything, set_rng_state
from distillpipe.teacher.arch import model_inputs
from distillpipe.teacher.mlm_head import COLUMNS as MLM_COLUMNS
from distillpipe.teacher.mlm_head import build_mlm_model, mlm_loss
from distillpipe.tracking import teacher_summary, write_live

log = logging.getLogger(__name__)
CODE_STAGE = "teacher_finetune"
"""The stage whose whole import closure is the code part of a checkpoint's identity."""


class FinetuneError(UserError, ValueError):
    """The task data does not fit the fine-tuning configuration."""


@dataclass
class FinetuneSummary:
    task: str
    train_rows: int
    steps: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    weak: str | None = None
    """The warning when the dev score is not clearly above the trivial baseline (evaluate/baseline.py)."""
    chosen: str | None = None
    """With ``lr_grid``: which learning rate won on dev, and by how much."""

    def one_line(self) -> str:
        m = ", ".join(f"{k} {v:.3f}" for k, v in self.metrics.items() if k in _HEADLINE)
        return (f"teacher_finetune {self.task}: {self.train_rows:,} train rows, {self.steps} steps, "
                f"{self.seconds:.1f} s; dev {m}" + (f"; {self.chosen}" if self.chosen else "")
                + (f"\nwarning: {self.weak}" if self.weak else ""))


def _headline(task_type: str, meta: dict) -> str:
    """The metric a teacher is summarised by: the one its students early-stop on (evaluate.student's
    primary_metric, not imported: the teacher stage does not depend on the student code)."""
    if task_type in ("corpus", "qa"):
        return {"corpus": "mlm_accuracy", "qa": "f1"}[task_type]
    if task_type == "regression":
        return "pearson"
    return "matthews" if str(meta.get("name", "")).lower() == "cola" else "accuracy"


_HEADLINE = ("accuracy", "f1", "matthews", "pearson", "spearman", "exact", "mlm_accuracy", "perplexity")


def _build_model(base_dir: Path, task_type: str, num_labels: int, label_names: list[str] | None):
    from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    if task_type == "corpus":
        return build_mlm_model(base_dir)

    # transformers' load report lists the new head as MISSING, which reads like an error here.
    hf_logging.set_verbosity_error()
    log.info("initialising a new %s head on %s", "QA (start/end)" if task_type == "qa" else
             f"{num_labels}-way classification", base_dir)
    if task_type == "qa":
        return AutoModelForQuestionAnswering.from_pretrained(base_dir), True
    kwargs = {}
    if label_names:
        kwargs = {"id2label": dict(enumerate(label_names)), "label2id": {n: i for i, n in enumerate(label_names)}}
    return AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=num_labels, **kwargs), True


def _labels(task_type: str, rows: dict[str, list], bin_width: float | None) -> dict[str, torch.Tensor]:
    if task_type == "qa":
        return {"start_positions": torch.tensor(rows["start_positions"]),
                "end_positions": torch.tensor(rows["end_positions"])}
    if task_type == "regression":
        return {"labels": torch.from_numpy(regression_bins(rows["label"], bin_width))}
    return {"labels": torch.tensor(rows["label"], dtype=torch.long)}


def _check_task(task: str, meta: dict, cfg: TeacherFinetuneTaskConfig) -> tuple[str, int, list[str] | None]:
    task_type = meta["task_type"]
    if task_type == "corpus" and meta.get("kind") != "mlm":
        raise FinetuneError(f"teacher_finetune.tasks.{task}: {task} is a corpus tokenized as {meta.get('kind')!r}; "
                            "an MLM head trains on MLM tokens (tokenize kind: mlm)")
    if (task_type == "regression") != (cfg.regression_bin_width is not None):
        raise FinetuneError(f"teacher_finetune.tasks.{task}.regression_bin_width must be set for regression tasks "
                            f"and null otherwise ({task} is {task_type})")
    label_names = meta.get("label_names")
    num_labels = len(label_names) if label_names else int(meta.get("num_labels") or 0)
    return task_type, num_labels, label_names


def finetune_teacher(task: str, base_dir: str | Path, tokens_dir: str | Path, prepared_dir: str | Path,
                     cfg: TeacherFinetuneTaskConfig, device: str, out_dir: str | Path,
                     ckpt_dir: str | Path, live_dir: str | Path) -> FinetuneSummary:
    """Fine-tune at ``cfg.lr``, or, with ``cfg.lr_grid``, at each rate and keep the best on dev (BERT's recipe:
    Devlin et al. sec. 4.1 select the rate on dev). Each rate's run lives in ``ckpt_dir/lr-<rate>/`` (its own
    checkpoints, model and dvclive folder), so a killed selection resumes at the rate it was at and skips the
    finished ones; the winner's model and dvclive folder become ``out_dir`` and ``live_dir``, its ``metrics.json``
    records every rate's dev score (``lr_selection``). Test is never looked at for the choice."""
    if not cfg.lr_grid:
        return _finetune_one(task, base_dir, tokens_dir, prepared_dir, cfg, device, out_dir, ckpt_dir, live_dir)
    t0 = time.time()
    out_dir, ckpt_dir, live_dir = Path(out_dir), Path(ckpt_dir), Path(live_dir)
    meta = read_meta(tokens_dir)
    headline = _headline(meta["task_type"], meta)
    base_sha = weights_sha256(base_dir)  # the same base for every rate: hashed once, not once per rate
    scores: dict[float, float] = {}
    runs: dict[float, FinetuneSummary | None] = {}
    for rate in [cfg.lr, *cfg.lr_grid]:
        sub = ckpt_dir / f"lr-{rate:g}"
        one = dataclasses.replace(cfg, lr=rate, lr_grid=None)
        # a finished rate is reused only when it was trained as this one would be (params, tokens, base, code, device)
        run_id = json_sha256({"cfg": dataclasses.asdict(one), "tokens": meta["fingerprint"],
                              "base": base_sha, "task": task, "code": stage_code(CODE_STAGE),
                              "device": resolve_device(device).type})
        done = sub / "done.json"
        if done.is_file() and json.loads(done.read_text()).get("run_id") == run_id:  # finished before a kill
            scores[rate] = float(json.loads((sub / "model" / METRICS_FILE).read_text())[headline])
            runs[rate] = None
            log.info("teacher_finetune %s: lr %g already fine-tuned (dev %s %.4f)", task, rate, headline, scores[rate])
            continue
        if done.is_file():
            log.info("teacher_finetune %s: lr %g was fine-tuned with other params, tokens, base or code: again",
                     task, rate)
            shutil.rmtree(sub)
        runs[rate] = _finetune_one(task, base_dir, tokens_dir, prepared_dir, one, device, sub / "model", sub / "ckpt",
                                   sub / "live")
        done.write_text(json.dumps({"run_id": run_id}) + "\n")
        scores[rate] = float(runs[rate].metrics.get(headline, math.nan))
    ranked = sorted(scores, key=lambda r: -scores[r] if not math.isnan(scores[r]) else math.inf)
    best = ranked[0]
    margin = scores[best] - scores[ranked[1]]
    chosen = (f"lr {best:g} chosen on dev {headline} {scores[best]:.4f}, {margin:+.4f} over the next best (lr "
              f"{ranked[1]:g}); " + ", ".join(f"lr {r:g}: {scores[r]:.4f}" for r in scores))
    log.info("teacher_finetune %s: %s", task, chosen)
    sub = ckpt_dir / f"lr-{best:g}"
    metrics = json.loads((sub / "model" / METRICS_FILE).read_text())
    metrics["lr_selection"] = {"metric": headline, "dev": {f"{r:g}": scores[r] for r in scores}, "chosen": best,
                               "margin": margin}
    (sub / "model" / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    for src, dst in ((sub / "model", out_dir), (sub / "live", live_dir)):
        tmp = dst.with_name(dst.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    for rate in scores:  # the winner is saved: the candidates are no longer needed (and may be GBs each)
        shutil.rmtree(ckpt_dir / f"lr-{rate:g}", ignore_errors=True)
    won = runs[best]
    if won is None:  # chosen among runs finished before a restart: its summary from its metrics
        won = FinetuneSummary(task, int(metrics["train_rows"]), int(metrics["steps"]), 0.0,
                              {k: v for k, v in metrics.items() if k in _HEADLINE})
    return dataclasses.replace(won, seconds=time.time() - t0, chosen=chosen)


def _finetune_one(task: str, base_dir: str | Path, tokens_dir: str | Path, prepared_dir: str | Path,
                  cfg: TeacherFinetuneTaskConfig, device: str, out_dir: str | Path,
                  ckpt_dir: str | Path, live_dir: str | Path) -> FinetuneSummary:
    from datasets import load_from_disk
    from transformers import get_linear_schedule_with_warmup

    t0 = time.time()
    base_dir, tokens_dir, out_dir, ckpt_dir = map(Path, (base_dir, tokens_dir, out_dir, ckpt_dir))
    meta = read_meta(tokens_dir)
    task_type, num_labels, label_names = _check_task(task, meta, cfg)
    if tokenizer_sha256(base_dir) != meta["tokenizer"]["sha256"]:
        raise FinetuneError(f"{tokens_dir} was tokenized with another tokenizer than the teacher in {base_dir}; "
                            "set tokenize.tokenizer to the teacher and re-run tokenize")
    data = load_from_disk(str(tokens_dir))
    for split in ("train", "dev"):
        if split not in data:
            raise FinetuneError(f"{tokens_dir} has no {split!r} split (splits: {list(data)})")
    train = data["train"]
    if cfg.max_train_rows is not None and len(train) > cfg.max_train_rows:
        # In memory: a cache file written beside the tokens would modify another stage's DVC output.
        train = train.shuffle(seed=cfg.seed, keep_in_memory=True).select(range(cfg.max_train_rows), keep_in_memory=True)
    if task_type == "regression":
        num_labels = int(regression_bins([max(train["label"])], cfg.regression_bin_width)[0]) + 1
    dev_device = resolve_device(device)

    seed_everything(cfg.seed)
    model, trains = _build_model(base_dir, task_type, num_labels, label_names)
    model.to(dev_device)
    model.config.distillpipe = {"task": task, "task_type": task_type, "regression_bin_width": cfg.regression_bin_width}
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # MLM: the new head's only
    groups = [
        {"params": [p for n, p in named if not n.endswith(no_decay)], "weight_decay": cfg.weight_decay},
        {"params": [p for n, p in named if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    optimizer = adamw(groups, lr=cfg.lr)
    lengths = np.asarray(train["length"])
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs if trains else 0  # a masked LM that has its head: kept as it is
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_fraction * total), total)

    # Resume only a run of the same task, params, tokens (content), base weights, code and device type; anything
    # else starts over, saying so.
    run_id = json_sha256({"cfg": dataclasses.asdict(cfg), "tokens": meta["fingerprint"],
                          "base": weights_sha256(base_dir), "task": task,
                          "code": stage_code(CODE_STAGE), "device": dev_device.type})
    epoch, step_in_epoch, step = 0, 0, 0
    steps_log: list[tuple[int, dict[str, float]]] = []  # (step, loss and lr): checkpointed, so a resume keeps it
    state = resume_or_restart(ckpt_dir, run_id, key="run_id", covers="params, data, base weights, code or device")
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        epoch, step_in_epoch, step = state["epoch"], state["step_in_epoch"], state["step"]
        steps_log = state["steps_log"]
        log.info("resuming %s at epoch %d, step %d/%d", task, epoch, step, total)

    # By the clock, in the background (checkpoints.py): none at the end, as the model is saved right after
    # training and the folder cleared; a kill while it is scored loses at most checkpoint_minutes of training.
    checkpoints = Checkpointer(ckpt_dir, cfg.checkpoint_minutes)

    def checkpoint():
        checkpoints.save(step, {
            "run_id": run_id, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "rng": rng_state(), "epoch": epoch,
            "step_in_epoch": step_in_epoch, "step": step, "steps_log": steps_log})

    pad_id = meta["tokenizer"]["pad_id"]
    columns = (MLM_COLUMNS if task_type == "corpus" else ["input_ids", "token_type_ids"]
               + (["start_positions", "end_positions"] if task_type == "qa" else ["label"]))
    train_cols = train.select_columns(columns)
    bar = Progress(total=total, initial=step, desc=f"fine-tune {task}", unit="step")
    model.train()
    if task_type == "corpus":
        model.base_model.eval()  # frozen: no dropout in the features the head learns from
    while epoch < cfg.epochs and trains:
        batches = length_batches(lengths, cfg.batch_size, shuffle=True, seed=cfg.seed * 1000 + epoch)
        for idx in batches[step_in_epoch:]:
            rows = train_cols[idx.tolist()]
            if task_type == "corpus":
                loss = mlm_loss(model, rows, pad_id, dev_device)
            else:
                inputs = {k: v.to(dev_device) for k, v in collate_tokens(rows, pad_id).items()}
                labels = {k: v.to(dev_device) for k, v in _labels(task_type, rows, cfg.regression_bin_width).items()}
                with autocast(dev_device):
                    loss = model(**model_inputs(model, inputs), **labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for _, p in named], cfg.max_grad_norm)
            optimizer.step()
            lr = scheduler.get_last_lr()[0]  # the rate this step used
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            steps_log.append((step, {"train/loss": loss.item(), "train/lr": lr}))
            step_in_epoch += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if checkpoints.due():
                checkpoint()
        epoch, step_in_epoch = epoch + 1, 0
    bar.close()
    checkpoints.wait()  # a write still in flight: on disk (or its error raised) before the model is scored

    dev = score_teacher(model, data["dev"], task_type, pad_id, dev_device, cfg.batch_size, cfg.regression_bin_width,
                        prepared_dir)
    metrics = dev.metrics
    report = {"task": task, "tokens": meta["fingerprint"], "train_rows": len(train), "steps": step, **metrics,
              "params": count_parameters(model)}  # what evaluate shows beside the students, without loading it
    headline = _headline(task_type, meta)
    check = teacher_check(task_type, headline, metrics.get(headline, math.nan), dev.examples,
                          data["train"]["label"] if task_type == "classification" else None)
    if check is not None:
        report["baseline"] = check  # evaluate passes it to the report
        if not check["clearly_above"]:
            log.warning("%s", weak_teacher_message(task, check))
    predictions = {"task": task, "tokens": meta["fingerprint"], "dev": dev.examples}
    # A task teacher is scored on test once here, so every student evaluation can show it without re-running the
    # teacher. An MLM head is not: its dev scores size teacher_cache's mlm_topk, and no student is scored against it
    # (on the embedded wiki, test would be ~830 more blocks through the encoder: ~30 s of CPU for nothing).
    if "test" in data and task_type != "corpus":
        test = score_teacher(model, data["test"], task_type, pad_id, dev_device, cfg.batch_size,
                             cfg.regression_bin_width, prepared_dir, split="test",
                             threshold=metrics.get("tuned_threshold"))  # QA: dev's null threshold
        report["test"], predictions["test"] = test.metrics, test.examples
    _save(model, base_dir, out_dir, report, predictions)
    write_live(live_dir, summary=teacher_summary(_headline(task_type, meta), metrics, report.get("test")),
               params={"task": task, **dataclasses.asdict(cfg)}, curves=steps_log, step=step)
    checkpoints.clear()  # the model is saved: a resume point is no longer needed (and may be GBs)
    return FinetuneSummary(task, len(train), step, time.time() - t0, metrics,
                           weak=weak_teacher_message(task, check) if check and not check["clearly_above"] else None)


def _save(model, base_dir: Path, out_dir: Path, metrics: dict[str, Any], predictions: dict[str, Any]) -> None:
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    # Copy the tokenizer files verbatim (not re-saved): their sha256 must stay the one tokenize recorded.
    for name in tokenizer_files(base_dir):  # SentencePiece models too: a DeBERTa-v3 folder has spm.model only
        shutil.copy2(base_dir / name, tmp / name)
    (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    (tmp / PREDICTIONS_FILE).write_text(json.dumps(predictions, sort_keys=True) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
