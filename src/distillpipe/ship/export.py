"""``distillpipe export <run>``: a trained, evaluated task student into a self-contained folder (ship/bundle.py).

Reads the student (``models/students/<run>``), its tokens' meta.json (labels, max length, QA windowing, the
tokenizer it was made with), the evaluate stage's records (scores, per-example predictions: the card's intervals;
QA: the no-answer threshold tuned on dev), the speed stage's record when there is one, and params.yaml (the run's
params for the card). Writes into ``<out>.partial`` and renames it into place, so an interrupted export leaves no
half folder. Not a DVC stage: exporting is a deployment step on a run you chose (docs/use-your-student.md).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from distillpipe import __version__
from distillpipe.assets import resolve_model
from distillpipe.config.base import load_params, load_section
from distillpipe.config.report import ReportConfig
from distillpipe.data.schema import read_meta
from distillpipe.errors import UserError
from distillpipe.evaluate.size import count_parameters
from distillpipe.ship.bundle import (
    CARD_FILE,
    CONFIG_FILE,
    FORMAT,
    FORMAT_VERSION,
    ONNX_FILE,
    write_config,
    write_tokenizer,
    write_weights,
)
from distillpipe.ship.card import CardInputs, render_card
from distillpipe.ship.card_meta import TEACHER_LICENSE, choose_license, teacher_origin
from distillpipe.ship.onnx import export_onnx, head_type, refusal
from distillpipe.ship.quantize import QUANTIZE_KINDS, quantize_student
from distillpipe.ship.remote_code import config_entries, limits, write_code
from distillpipe.students import load_student

log = logging.getLogger(__name__)


class ExportError(UserError, ValueError):
    """A run that cannot be exported as asked (not a task student, not evaluated, records that do not fit)."""


@dataclass
class ExportSummary:
    run: str
    out: Path
    files: dict[str, int]
    """File name -> bytes."""
    onnx: dict[str, Any] | None
    seconds: float
    quantized: dict[str, Any] | None = None

    def one_line(self) -> str:
        size = sum(self.files.values())
        extra = f", ONNX parity {self.onnx['parity_max_difference']:.1e}" if self.onnx else ""
        if self.quantized:
            worst = min(c["agreement"] for c in self.quantized["checks"])
            extra += (f", int8 {self.quantized['bytes'] / 1e6:.1f} MB ({self.quantized['runtime']}), agreement "
                      f"{worst:.1%}")
        return (f"export {self.run}: {self.out} ({len(self.files)} files, {size / 1e6:.1f} MB{extra}) in "
                f"{self.seconds:.1f} s")


def pipeline_commit(root: Path) -> str:
    """``<sha>`` of the checkout at ``root``, ``<sha> (with uncommitted changes)``, or why it is unknown."""
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"unknown ({root} is not a git checkout)"
    return f"`{sha}`" + (" (with uncommitted changes)" if dirty else "")


def _json(path: Path, what: str, fix: str) -> dict[str, Any]:
    if not path.is_file():
        raise ExportError(f"{path} not found: the {what}; {fix}")
    return json.loads(path.read_text())


def export_run(run: str, *, out_dir: Path, student_dir: Path, tokens_dir: Path, metrics_path: Path,
               predictions_path: Path, speed_path: Path, params_path: Path, tokenizer_dir: Path | None = None,
               onnx: bool = False, root: Path = Path("."), license: str = TEACHER_LICENSE, quantize: str = "none",
               prepared_dir: Path | None = None) -> ExportSummary:
    """``license``: the card's license (a Hub license id), or ``teacher``: the base teacher's (ship/card_meta.py).
    ``quantize="dynamic"``: also an int8 student (ship/quantize.py), checked against the float one on the tokens'
    dev and test splits; for a student that exports to ONNX it implies ``onnx`` (the int8 graph is made from the
    float graph). ``prepared_dir``: the prepared dataset, whose examples QA scoring reads [data/prepared/<dataset>
    beside the tokens]."""
    t0 = time.perf_counter()
    if quantize not in QUANTIZE_KINDS:
        raise ExportError(f"--quantize {quantize!r}: one of {', '.join(QUANTIZE_KINDS)}")
    model, record = load_student(student_dir, torch.device("cpu"))
    cfg, task = record.pop("model"), record.pop("task")
    if record.get("name") != run:
        raise ExportError(f"{student_dir} holds the run {record.get('name')!r}, not {run!r}: check --student")
    if task.kind == "mlm":
        raise ExportError(f"{run} is a general-distilled {cfg.student} (trained on the corpus {record['dataset']}): "
                          "export a task student, i.e. a finetune run initialised from it (finetune.runs)")
    if quantize != "none" and refusal(cfg.student, head_type(task)) is None:
        onnx = True  # the int8 graph is quantized from the float graph, and the card times one beside the other
    if onnx and (reason := refusal(cfg.student, head_type(task))):
        raise ExportError(f"cannot export {run} to ONNX: {reason}. Export it without --onnx (and predict with the "
                          "PyTorch runtime); docs/use-your-student.md lists what exports")
    meta = read_meta(tokens_dir)
    if meta.get("name") != record["dataset"] or meta["tokenizer"]["sha256"] != record["tokenizer_sha256"]:
        raise ExportError(f"{tokens_dir} holds the tokens of {meta.get('name')!r} (or another tokenizer's), but {run} "
                          f"was trained on {record['dataset']!r}: point --tokens at data/tokens/{record['dataset']}")
    redo = f"run `dvc repro evaluate@{run}` (or `distillpipe evaluate --run {run} ...`) first"
    metrics = _json(metrics_path, "evaluate stage's scores of the run", redo)
    predictions = _json(predictions_path, "evaluate stage's per-example predictions", redo)
    if metrics.get("run") != run or predictions.get("run") != run:
        raise ExportError(f"{metrics_path} / {predictions_path} are the records of {metrics.get('run')!r} / "
                          f"{predictions.get('run')!r}, not {run!r}")
    if (metrics.get("params") or {}).get("total") != count_parameters(model)["total"]:
        raise ExportError(f"{metrics_path} counts {metrics['params']['total']:,} parameters but {student_dir} has "
                          f"{count_parameters(model)['total']:,}: the scores are not of this student; {redo}")
    speed = json.loads(speed_path.read_text()) if speed_path.is_file() else None
    params = load_params(params_path)
    origin = teacher_origin(params)
    card_license, license_source = choose_license(license, origin)  # before writing anything: it may refuse
    bootstrap = load_section(params_path, "report", ReportConfig).bootstrap
    qa = None
    if task.kind == "qa":
        threshold = (metrics.get("dev") or {}).get("tuned_threshold")  # the threshold evaluate applied to test
        if threshold is None:
            raise ExportError(f"{metrics_path} has no dev no-answer threshold (QA needs it); {redo} with dev in "
                              "evaluate.splits")
        qa = {"doc_stride": int(meta["params"]["doc_stride"]), "max_query_len": int(meta["params"]["max_query_len"]),
              "threshold": float(threshold)}
    tok_dir = Path(tokenizer_dir) if tokenizer_dir is not None else resolve_model(meta["tokenizer"]["spec"])

    out_dir = Path(out_dir)
    if out_dir.exists() and not (out_dir / CONFIG_FILE).is_file():
        raise ExportError(f"{out_dir} exists and is not an exported student: choose another --out, or remove it")
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        config = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "distillpipe_version": __version__,
            "run": run, "dataset": record["dataset"], "student": cfg.student,
            "model": dataclasses.asdict(cfg), "task": dataclasses.asdict(task),
            "task_type": meta["task_type"],
            "text_pair": task.encoding == "diffcat" or bool(((meta.get("summary") or {}).get("counts") or {})
                                                            .get("pair")),
            "label_names": meta.get("label_names"), "max_length": task.max_seq_len, "qa": qa,
            "tokenizer": {**{k: meta["tokenizer"][k] for k in ("sha256", "vocab_size", "pad_id", "cls_id", "sep_id",
                                                                "mask_id")},
                          "files": write_tokenizer(tmp, tok_dir, meta["tokenizer"]["sha256"])},
            "weights": write_weights(tmp, model),
            "onnx": export_onnx(model, cfg.student, task, tmp / ONNX_FILE) if onnx else None,
        }
        if quantize != "none":
            config["quantized"] = _quantize(model, task, tmp, config, record, meta, metrics, predictions,
                                            tokens_dir, prepared_dir, bootstrap)
        config |= config_entries(config)  # transformers' keys (AutoConfig, the Auto classes, pipelines)
        config["transformers"] = {"files": write_code(tmp, config), "limits": limits(config)}
        write_config(tmp, config)
        card = CardInputs(run=run, config=config, record=record, metrics=metrics, predictions=predictions,
                          speed=speed, params=params, tokens_meta=meta, commit=pipeline_commit(root),
                          bootstrap=bootstrap, folder=out_dir.name, license=card_license,
                          license_source=license_source, origin=origin)
        (tmp / CARD_FILE).write_text(render_card(card))
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir())}
    return ExportSummary(run, out_dir, files, config["onnx"], time.perf_counter() - t0, config.get("quantized"))


def _quantize(model, task, folder: Path, config: dict[str, Any], record: dict[str, Any], meta: dict[str, Any],
              metrics: dict[str, Any], predictions: dict[str, Any], tokens_dir: Path, prepared_dir: Path | None,
              bootstrap) -> dict[str, Any]:
    """The int8 student, scored on the splits evaluate scored (ship/quantize.py)."""
    from datasets import load_from_disk

    data = load_from_disk(str(tokens_dir))
    splits = {s: data[s] for s in ("dev", "test") if s in data and (predictions.get("student") or {}).get(s)}
    if not splits:
        raise ExportError(f"{tokens_dir} has no dev or test split that evaluate scored: the int8 student cannot be "
                          "checked against the float one")
    if task.kind == "qa" and prepared_dir is None:
        prepared_dir = Path(tokens_dir).parent.parent / "prepared" / record["dataset"]
    threshold = config["qa"]["threshold"] if config.get("qa") else None
    return quantize_student(model, task, folder=folder, onnx_config=config["onnx"], splits=splits,
                            metric=metrics["primary_metric"], task_type=meta["task_type"], prepared_dir=prepared_dir,
                            threshold=threshold, bootstrap=bootstrap)
