"""The ``speed`` stage: sentences/s of a trained student and of its teacher, measured back to back in one
process under the CMOW paper's Table V protocol (random batches of 256 x 64 tokens, no grad, warm-up,
median of repeats; the harness is :mod:`distillpipe.evaluate.speed`).

Timings differ at every run, so they are a separate output (``metrics/speed/<run>.json``), never part of
``evaluate``'s scores: re-scoring a student gives byte-identical metrics, and DVC re-runs this stage only
when the student, the teacher or the protocol changes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from distillpipe.config.base import ConfigError
from distillpipe.config.speed import SpeedConfig
from distillpipe.evaluate.speed import measure_throughput, random_batch
from distillpipe.runtime import autocast, resolve_device
from distillpipe.students import load_student
from distillpipe.teacher.load import load_teacher

log = logging.getLogger(__name__)


def time_run(name: str, cfg: SpeedConfig, *, student_dir: str | Path, teacher_dir: str | Path,
             out_path: str | Path) -> dict[str, Any]:
    """Time the student in ``student_dir`` and the teacher in ``teacher_dir``; write and return the record."""
    if name not in cfg.runs:
        raise ConfigError(f"speed.runs has no {name!r}; known: {sorted(cfg.runs)}")
    device = resolve_device(cfg.device)
    model, record = load_student(student_dir, device, student=cfg.runs[name].student,
                                 where=f"speed.runs.{name}.student")
    task = record["task"]
    teacher, _ = load_teacher(teacher_dir, "qa" if task.kind == "qa" else "classification", device)
    pairs = task.encoding == "diffcat"

    def make_batch(pairs_: bool) -> dict[str, torch.Tensor]:
        return random_batch(cfg.batch_size, cfg.seq_len, task.vocab_size, pad_id=task.pad_id, device=device, seed=0,
                            pairs=pairs_)

    def student_forward(batch):
        with autocast(device):
            return model(batch)

    def teacher_forward(batch):
        with autocast(device):
            return teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long(),
                           token_type_ids=batch["token_type_ids"])

    timing = {"n_sequences_per_batch": cfg.batch_size, "warmup": cfg.warmup, "repeats": cfg.repeats,
              "batches_per_repeat": cfg.batches_per_repeat, "device": device}
    s = measure_throughput(student_forward, lambda: make_batch(pairs), **timing)
    t = measure_throughput(teacher_forward, lambda: make_batch(False), **timing)
    result = {
        "run": name, "device": device.type, "batch_size": cfg.batch_size, "seq_len": cfg.seq_len,
        "student_sentences_per_s": s.sentences_per_s, "teacher_sentences_per_s": t.sentences_per_s,
        "speedup": s.sentences_per_s / t.sentences_per_s if t.sentences_per_s else float("nan"),
        "student": s.to_dict(), "teacher": t.to_dict(),
    }
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    log.info("speed %s: %.0f vs %.0f sentences/s (%.1fx)", name, s.sentences_per_s, t.sentences_per_s,
             result["speedup"])
    return result
