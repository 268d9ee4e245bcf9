"""The ``prepare`` stage: build one dataset from its source and write it, atomically, as a
``DatasetDict`` folder plus ``meta.json`` (the contract in :mod:`distillpipe.data.schema`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from datasets import DatasetDict

from distillpipe.config.prepare import WIKI_DERIVED, AnyDatasetConfig, ArticleSplitConfig
from distillpipe.data import schema
from distillpipe.data.overlap import LEAK_MAX_CHARS, leakage_report, leakage_warnings, text_columns
from distillpipe.data.sources import PrepareError, build_source

logger = logging.getLogger(__name__)

__all__ = ["PrepareError", "PrepareSummary", "prepare_dataset"]


@dataclass(frozen=True)
class PrepareSummary:
    name: str
    rows: dict[str, int]
    """Rows per split, in split order."""
    skipped: dict[str, int]
    """Items left out, by reason (``"short paragraphs": 41``)."""
    seconds: float
    leakage: dict | None = None
    """The leakage report of meta.json (None: one split only)."""

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    def one_line(self) -> str:
        splits = " / ".join(f"{s} {n:,}" for s, n in self.rows.items())
        skipped = ", ".join(f"{n:,} {reason}" for reason, n in self.skipped.items()) or "nothing"
        return f"prepare {self.name}: {self.total_rows:,} rows ({splits}), skipped {skipped}, {self.seconds:.1f} s"

    def overlap_line(self) -> str | None:
        """The leakage report in one line (``train -> dev: 0 equal / 0 inside / 2 near of 199``), or None."""
        if not self.leakage:
            return None
        if "skipped" in self.leakage:
            return f"  overlap between splits: not measured ({self.leakage['skipped']})"
        parts = [f"{p['splits'][0]} -> {p['splits'][1]}: {p['exact']:,} equal / {p['inside']:,} inside / "
                 f"{p['ngram']:,} near of {p['rows']:,}" for p in self.leakage["pairs"]]
        return "  rows overlapping an earlier split: " + "; ".join(parts)


def prepare_dataset(name: str, cfg: AnyDatasetConfig, out_dir: Path,
                    wiki_articles: ArticleSplitConfig | None = None) -> PrepareSummary:
    """Build dataset ``name`` from ``cfg`` and write it to ``out_dir`` (replacing what is there).

    The folder is written next to ``out_dir`` first and renamed at the end, so a killed run
    leaves either the previous output or none, never half of one. ``meta.json`` holds no
    timings, so the same inputs give byte-identical output (DVC then skips downstream stages).
    """
    start = time.perf_counter()
    out_dir = Path(out_dir)
    prepared = build_source(name, cfg, wiki_articles)
    for split, ds in prepared.splits.items():
        if len(ds) == 0:
            raise PrepareError(f"prepare: dataset {name}: split {split!r} is empty; check its source and fractions")
    if prepared.task_type != "corpus" and "dev" in prepared.splits and not any(
            s.startswith("test") for s in prepared.splits):
        raise PrepareError(
            f"prepare: dataset {name} has a dev split but no test split: dev selects the model (early stopping, the "
            "QA no-answer threshold), so it cannot also be the score the report shows. Carve dev from train and keep "
            "the official dev file as test: `files: {train: train.tsv, test: dev.tsv}` and "
            "`carve: {dev: 0.1, test: 0.0, seed: 0}` (hub: `splits: {train: train, test: validation}`)")
    rows = {split: len(ds) for split, ds in prepared.splits.items()}
    skipped = prepared.skips.as_dict()
    leakage = _leakage(name, prepared) if len(prepared.splits) > 1 else None
    meta = {
        "name": name,
        "task_type": prepared.task_type,
        "num_labels": prepared.num_labels,
        "label_names": prepared.label_names,
        "text_fields": prepared.text_fields,
        # not the folder of local files: moving the data elsewhere must not change the output
        "source": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "path"},
        **({"wiki_articles": dataclasses.asdict(wiki_articles)} if isinstance(cfg, WIKI_DERIVED) else {}),
        **({"provenance": prepared.provenance} if prepared.provenance else {}),
        "summary": {"rows": rows, "skipped": skipped},
        **({"leakage": leakage} if leakage else {}),
    }
    assert prepared.task_type in schema.TASK_TYPES, prepared.task_type
    _write_atomically(DatasetDict(prepared.splits), meta, out_dir)
    summary = PrepareSummary(name, rows, skipped, time.perf_counter() - start, leakage)
    logger.debug(summary.one_line())  # the CLI prints it
    return summary


def _leakage(name: str, prepared) -> dict:
    """The leakage report of the splits (:func:`distillpipe.data.overlap.leakage_report`), each warning logged."""
    columns = {split: text_columns(ds, prepared.task_type) for split, ds in prepared.splits.items()}
    chars = sum(len(t or "") for cols in columns.values() for col in cols for t in col)
    if chars > LEAK_MAX_CHARS:
        return {"skipped": f"{chars:,} characters, more than the {LEAK_MAX_CHARS:,} the overlap index takes"}
    report = leakage_report(columns)
    for warning in leakage_warnings(report):
        logger.warning("prepare %s: %s", name, warning)
    return report


def _write_atomically(dd: DatasetDict, meta: dict, out_dir: Path) -> None:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.with_name(f".{out_dir.name}.partial")
    old = out_dir.with_name(f".{out_dir.name}.old")
    _remove(partial)  # left by a killed run
    _remove(old)
    dd.save_to_disk(str(partial))
    schema.write_meta(partial, meta)
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(partial, out_dir)
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
