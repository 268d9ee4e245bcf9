"""What every source shares: the error type, the result type, skip counting, seeded splitting and reading input
files with errors that name the file, line and params key (the rows' schemas: :mod:`distillpipe.data.features`)."""

from __future__ import annotations

import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence, TypeVar

from datasets import Dataset

from distillpipe.config.prepare import SplitFractions
from distillpipe.errors import UserError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class PrepareError(UserError, ValueError):
    """An input of the ``prepare`` stage is missing or malformed; the message says where and how to fix it."""


UNLABELED = -1


class Skips:
    """Counts skipped items by reason (a plural noun phrase: ``"short paragraphs"``) and logs them.

    ``bad`` is for malformed input: each of the first few occurrences of a reason is logged with
    its location, so a user can go and look. ``add`` is for expected filtering (short paragraphs).
    """

    LOGGED_PER_REASON = 5

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, reason: str, n: int = 1) -> None:
        if n:
            self.counts[reason] += n

    def bad(self, reason: str, where: str, detail: str) -> None:
        self.counts[reason] += 1
        if self.counts[reason] <= self.LOGGED_PER_REASON:
            logger.warning("skipped (%s) %s: %s", reason, where, detail)
        elif self.counts[reason] == self.LOGGED_PER_REASON + 1:
            logger.warning("more %s skipped; the total is in the summary", reason)

    def bad_or_raise(self, on_bad_rows: str, key: str, reason: str, where: str, detail: str, unit: str = "row") -> None:
        """``on_bad_rows: error`` raises naming the place and the fix; ``skip`` counts and logs it."""
        if on_bad_rows == "error":
            raise PrepareError(
                f"{where}: {detail}. Fix the {unit}, or set `{key}.on_bad_rows: skip` in params.yaml "
                f"to skip such {unit}s (they are counted in the summary)."
            )
        self.bad(reason, where, detail)

    def update(self, other: "Skips") -> None:
        self.counts.update(other.counts)

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self.counts.items()) if v}


@dataclass
class Prepared:
    """What a source produces: one ``Dataset`` per split plus what ``meta.json`` says about them."""

    splits: dict[str, Dataset]
    task_type: str
    label_names: list[str]
    text_fields: list[str]
    skips: Skips = field(default_factory=Skips)
    provenance: dict[str, Any] = field(default_factory=dict)
    """Where the rows came from beyond the params (the hub commit a branch resolved to), for meta.json."""

    @property
    def num_labels(self) -> int:
        """Classes for classification, 1 for regression, 0 for corpus and QA."""
        if self.task_type == "classification":
            return len(self.label_names)
        return 1 if self.task_type == "regression" else 0


# --------------------------------------------------------------------------------------------
# seeded splits
# --------------------------------------------------------------------------------------------


def split_names(fractions: SplitFractions) -> list[str]:
    return ["train", "dev"] + (["test"] if fractions.test > 0 else [])


def split_counts(n: int, fractions: SplitFractions) -> dict[str, int]:
    """How many of ``n`` units go to each split: rounded, at least one for a positive fraction,
    and train keeps at least one."""
    counts = {"dev": round(n * fractions.dev), "test": round(n * fractions.test)}
    for name in ("dev", "test"):
        if getattr(fractions, name) > 0 and counts[name] == 0:
            counts[name] = 1
    counts["train"] = n - counts["dev"] - counts["test"]
    return counts


def split_units(units: Sequence[T], fractions: SplitFractions, seed: int, what: str, key: str) -> dict[str, list[T]]:
    """Assign units (articles, sentences) to train/dev[/test] by a seeded shuffle.

    Each split keeps the units in their original order, so a document's rows stay together and
    the output reads like the input. Raises when a split would be empty.
    """
    counts = split_counts(len(units), fractions)
    names = split_names(fractions)
    if counts["train"] < 1 or any(counts[s] < 1 for s in names):
        raise PrepareError(
            f"{key}: {len(units)} {what} cannot be split into {names} with dev={fractions.dev}, "
            f"test={fractions.test}: a split would be empty. Lower the fractions in params.yaml "
            "or use more input."
        )
    order = list(range(len(units)))
    random.Random(seed).shuffle(order)
    bounds = {"dev": (0, counts["dev"]), "test": (counts["dev"], counts["dev"] + counts["test"])}
    assigned: dict[int, str] = {}
    for name, (lo, hi) in bounds.items():
        for i in order[lo:hi]:
            assigned[i] = name
    out: dict[str, list[T]] = {name: [] for name in names}
    for i, unit in enumerate(units):
        out[assigned.get(i, "train")].append(unit)
    return out


def stratified_split(labels: Sequence[int], fractions: SplitFractions, seed: int, key: str) -> dict[str, list[int]]:
    """Indices per split, drawn per label so each split has the label mix of the whole.

    Within a split the order is a seeded shuffle, so the first rows of a split are not all one class.
    """
    rng = random.Random(seed)
    names = split_names(fractions)
    out: dict[str, list[int]] = {name: [] for name in names}
    for label in sorted(set(labels)):
        idx = [i for i, y in enumerate(labels) if y == label]
        rng.shuffle(idx)
        counts = split_counts(len(idx), fractions)
        lo = 0
        for name in ("dev", "test"):
            if name in out:
                out[name].extend(idx[lo : lo + counts[name]])
                lo += counts[name]
        out["train"].extend(idx[lo:])
    for name in names:
        if not out[name]:
            raise PrepareError(
                f"{key}: split {name!r} would be empty with dev={fractions.dev}, test={fractions.test} "
                f"and {len(labels)} rows; lower the fractions in params.yaml"
            )
        rng.shuffle(out[name])
    return out


# --------------------------------------------------------------------------------------------
# input files
# --------------------------------------------------------------------------------------------


def input_path(path: str | Path, key: str) -> Path:
    """``path`` as a Path, or a PrepareError naming the params key when it is not a file."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory, not a file" if p.is_dir() else "does not exist"
        raise PrepareError(
            f"{p} {what} (from params.yaml `{key}`). Put the file there, or change `{key}` to the "
            "file's name in the dataset's `path` folder."
        )
    return p


def shorten(value: object, limit: int = 160) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for error messages that quote file content (a file
    decoded with the wrong codec can be one 100 KB 'line')."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def read_text(path: Path, encoding: str, key: str) -> str:
    """Decode a whole file; a decoding error names the file, line, column and byte, and the
    ``encoding`` key to change. A leading BOM is removed."""
    try:
        data = path.read_bytes()
    except OSError as e:  # a permission, a broken disk: the traceback would tell the user nothing more
        raise PrepareError(f"{path}: cannot read it ({e.strerror or e}); check the file (from params.yaml "
                           f"`{key.rsplit('.', 1)[0]}`)") from None
    try:
        text = data.decode(encoding)
    except LookupError:
        raise PrepareError(f"{key}: unknown encoding {encoding!r}; "
                           "use a Python codec name such as utf-8 or cp1252") from None
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        byte = data[e.start : e.start + 1]
        raise PrepareError(
            f"{path}:{line}: cannot decode byte 0x{byte.hex()} (column {column}) as {encoding} ({e.reason}). "
            f"The file is in another encoding: set `{key}` in params.yaml to it (e.g. `encoding: cp1252` "
            "for Windows-1252 text)."
        ) from None
    return text.removeprefix("\ufeff")


def numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its end-of-line) for every line of ``text``."""
    # Split on "\n" only (not str.splitlines, which also breaks at \x0c, \u2028...), so the numbers
    # match what an editor shows and what read_text reports.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        yield number, line.removesuffix("\r")
