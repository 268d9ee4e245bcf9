"""``export --quantize dynamic``: an int8 copy of the student for CPUs, checked against the float student.

Students that export to ONNX get ``model.int8.onnx``: ``model.onnx`` through ONNX Runtime's dynamic quantization
(``onnxruntime.quantization.quantize_dynamic``: weights of MatMul/Gemm/Gather int8, per tensor; activations
quantized on the fly). The others (ELMo, the ``bilstm`` head) get ``model.int8.pt``: the state dict of
``torch.ao.quantization.quantize_dynamic`` over the ``nn.Linear`` layers (int8 weights; torch's dynamic LSTM has no
output projections, so ELMo's LSTMs stay float), which :func:`load_torch_int8` rebuilds.

Export scores the int8 model on the dev and test splits with the evaluate stage's own code
(:func:`distillpipe.evaluate.student.score_student`) beside the float student run the same way, on the CPU, and
:func:`judge` refuses it (:class:`QuantizeError`, naming the change) when on any split

* more than :data:`MAX_DISAGREEMENT` of the examples (and more than one) get another prediction than the float
  student's: another argmax label; a regression score more than half a bin away; a QA question another EM or F1;
* or the int8 primary score is lower and the paired test (:func:`distillpipe.evaluate.intervals.paired`: McNemar
  for accuracy, the paired bootstrap otherwise, as the report tests) finds the drop significant at :data:`ALPHA`.

docs/use-your-student.md says why these numbers.
"""

from __future__ import annotations

import copy
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from distillpipe.errors import UserError
from distillpipe.evaluate import intervals
from distillpipe.evaluate.speed import measure_throughput, random_batch
from distillpipe.evaluate.student import score_student
from distillpipe.identity import sha256_file
from distillpipe.ship.runners import OnnxRunner, TorchRunner
from distillpipe.students.base import TaskSpec

log = logging.getLogger(__name__)

QUANTIZE_KINDS = ("none", "dynamic")
INT8_ONNX_FILE = "model.int8.onnx"
INT8_TORCH_FILE = "model.int8.pt"
MAX_DISAGREEMENT = 0.02
"""Largest share of a split's examples whose int8 prediction may differ from the float student's (at least one
example is always allowed: on a 20-example split one flip is 5%)."""
ALPHA = 0.05
"""Significance level of the paired test: an int8 score significantly below the float one is refused."""
SPEED_LEN = 64


class QuantizeError(UserError, ValueError):
    """An int8 student that cannot be made, or whose predictions differ from the float student's beyond tolerance."""


# ------------------------------------------------------------------------------------------------ making it


def quantize_onnx_graph(float_path: Path, int8_path: Path) -> None:
    """``float_path`` (an fp32 ONNX graph) -> ``int8_path``, by ONNX Runtime's dynamic quantization."""
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        raise QuantizeError(f"--quantize dynamic needs onnxruntime: pip install -e '.[onnx]' ({e})") from None
    logging.disable(logging.WARNING)  # "consider pre-processing", on the root logger, for every graph
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(str(float_path), str(int8_path), weight_type=QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)


def quantize_torch(model: nn.Module) -> nn.Module:
    """The student with every ``nn.Linear`` dynamically quantized to int8 weights (a new module, on the CPU)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao (not installed)
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).cpu().eval(), {nn.Linear},
                                                      dtype=torch.qint8)


def load_torch_int8(float_model: nn.Module, path: Path) -> nn.Module:
    """The int8 module saved by export: ``float_model`` (freshly built from config.json) quantized the same way,
    with the saved int8 state loaded into it."""
    q = quantize_torch(float_model)
    q.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return q.eval()


def int8_file(folder: Path, config: Mapping[str, Any]) -> Path:
    """The folder's int8 file, checked against the sha256 in its config.json."""
    q = config["quantized"]
    path = Path(folder) / q["file"]
    if not path.is_file() or sha256_file(path) != q["sha256"]:
        raise QuantizeError(f"{path} is missing or does not match the sha256 in config.json: export the student "
                            "again with --quantize dynamic")
    return path


class RunnerModule(nn.Module):
    """An ONNX Runtime session with a student's calling convention (a collated batch in, outputs by attribute
    out), so that the evaluate stage's scoring code runs it unchanged."""

    def __init__(self, runner: OnnxRunner):
        super().__init__()
        self.runner = runner

    def forward(self, batch: dict[str, torch.Tensor]) -> SimpleNamespace:
        out = self.runner({k: v.cpu() for k, v in batch.items()})
        return SimpleNamespace(**{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()})


# ------------------------------------------------------------------------------------------------ judging it


def agree(task_type: str, a: Mapping[str, Any], b: Mapping[str, Any], bin_width: float | None) -> bool:
    """Do two per-example records (evaluate/scoring.py) hold the same prediction?"""
    if task_type == "qa":
        return a["em"] == b["em"] and math.isclose(a["f1"], b["f1"], abs_tol=1e-9)
    if task_type == "regression":
        return abs(float(a["pred"]) - float(b["pred"])) <= (bin_width or 0.0) / 2
    return a["pred"] == b["pred"]


@dataclass(frozen=True)
class SplitCheck:
    split: str
    n: int
    agreement: float
    """Share of examples with the same prediction."""
    float_score: float
    int8_score: float
    difference: intervals.Interval
    """int8 - float, with its bootstrap interval (the metric's units)."""
    test: str
    p_value: float
    problems: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"split": self.split, "examples": self.n, "agreement": self.agreement, "float": self.float_score,
                "int8": self.int8_score, "difference": self.difference.value,
                "difference_interval": [self.difference.low, self.difference.high], "test": self.test,
                "p_value": self.p_value}


def judge(metric: str, task_type: str, float_records: Mapping[str, Sequence[Mapping[str, Any]]],
          int8_records: Mapping[str, Sequence[Mapping[str, Any]]], *, bin_width: float | None,
          n_resamples: int, confidence: float, seed: int) -> list[SplitCheck]:
    """Compare the int8 student's per-example records with the float student's, split by split (see the module
    docstring); each check lists the problems that make the int8 student out of tolerance (none: accepted)."""
    checks = []
    for split, fl in float_records.items():
        q = intervals.align(fl, int8_records[split], f"int8 vs float, {split}")
        n = len(fl)
        same = sum(agree(task_type, a, b, bin_width) for a, b in zip(fl, q))
        res = intervals.paired(metric, task_type, q, fl, n_resamples=n_resamples, confidence=confidence, seed=seed,
                               key=f"int8-float/{split}/{metric}")
        fs, qs = intervals.point(metric, task_type, fl), intervals.point(metric, task_type, q)
        problems = []
        differ = n - same
        if differ > max(1, MAX_DISAGREEMENT * n):
            problems.append(f"{split}: {differ} of {n} predictions ({differ / n:.1%}) differ from the float "
                            f"student's (at most {MAX_DISAGREEMENT:.0%} may)")
        if qs < fs and res.p_value < ALPHA:
            problems.append(f"{split}: {metric} falls from {fs:.4g} to {qs:.4g} ({res.test} p = {res.p_value:.2g} "
                            f"< {ALPHA})")
        checks.append(SplitCheck(split, n, same / n, fs, qs, res.difference, res.test, res.p_value, tuple(problems)))
    return checks


# ------------------------------------------------------------------------------------------------ export's step


def _rate(forward, task: TaskSpec, pairs: bool, batch_size: int) -> float:
    length = min(SPEED_LEN, task.max_seq_len)

    def make():
        return random_batch(batch_size, length, task.vocab_size, pad_id=task.pad_id, device=torch.device("cpu"),
                            seed=0, pairs=pairs)

    n = 20 if batch_size == 1 else 2
    return measure_throughput(forward, make, n_sequences_per_batch=batch_size, warmup=2, repeats=3,
                              batches_per_repeat=n, device="cpu").sentences_per_s


def quantize_student(model: nn.Module, task: TaskSpec, *, folder: Path, onnx_config: Mapping[str, Any] | None,
                     splits: Mapping[str, Any], metric: str, task_type: str, prepared_dir: Path | None,
                     threshold: float | None, bootstrap: Any, batch_size: int = 32) -> dict[str, Any]:
    """Write the int8 student into ``folder`` (``model.int8.onnx`` beside ``model.onnx`` when ``onnx_config`` is
    given, else ``model.int8.pt``), score it on ``splits`` (name -> tokens rows) beside the float student, time
    both, and return config.json's ``quantized`` entry; raises :class:`QuantizeError` (the files removed) when it is
    out of tolerance."""
    pairs = task.encoding == "diffcat"
    outputs = ["start_logits", "end_logits"] if task.kind == "qa" else ["logits"]
    float_path = folder / onnx_config["file"] if onnx_config else folder / "model.safetensors"
    if onnx_config:
        path = folder / INT8_ONNX_FILE
        quantize_onnx_graph(folder / onnx_config["file"], path)
        threads = torch.get_num_threads()
        float_run = OnnxRunner(folder / onnx_config["file"], onnx_config, torch.device("cpu"), threads)
        int8_run = OnnxRunner(path, onnx_config, torch.device("cpu"), threads)
        int8_model: nn.Module = RunnerModule(int8_run)
        runtime = "ONNX Runtime"
    else:
        path = folder / INT8_TORCH_FILE
        int8_model = quantize_torch(model)
        torch.save(int8_model.state_dict(), path)
        float_run = TorchRunner(model, torch.device("cpu"), outputs)
        int8_run = TorchRunner(int8_model, torch.device("cpu"), outputs)
        runtime = "PyTorch"
    try:
        kw = {"kind": task.kind, "pad_id": task.pad_id, "device": torch.device("cpu"), "batch_size": batch_size,
              "pairs": pairs, "prepared_dir": prepared_dir, "threshold": threshold, "bin_width": task.bin_width}
        fl = {s: score_student(model, rows, split=s, **kw) for s, rows in splits.items()}
        q = {s: score_student(int8_model, rows, split=s, **kw) for s, rows in splits.items()}
        checks = judge(metric, task_type, {s: v.examples for s, v in fl.items()},
                       {s: v.examples for s, v in q.items()}, bin_width=task.bin_width,
                       n_resamples=bootstrap.n_resamples, confidence=bootstrap.confidence, seed=bootstrap.seed)
        problems = [p for c in checks for p in c.problems]
        if problems:
            raise QuantizeError("the int8 student is out of tolerance, not written: " + "; ".join(problems)
                                + ". Export without --quantize (the float student is unaffected), or see "
                                "docs/use-your-student.md (int8) for what the check allows")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    speed = {str(b): {"float": _rate(float_run, task, pairs, b), "int8": _rate(int8_run, task, pairs, b)}
             for b in (1, 32)}
    entry = {"kind": "dynamic", "file": path.name, "sha256": sha256_file(path), "runtime": runtime,
             "bytes": path.stat().st_size, "float_bytes": float_path.stat().st_size,
             "metric": metric, "checks": [c.as_dict() for c in checks],
             "tolerance": {"max_disagreement": MAX_DISAGREEMENT, "alpha": ALPHA},
             "speed": {"seq_len": min(SPEED_LEN, task.max_seq_len), "threads": torch.get_num_threads(),
                       "sentences_per_s": speed}}
    log.info("int8 student (%s): %.1f MB (float %.1f MB), agreement %s", runtime, entry["bytes"] / 1e6,
             entry["float_bytes"] / 1e6, ", ".join(f"{c.split} {c.agreement:.1%}" for c in checks))
    return entry


# ------------------------------------------------------------------------------------------------ the card


def card_lines(config: Mapping[str, Any], folder: str) -> list[str]:
    """The card's int8 section (nothing when the folder has no int8 student)."""
    q = config.get("quantized")
    if not q:
        return []
    task_type = config["task_type"]

    def pct(v: float) -> float:
        return v if task_type == "qa" else 100.0 * v

    onnx = q["runtime"] == "ONNX Runtime"
    what = ("ONNX Runtime's dynamic quantization of `model.onnx` (int8 weights of its MatMul, Gemm and Gather "
            "nodes, activations quantized per batch as it runs)" if onnx else
            "torch's dynamic quantization of the student's `nn.Linear` layers (int8 weights; the rest stays float)")
    s = q["speed"]
    lines = ["## int8", "",
             f"`{q['file']}` ({q['bytes'] / 1e6:.1f} MB; the float {'graph' if onnx else 'weights'} "
             f"{q['float_bytes'] / 1e6:.1f} MB): {what}.", "",
             f"Speed measured at export ({q['runtime']}, {s['threads']} thread(s), random batches of {s['seq_len']} "
             "tokens, sentences/s on the exporting machine):", "",
             "| batch | float | int8 | int8 / float |", "|---:|---:|---:|---:|"]
    for b, r in s["sentences_per_s"].items():
        lines.append(f"| {b} | {r['float']:,.0f} | {r['int8']:,.0f} | {r['int8'] / r['float']:.2f}x |")
    lines += ["", f"Scores (`{q['metric']}`, %) of the int8 student beside the float student, both run on the CPU by "
              "the evaluate stage's code, with the report's paired test of int8 - float:", "",
              "| split | examples | float | int8 | int8 - float [95% CI] | test | p | same prediction |",
              "|---|---:|---:|---:|---|---|---:|---:|"]
    for c in q["checks"]:
        lo, hi = c["difference_interval"]
        ci = f"[{pct(lo):+.1f}, {pct(hi):+.1f}]" if math.isfinite(lo) and math.isfinite(hi) else ""
        p = c["p_value"]
        lines.append(f"| {c['split']} | {c['examples']:,} | {pct(c['float']):.1f} | {pct(c['int8']):.1f} | "
                     f"{pct(c['difference']):+.1f} {ci} | {c['test']} | "
                     f"{'<0.001' if p < 0.001 else f'{p:.3f}'} | {c['agreement']:.1%} |")
    t = q["tolerance"]
    lines += ["", f"Export checked it: on every split at most {t['max_disagreement']:.0%} of the predictions (one "
              f"is always allowed) may differ from the float student's, and a drop of `{q['metric']}` must not be "
              f"significant at {t['alpha']}.", "", "```bash",
              f"distillpipe predict {folder} --input rows.tsv --runtime {'onnx' if onnx else 'torch'}-int8", "```", ""]
    return lines
