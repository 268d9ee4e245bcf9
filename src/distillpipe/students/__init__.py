"""Student architectures: the registry, and saving/loading trained students.

``STUDENTS`` maps the ``student`` key of a model config (params.yaml) to (config class, model class).
A saved student is a folder with ``model.pt`` (the state dict) and ``student.json`` (model config,
task spec and a record of how it was trained), enough to rebuild it without params.yaml.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from distillpipe.config.base import build
from distillpipe.config.students import CMOWHybridConfig, ElmoConfig, HeadConfig, MiniALBERTConfig, WaLDORfConfig
from distillpipe.students.base import StudentOutput, TaskSpec
from distillpipe.students.cmow_hybrid import CMOWHybrid
from distillpipe.students.elmo import Elmo
from distillpipe.students.minialbert import MiniALBERT
from distillpipe.students.waldorf import WaLDORf

STUDENTS: dict[str, tuple[type, type[torch.nn.Module]]] = {
    "cmow_hybrid": (CMOWHybridConfig, CMOWHybrid),
    "waldorf": (WaLDORfConfig, WaLDORf),
    "minialbert": (MiniALBERTConfig, MiniALBERT),
    "elmo": (ElmoConfig, Elmo),
}

WEIGHTS_FILE = "model.pt"
RECORD_FILE = "student.json"

__all__ = ["STUDENTS", "StudentOutput", "TaskSpec", "build_student", "load_student", "save_student",
           "student_from_record"]


def build_student(cfg: Any, task: TaskSpec) -> torch.nn.Module:
    if cfg.student not in STUDENTS:
        raise ValueError(f"unknown student {cfg.student!r}; known: {sorted(STUDENTS)}")
    _, cls = STUDENTS[cfg.student]
    return cls(cfg, task)


def save_student(out_dir: str | Path, model: torch.nn.Module, cfg: Any, task: TaskSpec, record: dict) -> None:
    """Write the student atomically (a folder renamed into place)."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    torch.save(state, tmp / WEIGHTS_FILE)
    meta = {"model": dataclasses.asdict(cfg), "task": dataclasses.asdict(task), "record": record}
    (tmp / RECORD_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)


def student_from_record(meta: dict, where: str | Path) -> tuple[torch.nn.Module, Any, TaskSpec]:
    """(a freshly built model, its config, its task) from a record holding ``model`` (the config as a dict) and
    ``task`` (the TaskSpec as a dict), as :func:`save_student` writes them; ``where`` names the record in errors."""
    key = meta["model"].get("student")
    if key not in STUDENTS:
        raise ValueError(f"{where}: unknown student {key!r}; known: {sorted(STUDENTS)}")
    cfg = build(STUDENTS[key][0], meta["model"], "model", where)
    t = dict(meta["task"])
    t["head"] = build(HeadConfig, t["head"], "task.head", where) if t["head"] is not None else None
    task = TaskSpec(**t)
    return build_student(cfg, task), cfg, task


def load_student(folder: str | Path, device: torch.device) -> tuple[torch.nn.Module, dict]:
    """(model in eval mode on ``device``, its record) from a folder written by :func:`save_student`."""
    folder = Path(folder)
    path = folder / RECORD_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {folder} is not a trained student (run `dvc repro train`)")
    meta = json.loads(path.read_text())
    model, cfg, task = student_from_record(meta, path)
    model.load_state_dict(torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True))
    model.to(device).eval()
    return model, {**meta["record"], "model": cfg, "task": task}
