"""Adding a task of your own to params.yaml in one step (``distillpipe new-task``).

A task touches eight sections: its data source (``prepare.local``), ``tokenize``, its teacher
(``teacher_finetune``, ``teacher_cache``), the student runs on it (``train``/``finetune``), their
``evaluate`` (and ``speed``) entries and a ``report`` table. :func:`add_task` writes all of them, modelled on an
existing dataset of the same kind (``--like polarity``: same lengths, signals, students and table layout), with
the schedules of the papers' recipes (:mod:`distillpipe.train.recipes`: the embedded ones are CPU-minute toys),
and the user edits the copy. The new entries are inserted as text at the end of their blocks,
so the rest of the file (comments, flow maps, ``null``) stays byte for byte; the result is built
with every touched section's config class before anything is written.

Only runs whose student reads the new data are copied: runs initialised from a ``train_lm`` language model (the
ELMo heads) need the word-vector and biLM stages and are left out unless asked for (``elmo=True``). Copied report
tables get a caption of the new task, not the embedded one. With a ``budget`` the recipes are fitted to the new
data on this machine (:func:`size_task`, :mod:`distillpipe.train.sizing`): each training stage gets its whole
recipe or what fits the budget, whichever is less.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
import yaml

from distillpipe.assets import load_tokenizer, resolve_model
from distillpipe.checkpoints import measure_write_bandwidth
from distillpipe.config.base import ConfigError, build
from distillpipe.config.evaluate import EvaluateConfig
from distillpipe.config.finetune import FinetuneConfig
from distillpipe.config.prepare import PrepareConfig
from distillpipe.config.report import ReportConfig
from distillpipe.config.run import teacher_is_live
from distillpipe.config.speed import SpeedConfig
from distillpipe.config.teacher_cache import TeacherCacheConfig
from distillpipe.config.teacher_finetune import TeacherFinetuneConfig
from distillpipe.config.teacher_import import TeacherImportConfig
from distillpipe.config.tokenize import TokenizeConfig
from distillpipe.config.train import TrainConfig
from distillpipe.config.train_lm import TrainLMConfig
from distillpipe.data.sources import build_source
from distillpipe.errors import UserError
from distillpipe.runtime import resolve_device
from distillpipe.students.base import TaskSpec
from distillpipe.teacher.arch import check_signals, config_signals
from distillpipe.train.recipes import student_recipe, teacher_recipe
from distillpipe.train.sizing import (
    Rates,
    measure_student,
    measure_teacher,
    size_checkpoints,
    size_student,
    size_teacher,
)

KIND_OF_FORMAT = {"glue": "classification", "squad": "qa", "text": "mlm", "jsonl": "mlm"}
REGRESSION_TASKS = ("stsb",)
STSB_BIN_WIDTH = 0.2
"""CMOW paper sec. IV-A (after Raffel et al.): STS-B cast to classification over 0.2-wide bins."""
SECTIONS = {"prepare": PrepareConfig, "tokenize": TokenizeConfig, "teacher_import": TeacherImportConfig,
            "teacher_finetune": TeacherFinetuneConfig,
            "teacher_cache": TeacherCacheConfig, "train": TrainConfig, "finetune": FinetuneConfig,
            "evaluate": EvaluateConfig, "speed": SpeedConfig, "report": ReportConfig}


def _renamed(run: str, like: str, name: str) -> str:
    return run.replace(like, name) if like in run else f"{run}-{name}"


def plan_task(params: dict, name: str, like: str, local: dict[str, Any],
              lengths: dict[str, int] | None = None, elmo: bool = False) -> list[tuple[str, str | None, Any]]:
    """The entries that add dataset ``name`` (its ``prepare.local`` entry ``local``) modelled on dataset ``like``:
    (dotted path of a mapping or list, key or None for a list item, value). ``lengths`` replaces keys of the copied
    ``tokenize.datasets`` entry (``max_seq_len``; for QA ``doc_stride``, ``max_query_len``); ``elmo`` copies the runs
    initialised from a ``train_lm`` language model too. Raises ConfigError."""
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
        task.update(teacher_recipe("qa" if kind == "qa" else "regression" if regression else "classification", task))
        plan.append(("teacher_finetune.tasks", name, task))
    if like in params["teacher_cache"]["datasets"]:
        entry = copy.deepcopy(params["teacher_cache"]["datasets"][like])
        if entry.get("teacher") == like:
            entry["teacher"] = name
        plan.append(("teacher_cache.datasets", name, entry))
    runs: dict[str, str] = {}
    language_models = set((params.get("train_lm") or {}).get("runs") or {})
    for section in ("train", "finetune"):
        existing = params[section]["runs"]
        for run, cfg in existing.items():
            if cfg.get("dataset") != like or (cfg.get("init") in language_models and not elmo):
                continue
            new = _renamed(run, like, name)
            if new in existing or new in runs.values():
                raise ConfigError(f"{section}.runs.{new} exists already: rename it or choose another task name")
            value = {**copy.deepcopy(cfg), "dataset": name}
            if "teacher" in value:  # its cache, or (a live run) the teacher its teacher_cache entry names
                teachers = dict((k, v) for where, k, v in plan if where == "teacher_cache.datasets")
                live = teacher_is_live(value["teacher"]) and name in teachers
                value["teacher"] = f"models/teacher/{teachers[name]['teacher']}" if live else \
                    f"data/teacher/{name}.zarr"
            student = (value.get("model") or {}).get("student") or value.get("student")
            value["optim"].update(student_recipe(section, student, value.get("tune"))[0])
            plan.append((f"{section}.runs", new, value))
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
        copied = [names[r] for r in table["runs"] if r in names]
        caption = (f"{name} ({local.get('format')} files in {local.get('path')}): {', '.join(copied)}, copied by "
                   f"`distillpipe new-task` from the table \"{table['title']}\" of {like}. Describe your task here.")
        plan.append(("report.tables", None, {**copy.deepcopy(table), "title": title, "caption": caption,
                                             "paper": None, "compare": pairs, "runs": copied}))
    return plan


def add_task(path: Path, name: str, like: str, local: dict[str, Any], *, lengths: dict[str, int] | None = None,
             write: bool = True, elmo: bool = False, budget_minutes: float | None = None,
             report: list[str] | None = None) -> list[str]:
    """Add dataset ``name`` to the params file ``path`` (see :func:`plan_task`); return what was added. With
    ``budget_minutes`` the copied schedules are sized first (:func:`size_task`), and what it chose and why is
    appended to ``report`` (lines to print)."""
    if not path.is_file():
        raise ConfigError(f"{path}: params file not found (run from the repository root or pass --params)")
    original = path.read_text(encoding="utf-8")
    params = yaml.safe_load(original)
    plan = plan_task(params, name, like, local, lengths, elmo)
    text = _with(original, plan)
    built = _built(text, path)  # a bad argument fails here, before the file is written
    _check_signals(built, name, path.parent)
    if budget_minutes:
        lines = size_task(plan, built, params, name, budget_minutes * 60, root=path.parent)
        text = _with(original, plan)
        _built(text, path)
        if report is not None:
            report += lines
    if write:
        tmp = path.with_name(f".{path.name}.partial")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return [f"{where}.{key}" if key is not None else f"{where}[+] {value['title']!r}" for where, key, value in plan]


def _built(text: str, path: Path) -> dict[str, Any]:
    new = yaml.safe_load(text)
    return {section: build(cls, new[section], section, path) for section, cls in SECTIONS.items()}


def _with(text: str, plan: list[tuple[str, str | None, Any]]) -> str:
    for where, key, value in plan:
        text = _insert(text, where.split("."), key, value)
    return text


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:,.1f} min" if seconds < 5400 else f"{seconds / 3600:,.1f} h"


def _data_shape(name: str, built: dict) -> dict[str, Any]:
    """Rows per split of the new dataset (read and carved now, as prepare will) and its mean row length in tokens
    (the tokenizer on up to 2,000 train rows; QA: windows per question too)."""
    prepared = build_source(name, built["prepare"].dataset(name))
    tok_cfg = built["tokenize"]
    tok, _ = load_tokenizer(tok_cfg.tokenizer)
    seq_len = tok_cfg.seq_len(name)
    train = prepared.splits["train"]
    sample = train.select(range(0, len(train), max(1, len(train) // 2000)))
    if prepared.task_type == "qa":
        stride = tok_cfg.datasets[name].doc_stride
        lengths = [len(tok(q, c)["input_ids"]) for q, c in zip(sample["question"][:], sample["context"][:])]
        windows = sum(1 + max(0, math.ceil((n - seq_len) / stride)) for n in lengths) / len(lengths)
    else:
        b = sample["text_b"][:] if "text_b" in sample.column_names else [None] * len(sample)
        lengths = [len(tok(a, b_)["input_ids"]) for a, b_ in zip(sample["text_a"][:], b)]
        windows = 1.0
    labels = prepared.label_names
    return {"rows": {s: len(d) for s, d in prepared.splits.items()}, "windows": windows, "tokenizer": tok,
            "mean_len": max(2, round(sum(min(n, seq_len) for n in lengths) / len(lengths))), "seq_len": seq_len,
            "task_type": prepared.task_type, "num_labels": len(labels) if labels else 0,
            "max_label": max(train["label"][:]) if prepared.task_type == "regression" else None}


def size_task(plan: list[tuple[str, str | None, Any]], built: dict, params: dict, name: str, budget_s: float,
              root: Path = Path(".")) -> list[str]:
    """Size the copied schedules in ``plan`` (edited in place) to ``budget_s`` seconds a training stage, from the new
    data's shape and rates measured now (:mod:`distillpipe.train.sizing`); returns the lines that say what was
    chosen and what it is expected to take. The data's paths are read relative to the working directory (the
    repository root, as for the stages); ``root`` is where ``models/teacher/base`` is looked for."""
    shape = _data_shape(name, built)
    device = resolve_device("auto")
    rows = shape["rows"]
    train_rows = math.ceil(rows["train"] * shape["windows"])
    dev_rows = math.ceil(rows.get("dev", 0) * shape["windows"])
    L = shape["mean_len"]
    kind = "qa" if shape["task_type"] == "qa" else "classification"
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    lines = [f"sized to --budget {budget_s / 60:g} min a training stage, with rates measured now on {device.type} "
             f"(torch {torch.get_num_threads()} threads{load}), random batches of {L} tokens (the mean of {name}'s "
             "rows, tokenizer on a sample):",
             "  data: " + " / ".join(f"{s} {n:,}" for s, n in rows.items()) + " rows"
             + (f" ({shape['windows']:.2f} windows a question)" if kind == "qa" else "")]
    entries = {(where, key): value for where, key, value in plan}
    total = 0.0

    @functools.cache
    def bandwidth() -> float:  # of the disk the checkpoints go to (checkpoints/ in the repository), measured once
        return measure_write_bandwidth(root)
    teacher_rates: Rates | None = None
    task = entries.get(("teacher_finetune.tasks", name))
    if task is not None:
        num_labels = shape["num_labels"] or (round(shape["max_label"] / task["regression_bin_width"]) + 1
                                             if shape["max_label"] is not None else 0)
        try:
            base = _teacher_base(built, root)
            teacher_rates = measure_teacher(base, kind, max(num_labels, 1), task["batch_size"], L, device)
        except (OSError, ValueError, UserError) as e:
            lines.append(f"  teacher_finetune.tasks.{name}: copied as it is, not measured: {e}")
        if teacher_rates is not None:
            sized = _sized(size_teacher, task, train_rows, dev_rows, teacher_rates, budget_s)
            grid = ", ".join(f"{r:g}" for r in task.get("lr_grid") or ())
            recipe = (f"{task['epochs']} epochs of all {train_rows:,} rows (at least BERT's epochs) at the copied lr "
                      f"{task['lr']:g}" + (f" and BERT's {grid}, the best on dev kept" if grid else "")
                      + f", batch {task['batch_size']}")
            task.update(sized.changes)
            total += sized.seconds
            lines.append(_line(f"teacher_finetune.tasks.{name}", sized, teacher_rates, "step", recipe))
            lines.append(size_checkpoints(task, teacher_rates, sized.seconds, bandwidth()))
            if sized.changes:
                lines.append(f"    the budget keeps the teacher short of its recipe ({sized.note}): expect a weaker "
                             "teacher, and weaker students, than the recipe's; "
                             f"--budget {math.ceil(sized.copied_seconds / 60 * 1.1)} would fit the recipe. "
                             "teacher_finetune warns when its dev score is not clearly above the trivial baseline")
    student_rows = []
    measured: dict[str, Rates] = {}  # runs of one network and batch (hybrid-x, hybrid-x-hard) are measured once
    train_cfg, finetune_cfg = built["train"], built["finetune"]
    lm = build(TrainLMConfig, params["train_lm"], "train_lm") if "train_lm" in params else None
    for (where, key), value in entries.items():
        if where not in ("train.runs", "finetune.runs"):
            continue
        if where == "train.runs":
            run_cfg = train_cfg.runs[key]
            model_cfg, tune = run_cfg.model, "full"
        else:
            run_cfg = finetune_cfg.runs[key]
            init = run_cfg.init
            model_cfg = (train_cfg.runs[init].model if init in train_cfg.runs else
                         lm.runs[init].model if lm is not None and init in lm.runs else None)
            tune = run_cfg.tune
        if model_cfg is None:
            lines.append(f"  {where}.{key}: copied as it is (its init {run_cfg.init!r} is not a train run here)")
            continue
        labels = shape["num_labels"] or (round(shape["max_label"] / STSB_BIN_WIDTH) + 1 if shape["max_label"] else 0)
        spec = TaskSpec(kind=kind, vocab_size=len(shape["tokenizer"]), max_seq_len=shape["seq_len"],
                        pad_id=shape["tokenizer"].pad_token_id, num_labels=labels if kind != "qa" else 0,
                        encoding=run_cfg.encoding, head=run_cfg.head)
        key_ = repr((model_cfg, spec, tune, value["optim"]["batch_size"]))
        if key_ not in measured:
            measured[key_] = measure_student(model_cfg, spec, tune, value["optim"]["batch_size"], L, device)
        rates = measured[key_]
        optim = value["optim"]
        recipe = (f"{optim['epochs']} epochs" + (f", patience {optim['patience']}" if optim["patience"] else "")
                  + f" ({student_recipe(where.split('.')[0], model_cfg.student, tune)[1]})")
        sized = _sized(size_student, value["optim"], train_rows, dev_rows, rates, budget_s)
        value["optim"].update(sized.changes)
        total += sized.seconds
        optim = value["optim"]
        steps = optim["max_steps"] or optim["epochs"] * math.ceil(train_rows / optim["batch_size"])
        student_rows.append(min(train_rows, steps * optim["batch_size"]))
        lines.append(_line(f"{where}.{key}", sized, rates, "step", recipe))
        lines.append(size_checkpoints(value["optim"], rates, sized.seconds, bandwidth()))
    cache = entries.get(("teacher_cache.datasets", name))
    if cache is not None and student_rows:
        read, why = min(max(student_rows), train_rows), "the most rows a student run reads"
        if teacher_rates is not None and read / teacher_rates.forward_rows_per_s() > budget_s:
            read, why = int(budget_s * teacher_rates.forward_rows_per_s()), "the budget's; students repeat them"
        cache["max_rows"] = None if read >= train_rows else read
        if teacher_rates is not None:
            seconds = read / teacher_rates.forward_rows_per_s()
            total += seconds
            lines.append(f"  teacher_cache.datasets.{name}: max_rows {cache['max_rows']} ({why}; of {train_rows:,}); "
                         f"~{_minutes(seconds)} at the teacher's forward rate (logits; more signals cost more)")
        else:
            lines.append(f"  teacher_cache.datasets.{name}: max_rows {cache['max_rows']} ({why}; of {train_rows:,})")
    lines.append(f"  expected: ~{_minutes(total)} for these stages one after another on this machine (+ prepare, "
                 "tokenize, evaluate; shared stages such as a student's init run once). Measured on random "
                 "batches: data loading and cached-signal losses are not in it, take it as +-50%.")
    return lines


def _line(key: str, sized, rates: Rates, unit: str, recipe: str) -> str:
    chose = ", ".join(f"{k} {v}" for k, v in sized.changes.items()) or "the whole recipe"
    return (f"  {key}: recipe {recipe}; chose {chose}: {sized.note}; ~{_minutes(sized.seconds)} (the recipe: "
            f"~{_minutes(sized.copied_seconds)}); {rates.step_s:.3f} s a {unit} of {rates.batch_size}, "
            f"{rates.forward_rows_per_s():,.0f} rows/s forward")


def _sized(fn, *args):
    try:
        return fn(*args)
    except ValueError as e:
        raise ConfigError(f"--budget: {e}; give more minutes") from None


def _check_signals(built: dict, name: str, root: Path) -> None:
    """Refuse the new dataset's teacher_cache signals when the base teacher's architecture cannot give them
    (:mod:`distillpipe.teacher.arch`), before anything is written or fine-tuned. A hub teacher not imported yet is
    checked by teacher_import instead (its config is not downloaded for this)."""
    entry = built["teacher_cache"].datasets.get(name)
    if entry is None:
        return
    try:
        base = _teacher_base(built, root)
    except ConfigError:
        return
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    check_signals(config, config_signals(entry.signals), f"teacher_cache.datasets.{name}")


def _teacher_base(built: dict, root: Path) -> Path:
    """The base teacher teacher_finetune starts from: models/teacher/base once imported, else its embedded or local
    spec (a hub name is not downloaded for a measurement: teacher_import does that)."""
    imported = root / "models" / "teacher" / "base"
    if (imported / "config.json").is_file():
        return imported
    spec = built["teacher_import"].models["base"]
    if not (spec.startswith("embedded:") or Path(spec).exists()):
        raise ConfigError(f"the base teacher {spec!r} is a hub model not imported yet (`dvc repro teacher_import` "
                          "imports it; then new-task can measure it)")
    return resolve_model(spec)


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
