"""Adding a task of your own to params.yaml in one step (``distillpipe new-task``).

A task touches eight sections: its data source (``prepare.local``), ``tokenize``, its teacher
(``teacher_finetune``, ``teacher_cache``), the student runs on it (``train``/``finetune``), their
``evaluate`` (and ``speed``) entries and a ``report`` table. :func:`add_task` writes all of them, modelled on an
existing dataset of the same kind (``--like polarity``: same lengths, teacher recipe, signals,
students and table layout), so no value comes from code: every number is one params.yaml already
has, and the user edits the copy. The new entries are inserted as text at the end of their blocks,
so the rest of the file (comments, flow maps, ``null``) stays byte for byte; the result is built
with every touched section's config class before anything is written.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from distillpipe.config.base import ConfigError, build
from distillpipe.config.evaluate import EvaluateConfig
from distillpipe.config.finetune import FinetuneConfig
from distillpipe.config.prepare import PrepareConfig
from distillpipe.config.report import ReportConfig
from distillpipe.config.speed import SpeedConfig
from distillpipe.config.teacher_cache import TeacherCacheConfig
from distillpipe.config.teacher_finetune import TeacherFinetuneConfig
from distillpipe.config.tokenize import TokenizeConfig
from distillpipe.config.train import TrainConfig

KIND_OF_FORMAT = {"glue": "classification", "squad": "qa", "text": "mlm", "jsonl": "mlm"}
REGRESSION_TASKS = ("stsb",)
STSB_BIN_WIDTH = 0.2
"""CMOW paper sec. IV-A (after Raffel et al.): STS-B cast to classification over 0.2-wide bins."""
SECTIONS = {"prepare": PrepareConfig, "tokenize": TokenizeConfig, "teacher_finetune": TeacherFinetuneConfig,
            "teacher_cache": TeacherCacheConfig, "train": TrainConfig, "finetune": FinetuneConfig,
            "evaluate": EvaluateConfig, "speed": SpeedConfig, "report": ReportConfig}


def _renamed(run: str, like: str, name: str) -> str:
    return run.replace(like, name) if like in run else f"{run}-{name}"


def plan_task(params: dict, name: str, like: str, local: dict[str, Any],
              lengths: dict[str, int] | None = None) -> list[tuple[str, str | None, Any]]:
    """The entries that add dataset ``name`` (its ``prepare.local`` entry ``local``) modelled on dataset ``like``:
    (dotted path of a mapping or list, key or None for a list item, value). ``lengths`` replaces keys of the copied
    ``tokenize.datasets`` entry (``max_seq_len``; for QA ``doc_stride``, ``max_query_len``). Raises ConfigError."""
    missing = [s for s in SECTIONS if s not in params]
    if missing:
        raise ConfigError(f"params: missing section(s) {missing}")
    tok = params["tokenize"]["datasets"]
    if like not in tok:
        raise ConfigError(f"--like {like}: no dataset {like!r} in tokenize.datasets; known: {sorted(tok)}")
    taken = [f"{where}.{name}" for where, entries in (
        ("prepare.datasets", params["prepare"]["datasets"]), ("prepare.local", params["prepare"].get("local") or {}),
        ("tokenize.datasets", tok), ("teacher_finetune.tasks", params["teacher_finetune"]["tasks"]),
        ("teacher_cache.datasets", params["teacher_cache"]["datasets"])) if name in entries]
    if taken:
        raise ConfigError(f"{name!r} is already in {taken}: choose another name, or edit those entries")
    kind = KIND_OF_FORMAT.get(local.get("format"))
    if kind != tok[like]["kind"]:
        raise ConfigError(f"--like {like} is a {tok[like]['kind']} dataset but format {local.get('format')!r} makes "
                          f"a {kind} dataset: model it on a dataset of the same kind")
    tokenize = copy.deepcopy(tok[like])
    for key, value in (lengths or {}).items():
        if key not in tokenize:
            raise ConfigError(f"--{key.replace('_', '-')}: a {kind} dataset has no tokenize key {key!r}")
        tokenize[key] = value
    plan: list[tuple[str, str | None, Any]] = [("prepare.local", name, local), ("tokenize.datasets", name, tokenize)]
    if like in params["teacher_finetune"]["tasks"]:
        task = copy.deepcopy(params["teacher_finetune"]["tasks"][like])
        regression = local.get("task") in REGRESSION_TASKS
        if regression and not task.get("regression_bin_width"):
            task["regression_bin_width"] = STSB_BIN_WIDTH
        elif not regression:
            task["regression_bin_width"] = None
        plan.append(("teacher_finetune.tasks", name, task))
    if like in params["teacher_cache"]["datasets"]:
        entry = copy.deepcopy(params["teacher_cache"]["datasets"][like])
        if entry.get("teacher") == like:
            entry["teacher"] = name
        plan.append(("teacher_cache.datasets", name, entry))
    runs: dict[str, str] = {}
    for section in ("train", "finetune"):
        existing = params[section]["runs"]
        for run, cfg in existing.items():
            if cfg.get("dataset") != like:
                continue
            new = _renamed(run, like, name)
            if new in existing or new in runs.values():
                raise ConfigError(f"{section}.runs.{new} exists already: rename it or choose another task name")
            plan.append((f"{section}.runs", new, {**copy.deepcopy(cfg), "dataset": name}))
            runs[run] = new
    for run, new in runs.items():
        if run in params["evaluate"]["runs"]:
            entry = {**copy.deepcopy(params["evaluate"]["runs"][run]), "dataset": name}
            if entry.get("teacher") == like:
                entry["teacher"] = name
            plan.append(("evaluate.runs", new, entry))
    for run, new in runs.items():
        if run in params["speed"]["runs"]:
            entry = copy.deepcopy(params["speed"]["runs"][run])
            if entry.get("teacher") == like:
                entry["teacher"] = name
            plan.append(("speed.runs", new, entry))
    names = {**runs, f"teacher:{like}": f"teacher:{name}"}
    for table in params["report"]["tables"]:
        if not any(r in runs for r in table["runs"]):
            continue
        title = table["title"].replace(like, name) if like in table["title"] else f"{table['title']} ({name})"
        pairs = [[names[a], names[b]] for a, b in table["compare"] if a in names and b in names]
        plan.append(("report.tables", None, {**copy.deepcopy(table), "title": title, "paper": None, "compare": pairs,
                                             "runs": [names[r] for r in table["runs"] if r in names]}))
    return plan


def add_task(path: Path, name: str, like: str, local: dict[str, Any], *, lengths: dict[str, int] | None = None,
             write: bool = True) -> list[str]:
    """Add dataset ``name`` to the params file ``path`` (see :func:`plan_task`); return what was added."""
    if not path.is_file():
        raise ConfigError(f"{path}: params file not found (run from the repository root or pass --params)")
    text = path.read_text(encoding="utf-8")
    params = yaml.safe_load(text)
    plan = plan_task(params, name, like, local, lengths)
    for where, key, value in plan:
        text = _insert(text, where.split("."), key, value)
    new = yaml.safe_load(text)
    for section, cls in SECTIONS.items():  # a bad argument fails here, before the file is written
        build(cls, new[section], section, path)
    if write:
        tmp = path.with_name(f".{path.name}.partial")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return [f"{where}.{key}" if key is not None else f"{where}[+] {value['title']!r}" for where, key, value in plan]


def _insert(text: str, keys: list[str], key: str | None, value: Any) -> str:
    """``text`` with ``key: value`` (or a list item ``- value``) added at the end of the block at ``keys``."""
    lines = text.split("\n")
    lo, hi, indent = 0, len(lines), -2
    for k in keys:
        child = indent + 2
        for i in range(lo, hi):
            line = lines[i]
            if line.startswith(" " * child + f"{k}:") and _indent(line) == child:
                break
        else:
            raise ConfigError(f"params: cannot find {'.'.join(keys)} as a block (write it out, one key a line)")
        rest = line.split(":", 1)[1].split("#", 1)[0].strip()
        if rest in ("{}", "[]"):  # an empty flow collection: make it a block
            lines[i] = line.split(":", 1)[0] + ":"
        elif rest:
            raise ConfigError(f"params: {'.'.join(keys)} is written inline; write it as a block to add to it")
        end = i + 1
        while end < hi and (not lines[end].strip() or lines[end].lstrip().startswith("#")
                            or _indent(lines[end]) > child
                            or (_indent(lines[end]) == child and lines[end].lstrip().startswith("- "))):
            end += 1  # a list may sit at its key's indent ("indentless", as PyYAML writes it)
        while end > i + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
            end -= 1  # trailing blank lines and comments belong to what follows
        lo, hi, indent = i + 1, end, child
    body = yaml.safe_dump(value if key is None else {key: value}, sort_keys=False, default_flow_style=None,
                          width=100, allow_unicode=True).rstrip("\n").split("\n")
    if key is None:
        items = [_indent(line) for line in lines[lo:hi] if line.lstrip().startswith("- ")]
        pad = " " * (items[0] if items else indent + 2)
        block = [pad + "- " + body[0]] + [pad + "  " + b for b in body[1:]]
    else:
        block = [" " * (indent + 2) + b for b in body]
    return "\n".join(lines[:hi] + block + lines[hi:])


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))
