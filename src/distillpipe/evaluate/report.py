"""The results report: ``reports/results.md`` and a speed-vs-quality PNG, from per-run metrics dicts.

Input: one metrics dict per run, as the ``evaluate`` stage writes them (one JSON per run), with the
``speed`` stage's timings of the run under ``"speed"`` and its per-example records under
``"predictions"`` (evaluate's ``predictions/<run>.json``; None: the run is shown without intervals)::

    {"run", "student", "dataset", "task_type", "note", "primary_metric",
     "dev": {metric: value}, "test": {metric: value} | None,
     "params": {"total", "without_embeddings"},
     "speed": {"device", "batch_size", "seq_len", "student_sentences_per_s",
               "teacher_sentences_per_s", "speedup"} | None,
     "teacher": {"name", "dev", "test" | None, "params"} | None,
     "train": {"steps", "best_step", "init", "trainable_params"} (optional),
     "predictions": {"student": {split: [record]}, "teacher": {"name", split: [record]}} | None}

and a list of :class:`TableSpec` (paper-style tables naming runs in order, with the paper's numbers and
the pairs of rows to compare).

Output, all deterministic (no timestamps, seeded resampling; the same inputs give the same bytes):

1. a main table: one row per teacher (once per dataset and teacher name) then one per run of that
   dataset, datasets in order of first appearance; every dev/test score with its bootstrap interval;
2. one table per :class:`TableSpec` (a run it names that is absent is reported as "not run"), followed
   by its paired comparisons: difference, interval and test (:mod:`distillpipe.evaluate.intervals`);
3. the PNG (:mod:`distillpipe.evaluate.plot`).

Numbers: metrics are shown as percentages with one decimal, as the papers do. Classification and
regression metrics arrive as fractions (:mod:`distillpipe.evaluate.metrics`) and are multiplied by 100;
QA metrics (``task_type == "qa"``) arrive already in percent (``squad_v2_scores``) and are not.
Parameters in millions with two decimals; sentences/s rounded to integers; speed-ups with one decimal.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distillpipe.config.report import BootstrapConfig
from distillpipe.evaluate import intervals
from distillpipe.evaluate.plot import TEACHER_PREFIX, plot_speed_quality

log = logging.getLogger(__name__)

NA = "n/a"
NOT_RUN = "not run"
SPLITS = ("dev", "test")
REQUIRED_KEYS = (
    "run",
    "student",
    "dataset",
    "task_type",
    "note",
    "primary_metric",
    "dev",
    "test",
    "params",
    "speed",
    "teacher",
)
__all__ = ["TEACHER_PREFIX", "Bootstrap", "TableSpec", "load_results", "render_results", "write_report"]


@dataclass(frozen=True)
class TableSpec:
    """A paper-style table of selected runs."""

    title: str
    runs: list[str]
    """Run names in row order; ``teacher:<dataset>`` for a teacher row."""
    paper: dict[str, str] | None
    """The paper's number per run name, shown verbatim in a "Paper" column; None = no such column."""
    caption: str
    metric: str | None
    """Metric key shown in the Dev/Test columns (e.g. ``exact`` for WaLDORf's EM); None = each run's
    primary metric."""
    compare: list[tuple[str, str]] = field(default_factory=list)
    """Pairs ``(a, b)`` of rows of this table: ``a - b`` on the same examples, with interval and test."""


Bootstrap = BootstrapConfig
"""How intervals are drawn (the report section's ``bootstrap``)."""


@dataclass(frozen=True)
class _Row:
    """One model line: a run, or a teacher of a dataset."""

    run: str
    dataset: str
    model: str
    note: str
    task_type: str
    primary_metric: str
    dev: Mapping[str, float] | None
    test: Mapping[str, float] | None
    params: Mapping[str, int] | None
    sentences_per_s: float | None
    speedup: float | None
    device: str
    records: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    """Per-example records by split (those the report can draw intervals from)."""
    trainable: int | None = None
    """Parameters the run trained (``tune: adapters`` / ``head`` train fewer than ``params``); None: not recorded."""

    def scores(self, split: str) -> Mapping[str, float] | None:
        return self.dev if split == "dev" else self.test


# ------------------------------------------------------------------------------------------------
# formatting
# ------------------------------------------------------------------------------------------------


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _percent(value: float, task_type: str) -> float:
    return value if task_type == "qa" else 100.0 * value


def format_metric(value: Any, task_type: str) -> str:
    """A metric as a percentage with one decimal (x100 unless QA, whose metrics are in % already)."""
    if not _finite(value):
        return NA
    return f"{_percent(value, task_type):.1f}"


def _metric_value(metrics: Mapping[str, float] | None, key: str, task_type: str) -> float | None:
    if not metrics or not _finite(metrics.get(key)):
        return None
    return _percent(float(metrics[key]), task_type)


def _plot_score(row: _Row) -> tuple[float, str] | None:
    """The plot's y value: the primary metric on test, or on dev where the run has no test score."""
    for split in ("test", "dev"):
        value = _metric_value(row.scores(split), row.primary_metric, row.task_type)
        if value is not None:
            return value, split
    return None


def _millions(n: Any) -> str:
    return f"{n / 1e6:.2f}" if _finite(n) else NA


def _rate(x: float | None) -> str:
    return f"{x:,.0f}" if _finite(x) else NA


def _speedup(x: float | None) -> str:
    return f"{x:.1f}x" if _finite(x) else NA


def _p_value(p: float) -> str:
    if not _finite(p):
        return NA
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _cell(text: str) -> str:
    return str(text).replace("\n", " ").replace("|", "\\|")


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


# ------------------------------------------------------------------------------------------------
# scores with intervals
# ------------------------------------------------------------------------------------------------


class _Scorer:
    """Formats scores with their intervals and paired comparisons, checking each against its records."""

    def __init__(self, boot: Bootstrap):
        self.boot = boot

    def _records(self, row: _Row, split: str, metric: str) -> Sequence[Mapping[str, Any]] | None:
        recorded = (row.scores(split) or {}).get(metric)
        records = row.records.get(split)
        if not records or not _finite(recorded):
            return None
        try:
            value = intervals.point(metric, row.task_type, records)
        except intervals.RecordsError:
            return None  # a score the records cannot give (e.g. an MLM corpus's): shown without interval
        if not math.isclose(value, float(recorded), rel_tol=1e-6, abs_tol=1e-9):
            raise intervals.RecordsError(
                f"{row.run} {split}: the predictions give {metric} {value:.6g} but the metrics say {recorded:.6g}; "
                "re-run the run's evaluate stage (the two files come from different evaluations)")
        return records

    def cell(self, row: _Row, split: str, metric: str) -> str:
        """``71.0 [66.2, 75.4]``: the score and its interval (the score alone when there are no records)."""
        scores = row.scores(split)
        if not scores:
            return NA
        text = format_metric(scores.get(metric), row.task_type)
        records = self._records(row, split, metric)
        if records is None or len(records) < 2:
            return text
        ci = intervals.interval(metric, row.task_type, records, n_resamples=self.boot.n_resamples,
                                confidence=self.boot.confidence, seed=self.boot.seed,
                                key=f"{row.run}/{split}/{metric}")
        if not (_finite(ci.low) and _finite(ci.high)):
            return text
        return f"{text} [{_percent(ci.low, row.task_type):.1f}, {_percent(ci.high, row.task_type):.1f}]"

    def comparison(self, a: _Row, b: _Row, split: str, metric: str) -> list[str] | None:
        """One line of a comparison table, or None when either row lacks the split's records."""
        if a.task_type != b.task_type or a.dataset != b.dataset:
            raise intervals.RecordsError(f"cannot compare {a.run} ({a.dataset}) with {b.run} ({b.dataset}): "
                                         "a paired comparison needs two models scored on the same examples")
        ra, rb = self._records(a, split, metric), self._records(b, split, metric)
        if ra is None or rb is None:
            return None
        res = intervals.paired(metric, a.task_type, ra, rb, n_resamples=self.boot.n_resamples,
                               confidence=self.boot.confidence, seed=self.boot.seed,
                               key=f"{a.run}-{b.run}/{split}/{metric}")
        d = res.difference
        diff = f"{_percent(d.value, a.task_type):+.1f}" if _finite(d.value) else NA
        ci = (f"[{_percent(d.low, a.task_type):+.1f}, {_percent(d.high, a.task_type):+.1f}]"
              if _finite(d.low) and _finite(d.high) else NA)
        return [f"{a.run} - {b.run}", split, metric, diff, ci, res.test, _p_value(res.p_value), f"{res.n:,}"]


# ------------------------------------------------------------------------------------------------
# rows
# ------------------------------------------------------------------------------------------------


def _check(results: Sequence[Mapping[str, Any]]) -> None:
    seen: set[str] = set()
    for i, r in enumerate(results):
        missing = [k for k in REQUIRED_KEYS if k not in r]
        if missing:
            raise ValueError(
                f"metrics #{i} (run {r.get('run', '?')!r}) lack the keys {missing}: re-run its evaluate stage"
            )
        if r["run"] in seen:
            raise ValueError(f"two metrics files describe run {r['run']!r}: run names must be unique")
        if r["run"].startswith(TEACHER_PREFIX):
            raise ValueError(f"run name {r['run']!r} clashes with the '{TEACHER_PREFIX}<dataset>' table syntax")
        seen.add(r["run"])


def _records(predictions: Mapping[str, Any] | None, who: str) -> dict[str, Sequence[Mapping[str, Any]]]:
    part = (predictions or {}).get(who) or {}
    return {s: part[s] for s in SPLITS if part.get(s)}


def _run_row(r: Mapping[str, Any]) -> _Row:
    speed = r["speed"] or {}
    s, t = speed.get("student_sentences_per_s"), speed.get("teacher_sentences_per_s")
    speedup = s / t if _finite(s) and _finite(t) and t > 0 else speed.get("speedup")
    return _Row(
        run=r["run"],
        dataset=r["dataset"],
        model=r["student"],
        note=r["note"],
        task_type=r["task_type"],
        primary_metric=r["primary_metric"],
        dev=r["dev"],
        test=r["test"],
        params=r["params"],
        sentences_per_s=s if _finite(s) else None,
        speedup=speedup if _finite(speedup) else None,
        device=str(speed.get("device", NA)),
        records=_records(r.get("predictions"), "student"),
        trainable=(r.get("train") or {}).get("trainable_params"),
    )


def _teacher_row(ds: str, name: str, mine: Sequence[Mapping[str, Any]]) -> _Row:
    t = mine[0]["teacher"]
    # the teacher's speed was measured beside every run: report the median of those measurements
    rates = [
        r["speed"]["teacher_sentences_per_s"]
        for r in mine
        if r["speed"] and _finite(r["speed"].get("teacher_sentences_per_s"))
    ]
    devices = sorted({str(r["speed"].get("device", NA)) for r in mine if r["speed"]})
    with_records = [r for r in mine if _records(r.get("predictions"), "teacher")]
    return _Row(
        run=f"{TEACHER_PREFIX}{ds}",
        dataset=ds,
        model=name,
        note="teacher",
        task_type=mine[0]["task_type"],
        primary_metric=mine[0]["primary_metric"],
        dev=t["dev"],
        test=t.get("test"),
        params=t.get("params"),
        sentences_per_s=statistics.median(rates) if rates else None,
        speedup=1.0 if rates else None,
        device=", ".join(devices) or NA,
        records=_records(with_records[0]["predictions"], "teacher") if with_records else {},
    )


def _rows(results: Sequence[Mapping[str, Any]]) -> tuple[list[_Row], dict[str, _Row]]:
    """Main-table rows (per dataset: teachers, then runs) and the first teacher row of each dataset."""
    datasets = list(dict.fromkeys(r["dataset"] for r in results))
    rows: list[_Row] = []
    first_teacher: dict[str, _Row] = {}
    for ds in datasets:
        runs = [r for r in results if r["dataset"] == ds]
        names = list(dict.fromkeys(r["teacher"]["name"] for r in runs if r["teacher"]))
        for name in names:
            row = _teacher_row(ds, name, [r for r in runs if r["teacher"] and r["teacher"]["name"] == name])
            rows.append(row)
            first_teacher.setdefault(ds, row)
        rows += [_run_row(r) for r in runs]
    return rows, first_teacher


def _params(row: _Row) -> tuple[str, str]:
    p = row.params or {}
    return _millions(p.get("total")), _millions(p.get("without_embeddings"))


# ------------------------------------------------------------------------------------------------
# rendering
# ------------------------------------------------------------------------------------------------

MAIN_HEADER = (
    "Dataset",
    "Run",
    "Model",
    "Note",
    "Metric",
    "Dev",
    "Test",
    "Params (M)",
    "w/o emb. (M)",
    "Sent./s",
    "Speed-up",
    "Device",
)
COMPARISON_HEADER = ("Comparison", "Split", "Metric", "Difference", "95% CI", "Test", "p", "Examples")


def _main_table(rows: Sequence[_Row], scorer: _Scorer) -> list[str]:
    body = []
    for row in rows:
        m = row.primary_metric
        body.append(
            (
                row.dataset,
                row.run,
                row.model,
                row.note,
                m,
                scorer.cell(row, "dev", m),
                scorer.cell(row, "test", m),
                *_params(row),
                _rate(row.sentences_per_s),
                _speedup(row.speedup),
                row.device,
            )
        )
    return _table(MAIN_HEADER, body)


def _spec_table(spec: TableSpec, by_run: Mapping[str, _Row], scorer: _Scorer) -> list[str]:
    header = ["Run", "Model", "Dataset", "Metric", "Dev", "Test"]
    if spec.paper is not None:
        header.append("Paper")
    header += ["Params (M)", "w/o emb. (M)", "Trainable (M)", "Sent./s", "Speed-up"]
    body = []
    for name in spec.runs:
        paper = [spec.paper.get(name, "")] if spec.paper is not None else []
        row = by_run.get(name)
        if row is None:
            body.append([name, "", "", spec.metric or "", NOT_RUN, NOT_RUN, *paper, "", "", "", "", ""])
            continue
        m = spec.metric or row.primary_metric
        body.append(
            [
                name,
                row.model,
                row.dataset,
                m,
                scorer.cell(row, "dev", m),
                scorer.cell(row, "test", m),
                *paper,
                *_params(row),
                _millions(row.trainable),
                _rate(row.sentences_per_s),
                _speedup(row.speedup),
            ]
        )
    lines = _table(header, body)
    comparisons = []
    for a, b in spec.compare:
        ra, rb = by_run.get(a), by_run.get(b)
        if ra is None or rb is None:
            comparisons.append([f"{a} - {b}", "", "", NOT_RUN, "", "", "", ""])
            continue
        m = spec.metric or ra.primary_metric
        comparisons += [line for split in SPLITS if (line := scorer.comparison(ra, rb, split, m))]
    if comparisons:
        lines += ["", *_table(COMPARISON_HEADER, comparisons)]
    return lines


def _speed_settings(results: Sequence[Mapping[str, Any]]) -> str:
    settings = sorted(
        {(str(s.get("device", NA)), s.get("batch_size"), s.get("seq_len")) for s in (r["speed"] for r in results) if s}
    )
    if not settings:
        return "No speed was measured."
    parts = [f"{d} with batches of {b} random sequences of length {L}" for d, b, L in settings]
    return "Speed measured on " + "; ".join(parts) + "."


def _caption(results: Sequence[Mapping[str, Any]], boot: Bootstrap) -> str:
    level = f"{100 * boot.confidence:g}%"
    return (
        "Metrics are percentages with one decimal, as in the papers (classification and correlation metrics "
        "x100; SQuAD-v2 EM/F1 are percentages already). Brackets: the "
        f"{level} bootstrap confidence interval (BCa, {boot.n_resamples:,} resamples of the split's examples, "
        f"seed {boot.seed}); a score without brackets has no per-example records. Paired comparisons resample "
        "the examples both models were scored on; their test is McNemar's exact test for accuracy and the "
        "two-sided paired bootstrap for every other score. Params: millions, total and without embedding "
        "matrices. Sent./s: median over repeats of the inference throughput (no gradients, warm-up untimed); "
        "speed-up: student over teacher, both measured back to back in the same speed run. Teacher rows show "
        "the median of the teacher's measurements across that dataset's runs. " + _speed_settings(results)
    )


def render_results(
    results: Sequence[Mapping[str, Any]],
    tables: Sequence[TableSpec],
    *,
    bootstrap: Bootstrap,
    out_md: Path | str,
    out_png: Path | str,
) -> str:
    """Write the Markdown report and the speed-vs-quality PNG; returns the Markdown text."""
    out_md, out_png = Path(out_md), Path(out_png)
    _check(results)
    rows, teachers = _rows(results)
    by_run = {r.run: r for r in rows if not r.run.startswith(TEACHER_PREFIX)}
    by_run |= {f"{TEACHER_PREFIX}{ds}": row for ds, row in teachers.items()}
    for spec in tables:
        strangers = sorted({n for pair in spec.compare for n in pair} - set(spec.runs))
        if strangers:
            raise ValueError(f"report table {spec.title!r} compares {strangers}, which are not among its runs")
    scorer = _Scorer(bootstrap)
    lines = ["# Results", "", _caption(results, bootstrap), "", "## All runs", ""]
    lines += _main_table(rows, scorer)
    for spec in tables:
        lines += ["", f"## {spec.title}", ""]
        if spec.caption:
            lines += [spec.caption, ""]
        lines += _spec_table(spec, by_run, scorer)
    rel_png = Path(os.path.relpath(out_png, out_md.parent)).as_posix()
    lines += ["", "## Speed vs quality", "", f"![Speed vs quality]({rel_png})", ""]
    text = "\n".join(lines)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(text, encoding="utf-8")
    plot_speed_quality(rows, _plot_score, out_png)
    log.info("report: %d runs, %d tables -> %s, %s", len(results), len(tables), out_md, out_png)
    return text


def load_results(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    """Read per-run JSON files (metrics, timings or predictions), in the order given."""
    out = []
    for p in paths:
        try:
            out.append(json.loads(Path(p).read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read run metrics {p}: {e}") from e
    return out


def _beside(folder: Path | str, run: str) -> dict[str, Any] | None:
    path = Path(folder) / f"{run}.json"
    return load_results([path])[0] if path.is_file() else None


def write_report(metrics_dir: Path | str, predictions_dir: Path | str, speed_dir: Path | str, cfg: Any,
                 out_md: Path | str, out_png: Path | str) -> str:
    """The ``report`` stage: every ``*.json`` in ``metrics_dir`` (evaluate's scores, sorted by name), each
    joined with its run's records from ``predictions_dir`` and timings from ``speed_dir`` (``<run>.json``;
    a run without one is reported without intervals or speed), and the tables of the ``report`` params
    section (a :class:`distillpipe.config.report.ReportConfig`); returns a one-line summary."""
    paths = sorted(Path(metrics_dir).glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"no run metrics in {metrics_dir}: run the evaluate stage first (`dvc repro evaluate`)")
    results = load_results(paths)
    for r in results:
        r["speed"] = _beside(speed_dir, r["run"])
        r["predictions"] = _beside(predictions_dir, r["run"])
    tables = [TableSpec(title=t.title, runs=list(t.runs), paper=t.paper, caption=t.caption, metric=t.metric,
                        compare=[(a, b) for a, b in t.compare]) for t in cfg.tables]
    render_results(results, tables, bootstrap=cfg.bootstrap, out_md=out_md, out_png=out_png)
    return f"report: {len(paths)} runs, {len(tables)} tables -> {out_md}, {out_png}"
