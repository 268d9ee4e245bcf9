"""The ``evaluate`` stage: score a trained student beside its teacher.

Two JSONs per run, both read by evaluate/report.py, and a dvclive folder (:mod:`distillpipe.tracking`: the
headline scores for ``dvc exp show``):

* ``metrics/students/<run>.json``: task metrics on each requested split for student and teacher, parameter
  counts with and without embeddings (CMOW paper Tables XII-XIII), and the prepared dataset's leakage report;
* ``predictions/<run>.json``: the per-example records behind those metrics (evaluate/scoring.py) for
  student and teacher, from which the report draws bootstrap intervals and paired tests.

Nothing in them depends on timing, so evaluating the same student on the same data gives the same
bytes; sentences/s are the ``speed`` stage's (evaluate/timing.py), a separate output.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from distillpipe.config.base import ConfigError
from distillpipe.config.evaluate import EvaluateConfig, EvaluateRunConfig
from distillpipe.data.schema import read_meta
from distillpipe.evaluate.scoring import Scored
from distillpipe.evaluate.size import count_parameters
from distillpipe.evaluate.student import primary_metric, score_student
from distillpipe.evaluate.teacher import METRICS_FILE, PREDICTIONS_FILE, score_teacher
from distillpipe.runtime import resolve_device
from distillpipe.students import load_student
from distillpipe.teacher.load import load_teacher
from distillpipe.tracking import evaluation_summary, write_live

log = logging.getLogger(__name__)


def evaluate_run(name: str, cfg: EvaluateConfig, run: EvaluateRunConfig, *, student_dir: str | Path,
                 tokens_dir: str | Path, prepared_dir: str | Path, teacher_dir: str | Path,
                 out_path: str | Path, predictions_path: str | Path, live_dir: str | Path) -> dict[str, Any]:
    from datasets import load_from_disk

    t0 = time.time()
    device = resolve_device(cfg.device)
    model, record = load_student(student_dir, device, student=run.student, where=f"evaluate.runs.{name}.student")
    if record["dataset"] != run.dataset:
        raise ConfigError(f"evaluate.runs.{name}.dataset is {run.dataset!r} but {student_dir} was trained on "
                          f"{record['dataset']!r}")
    task = record["task"]
    meta = read_meta(tokens_dir)
    if meta["tokenizer"]["sha256"] != record["tokenizer_sha256"]:
        raise ConfigError(f"{tokens_dir} was tokenized with another tokenizer than {student_dir} was trained on")
    data = load_from_disk(str(tokens_dir))
    splits = [s for s in cfg.splits if s in data]
    if not splits:
        raise ConfigError(f"{tokens_dir} has none of the splits {cfg.splits} (it has {list(data)})")
    head = "qa" if task.kind == "qa" else "classification"
    pairs = task.encoding == "diffcat"

    # A fine-tuned teacher was scored on these tokens when teacher_finetune saved it (metrics.json and
    # predictions.json in its folder, with its parameter counts); only teachers without those records are loaded
    # and run here (loading one costs a stage ~4 CPU-s: transformers and the weights).
    teacher_record = _recorded_record(Path(teacher_dir), meta)
    recorded = _recorded_teacher(Path(teacher_dir), meta, teacher_record)
    teacher_params = teacher_record.get("params")
    loaded: list = []

    def teacher():
        if not loaded:
            loaded.append(load_teacher(teacher_dir, head, device)[0])
        return loaded[0]
    if task.kind == "qa" and splits != ["dev"]:
        # SQuAD v2's no-answer threshold is tuned on dev and then applied to the other splits, never tuned on
        # test itself; so dev is scored first, even when only test was asked for.
        if "dev" not in data:
            raise ConfigError(f"{tokens_dir} has no dev split: QA test scores need dev's no-answer threshold")
        splits = ["dev", *[s for s in splits if s != "dev"]]
    student: dict[str, Scored] = {}
    teacher_scored: dict[str, Scored] = {}
    for split in splits:
        dev_s = student["dev"].metrics if "dev" in student else {}
        dev_t = teacher_scored["dev"].metrics if "dev" in teacher_scored else {}
        student[split] = score_student(model, data[split], kind=task.kind, pad_id=task.pad_id, device=device,
                                       batch_size=cfg.batch_size, pairs=pairs,
                                       prepared_dir=prepared_dir, split=split, threshold=dev_s.get("tuned_threshold"),
                                       bin_width=task.bin_width)
        teacher_scored[split] = recorded.get(split) or score_teacher(
            teacher(), data[split], meta["task_type"], task.pad_id, device, cfg.batch_size, task.bin_width,
            prepared_dir, split=split, threshold=dev_t.get("tuned_threshold"))
    student_scores = {k: v.metrics or None for k, v in student.items()}
    teacher_scores = {k: v.metrics or None for k, v in teacher_scored.items()}

    result = {
        "run": name, "student": record["model"].student, "dataset": run.dataset, "task_type": meta["task_type"],
        "note": record.get("note", ""), "primary_metric": primary_metric(task.kind, meta),
        "dev": student_scores.get("dev"), "test": student_scores.get("test"),
        "params": count_parameters(model),
        "teacher": {"name": run.teacher, "dev": teacher_scores.get("dev"), "test": teacher_scores.get("test"),
                    "params": teacher_params or count_parameters(teacher()),
                    **({"baseline": teacher_record["baseline"]} if teacher_record.get("baseline") else {})},
        "train": {k: record.get(k) for k in ("steps", "best_step", "init", "trainable_params")},
        # how much dev/test share with train, shown beside the scores (prepare's report; absent for one split)
        **({"leakage": leakage} if (leakage := read_meta(prepared_dir).get("leakage")) else {}),
    }
    _write_json(out_path, result, indent=2)
    _write_json(predictions_path, {
        "run": name, "dataset": run.dataset, "task_type": meta["task_type"],
        "student": {k: v.examples for k, v in student.items() if v.examples},
        "teacher": {"name": run.teacher, **{k: v.examples for k, v in teacher_scored.items() if v.examples}}})
    m = result["primary_metric"]
    write_live(live_dir, summary=evaluation_summary(m, student_scores, teacher_scores, result["params"]["total"]),
               params={"run": name, **dataclasses.asdict(run), "splits": list(cfg.splits)})
    log.info("evaluate %s: %s dev %.4f (teacher %.4f) in %.1f s", name, m, (result["dev"] or {}).get(m, float("nan")),
             (result["teacher"]["dev"] or {}).get(m, float("nan")), time.time() - t0)
    return result


def _recorded_teacher(teacher_dir: Path, meta: dict, rec: dict[str, Any]) -> dict[str, Scored]:
    """{split: scores and records} that teacher_finetune recorded on exactly these tokens (``rec``: its metrics.json
    as :func:`_recorded_record` read it), or {} (e.g. an imported teacher, or one fine-tuned on another dataset)."""
    metrics_path, predictions_path = teacher_dir / METRICS_FILE, teacher_dir / PREDICTIONS_FILE
    if not (rec and predictions_path.is_file()):
        return {}
    preds = json.loads(predictions_path.read_text())
    if not rec.get("tokens") == preds.get("tokens") == meta["fingerprint"]:
        return {}
    dev = {k: v for k, v in rec.items()
           if k not in ("task", "tokens", "train_rows", "steps", "test", "params", "baseline")}
    if meta["task_type"] == "qa" and "tuned_threshold" not in dev:
        raise ConfigError(f"{metrics_path} has no 'tuned_threshold': an older distillpipe wrote it, whose SQuAD "
                          "fields had other names; re-run teacher_finetune for this teacher (dvc repro)")
    out = {"dev": Scored(dev, preds.get("dev", []))}
    if rec.get("test"):
        out["test"] = Scored(rec["test"], preds.get("test", []))
    return out


def _recorded_record(teacher_dir: Path, meta: dict) -> dict[str, Any]:
    """What teacher_finetune recorded beside its scores on exactly these tokens (its parameter counts, its check
    against the trivial baseline), or {} (an imported teacher, one fine-tuned on another dataset)."""
    metrics_path = teacher_dir / METRICS_FILE
    if not metrics_path.is_file():
        return {}
    rec = json.loads(metrics_path.read_text())
    return rec if rec.get("tokens") == meta["fingerprint"] else {}


def _write_json(path: str | Path, obj: Any, indent: int | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=indent, sort_keys=True, default=_plain) + "\n")


def _plain(x):
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON-serialisable: {type(x)}")
