"""GLUE tasks from their original TSV files (tab-separated, no quoting: a ``"`` is text).

Columns are looked up by header name where the file has a header. CoLA train/dev have none
(``source, label, original-label, sentence``); every test file has a header and no label
column, so its rows get label -1. Label ids follow the Hugging Face ``nyu-mll/glue`` order, so
local and hub copies of a task agree.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from distillpipe.config.prepare import LocalGlueConfig
from distillpipe.data.features import rows_to_dataset
from distillpipe.data.sources.base import (
    UNLABELED,
    Prepared,
    PrepareError,
    Skips,
    input_path,
    numbered_lines,
    read_text,
    shorten,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GlueTask:
    text_a: str
    """Header name of the first sentence."""
    text_b: str | None
    label: str
    """Header name of the label (absent in test files)."""
    ids: tuple[tuple[str, ...], ...]
    """Alternatives, in order, of header names that identify a row (joined with "-"); the first
    one the file has is used, else ``id``, else the line number."""
    label_names: tuple[str, ...] | None
    """Label names in id order; None for regression (STS-B)."""
    raw_labels: tuple[str, ...] | None = None
    """How labels are written in the file, in id order (default: the names themselves)."""
    headerless: tuple[str, ...] | None = None
    """Column names of a file without a header (CoLA train/dev)."""


BINARY = ("0", "1")
INDEX = (("index",),)
TASKS: dict[str, GlueTask] = {
    "cola": GlueTask("sentence", None, "label", INDEX, ("unacceptable", "acceptable"), BINARY,
                     headerless=("source", "label", "original_label", "sentence")),
    "sst2": GlueTask("sentence", None, "label", INDEX, ("negative", "positive"), BINARY),
    "mrpc": GlueTask("#1 String", "#2 String", "Quality", (("index",), ("#1 ID", "#2 ID")),
                     ("not_equivalent", "equivalent"), BINARY),
    "stsb": GlueTask("sentence1", "sentence2", "score", INDEX, None),
    "qqp": GlueTask("question1", "question2", "is_duplicate", (("id",),), ("not_duplicate", "duplicate"), BINARY),
    "mnli": GlueTask("sentence1", "sentence2", "gold_label", INDEX, ("entailment", "neutral", "contradiction")),
    "qnli": GlueTask("question", "sentence", "label", INDEX, ("entailment", "not_entailment")),
    "rte": GlueTask("sentence1", "sentence2", "label", INDEX, ("entailment", "not_entailment")),
    "wnli": GlueTask("sentence1", "sentence2", "label", INDEX, ("not_entailment", "entailment"), BINARY),
}


def _is_header(fields: list[str], task: GlueTask) -> bool:
    if task.headerless is None:
        return True
    return task.text_a in fields or fields[0] in ("index", "id")


def _id_columns(header: list[str], task: GlueTask) -> list[int]:
    for names in task.ids + (("id",),):
        if all(n in header for n in names):
            return [header.index(n) for n in names]
    return []


def _read_split(path: Path, split: str, task: GlueTask, cfg: LocalGlueConfig, key: str, skips: Skips) -> list[dict]:
    text = read_text(path, cfg.encoding, f"{key}.encoding")
    lines = list(numbered_lines(text))
    if not lines:
        raise PrepareError(f"{path} is empty (from params.yaml `{key}.files.{split}`)")
    first = lines[0][1].split("\t")
    if _is_header(first, task):
        header, body = first, lines[1:]
        stray = _stray_character(lines[0][1], f"`{key}.encoding`")
        if stray:
            raise PrepareError(f"{path}:1: the header line holds {stray}")
        if task.headerless is not None and not split.startswith("test") and task.text_a in header:
            raise PrepareError(
                f"{path}:1: GLUE {cfg.task!r} {split} files have no header line (columns "
                f"{list(task.headerless)}), but this one starts with the header {shorten(header)}: is `{key}.task` "
                "right (SST-2's files, for one, have the header ['sentence', 'label'])?"
            )
    else:
        header, body = list(task.headerless), lines
    missing = [c for c in (task.text_a, task.text_b) if c is not None and c not in header]
    if missing:
        raise PrepareError(
            f"{path}:1: header {shorten(header)} has no column(s) {missing} for GLUE task {cfg.task!r}; "
            f"is `{key}.task` right, is `{key}.encoding` the file's, and is this the original GLUE TSV?"
        )
    col = {name: i for i, name in enumerate(header)}
    # MNLI dev has label1..label5 before gold_label; the score/label is the last column anyway.
    labeled = task.label in col
    if not labeled and not split.startswith("test"):
        # Only GLUE's test files come without labels; a train or dev file without its label column would
        # otherwise become a split of unlabeled rows that nothing can train or select models on.
        raise PrepareError(
            f"{path}:1: no label column {task.label!r} for GLUE task {cfg.task!r} in the header "
            f"{shorten(header)}; a {split} file needs it (only test files come without labels). Is `{key}.task` "
            "right, or was the column renamed?"
        )
    id_cols = _id_columns(header, task)
    rows: list[dict] = []
    if labeled:
        _check_label_set(path, body, len(header), col[task.label], task, cfg.task, key)
    for number, line in tqdm(body, desc=f"{path.name}", unit="row", disable=None, leave=False):
        where = f"{path}:{number}"
        fields = line.split("\t")
        if not any(f.strip() for f in fields):
            skips.add("blank lines")
            continue
        stray = _stray_character(line, f"`{key}.encoding`")
        if stray:
            skips.bad_or_raise(cfg.on_bad_rows, key, "rows with a carriage return or NUL inside", where,
                               f"the line holds {stray}")
            continue
        if len(fields) != len(header):
            skips.bad_or_raise(cfg.on_bad_rows, key, "rows with a wrong number of columns", where,
                               f"{len(fields)} tab-separated columns, expected {len(header)} ({', '.join(header)})")
            continue
        label = _label(fields[col[task.label]], task) if labeled else UNLABELED
        if label is None:
            what = "score" if task.label_names is None else "label"
            expected = "a number" if task.label_names is None else " / ".join(task.raw_labels or task.label_names)
            skips.bad_or_raise(cfg.on_bad_rows, key, f"rows with an unknown {what}", where,
                               f"{what} {fields[col[task.label]]!r} is not {expected}")
            continue
        row_id = "-".join(fields[i] for i in id_cols) if id_cols else str(number)
        row = {"id": row_id, "text_a": fields[col[task.text_a]], "label": label}
        if task.text_b is not None:
            row["text_b"] = fields[col[task.text_b]]
        rows.append(row)
    return rows


def _check_label_set(path: Path, body: list[tuple[int, str]], n_columns: int, label_col: int, task: GlueTask,
                     task_name: str, key: str) -> None:
    """Refuse a file whose labels are not the task's (RTE's ``not_entailment`` read as MNLI), naming both sets.
    A few stray labels are left to ``on_bad_rows``: more than max(2, 1%) of the rows is a wrong task, not noise."""
    values: Counter[str] = Counter()
    for _, line in body:
        fields = line.split("\t")
        if len(fields) == n_columns and not _stray_character(line, ""):  # stray characters: reported row by row
            values[fields[label_col].strip()] += 1
    strangers = {v: n for v, n in values.items() if _label(v, task) is None}
    if sum(strangers.values()) > max(2, 0.01 * sum(values.values())):
        expected = "numbers" if task.label_names is None else sorted(task.raw_labels or task.label_names)
        found = sorted(values) if len(values) <= 20 else f"{len(values):,} distinct values, e.g. {sorted(values)[:10]}"
        raise PrepareError(
            f"{path}: the labels of this file are {shorten(found, 300)}, but GLUE task {task_name!r} has labels "
            f"{expected} ({sum(strangers.values()):,} rows do not fit); is `{key}.task` right, and `{key}.encoding` "
            "the file's?"
        )


def _stray_character(line: str, encoding_key: str) -> str:
    """What in ``line`` no GLUE TSV line holds, and what to do about it ('' when none): a carriage return inside
    the line (a line break of another convention, so the row may really be two, or a stray character) or a NUL
    (binary data, or UTF-16 text read as an 8-bit encoding)."""
    column = line.find("\r")
    if column >= 0:
        return (f"a carriage return (\\r) at column {column + 1}: the file breaks lines with a lone \\r there, or "
                "holds a stray one; lines must end in \\n or \\r\\n (remove it, or break the line there)")
    column = line.find("\0")
    if column >= 0:
        return (f"a NUL character (\\x00) at column {column + 1}: binary data, or UTF-16 text read as an 8-bit "
                f"encoding (set {encoding_key} to the file's, e.g. utf-16)")
    return ""


def _label(raw: str, task: GlueTask) -> int | float | None:
    """The label id (score for regression), or None when it cannot be read."""
    raw = raw.strip()
    if task.label_names is None:
        try:
            score = float(raw)
        except ValueError:
            return None
        return score if math.isfinite(score) else None
    names = task.raw_labels or task.label_names
    return names.index(raw) if raw in names else None



def build_glue(name: str, cfg: LocalGlueConfig) -> Prepared:
    key = f"prepare.local.{name}"
    task = TASKS[cfg.task]
    if not cfg.files:
        raise PrepareError(f"{key}.files is empty; give at least `train: path/to/train.tsv`")
    skips = Skips()
    text_fields = ["text_a"] + (["text_b"] if task.text_b else [])
    task_type = "regression" if task.label_names is None else "classification"
    splits = {}
    for split, file in cfg.files.items():
        path = input_path(Path(cfg.path) / file, f"{key}.files.{split}")
        rows = _read_split(path, split, task, cfg, key, skips)
        if not rows:
            raise PrepareError(f"{path}: no usable rows (skipped: {skips.as_dict()}); check `{key}.files.{split}`")
        splits[split] = rows_to_dataset(rows, task_type, text_fields)
    return Prepared(splits, task_type, list(task.label_names or []), text_fields, skips)
