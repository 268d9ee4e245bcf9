"""Student architectures: the registry, and saving/loading trained students.

``STUDENTS`` maps the ``student`` key of a model config (params.yaml) to (config class, name of the model
class). An architecture is one module, named by its key (``students/<key>.py``), and is imported only when a
student of it is built (:func:`student_class`): a stage that trains or loads a WaLDORf imports
``students/waldorf.py`` and no other architecture, so its DVC deps (``src/distillpipe/students/${...}.py``,
interpolated from the run's item) and its checkpoints' code identity (``identity.stage_code(student=...)``)
hold its own architecture's code only, and an edit to one architecture re-runs that architecture's stages only.
What the architectures share (``base.py``, ``heads.py``, the config classes) is imported by each of them.

A saved student is a folder with ``model.pt`` (the state dict) and ``student.json`` (model config,
task spec and a record of how it was trained), enough to rebuild it without params.yaml.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from distillpipe.config.base import ConfigError, build
from distillpipe.config.students import CMOWHybridConfig, ElmoConfig, HeadConfig, MiniALBERTConfig, WaLDORfConfig
from distillpipe.errors import DiskFull, disk_full_cause, free_space
from distillpipe.students.base import StudentOutput, TaskSpec

STUDENTS: dict[str, tuple[type, str]] = {
    "cmow_hybrid": (CMOWHybridConfig, "CMOWHybrid"),
    "waldorf": (WaLDORfConfig, "WaLDORf"),
    "minialbert": (MiniALBERTConfig, "MiniALBERT"),
    "elmo": (ElmoConfig, "Elmo"),
}
"""key -> (config class, name of the model class in ``students/<key>.py``)."""

WEIGHTS_FILE = "model.pt"
RECORD_FILE = "student.json"

__all__ = ["STUDENTS", "StudentOutput", "TaskSpec", "build_student", "load_student", "save_student",
           "student_class", "student_from_record"]


def student_class(key: str) -> type[torch.nn.Module]:
    """The model class of architecture ``key``, importing its module (``students/<key>.py``) now and no other."""
    if key not in STUDENTS:
        raise ValueError(f"unknown student {key!r}; known: {sorted(STUDENTS)}")
    module = importlib.import_module(f"{__name__}.{key}")
    return getattr(module, STUDENTS[key][1])


def build_student(cfg: Any, task: TaskSpec) -> torch.nn.Module:
    return student_class(cfg.student)(cfg, task)


def save_student(out_dir: str | Path, model: torch.nn.Module, cfg: Any, task: TaskSpec, record: dict) -> None:
    """Write the student atomically (a folder renamed into place). A full disk raises
    :class:`~distillpipe.errors.DiskFull` naming the file, the space its weights need and the space free, and leaves
    no folder that looks written (the partial one is removed; a previous student at ``out_dir`` stays as it was)."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    try:
        tmp.mkdir(parents=True)
        with open(tmp / WEIGHTS_FILE, "wb") as f:  # a file object: torch.save to a path hides a full disk's errno
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        meta = {"model": dataclasses.asdict(cfg), "task": dataclasses.asdict(task), "record": record}
        (tmp / RECORD_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if disk_full_cause(e) is None:
            raise
        need = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in state.values()}.values())
        where, free = free_space(out_dir)
        raise DiskFull(f"no space left on device writing the student {out_dir / WEIGHTS_FILE}: its weights need "
                       f"~{need / 1e6:,.1f} MB and {free / 1e6:,.1f} MB is free on {where}. Free that much there (or "
                       "point --out at a larger disk), then run the stage again: it resumes from its newest "
                       "checkpoint, kept until the student is written") from e
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


def load_student(folder: str | Path, device: torch.device, *, student: str | None = None,
                 where: str = "student") -> tuple[torch.nn.Module, dict]:
    """(model in eval mode on ``device``, its record) from a folder written by :func:`save_student`.

    ``student``: the architecture the caller's params say the folder holds (``<where>``, e.g.
    ``evaluate.runs.<run>.student``), checked against the record before any architecture is imported: the
    stage's DVC deps hold that architecture's file only, so it must not run another's code."""
    folder = Path(folder)
    path = folder / RECORD_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {folder} is not a trained student (run `dvc repro train`)")
    meta = json.loads(path.read_text())
    held = meta["model"].get("student")
    if student is not None and held != student:
        raise ConfigError(f"{where} is {student!r} but {folder} holds a {held!r} student: set {where}: {held}")
    model, cfg, task = student_from_record(meta, path)
    model.load_state_dict(torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True))
    model.to(device).eval()
    return model, {**meta["record"], "model": cfg, "task": task}
