"""The results report: ``reports/results.md`` and a speed-vs-quality PNG, from per-run metrics dicts.

Input: one metrics dict per run, as the ``evaluate`` stage writes them (one JSON per run), with the
``speed`` stage's timings of the run under ``"speed"``::

    {"run", "student", "dataset", "task_type", "note", "primary_metric",
     "dev": {metric: value}, "test": {metric: value} | None,
     "params": {"total", "without_embeddings"},
     "speed": {"device", "batch_size", "seq_len", "student_sentences_per_s",
               "teacher_sentences_per_s", "speedup"} | None,
     "teacher": {"name", "dev", "test" | None, "params"} | None}

and a list of :class:`TableSpec` (paper-style tables naming runs in order, with the paper's numbers).

Output, all deterministic (no timestamps; the same inputs give the same bytes):

1. a main table: one row per teacher (once per dataset and teacher name) then one per run of that
   dataset, datasets in order of first appearance;
2. one table per :class:`TableSpec`; a run it names that is absent is reported as "not run";
3. the PNG (matplotlib Agg canvas, no pyplot state): one panel per dataset, x = sentences/s (log),
   y = primary dev metric, one labelled marker per run and per teacher.

Numbers: metrics are shown as percentages with one decimal, as the papers do. Classification
metrics arrive as fractions (:mod:`distillpipe.evaluate.metrics`) and are multiplied by 100;
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

NA = "n/a"
NOT_RUN = "not run"
TEACHER_PREFIX = "teacher:"
"""A :class:`TableSpec` run named ``teacher:<dataset>`` selects the teacher row of that dataset."""
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


# ------------------------------------------------------------------------------------------------
# formatting
# ------------------------------------------------------------------------------------------------


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def format_metric(value: Any, task_type: str) -> str:
    """A metric as a percentage with one decimal (x100 unless QA, whose metrics are in % already)."""
    if not _finite(value):
        return NA
    return f"{value if task_type == 'qa' else 100.0 * value:.1f}"


def _metric_value(metrics: Mapping[str, float] | None, key: str, task_type: str) -> float | None:
    if not metrics or not _finite(metrics.get(key)):
        return None
    v = float(metrics[key])
    return v if task_type == "qa" else 100.0 * v


def _millions(n: Any) -> str:
    return f"{n / 1e6:.2f}" if _finite(n) else NA


def _rate(x: float | None) -> str:
    return f"{x:,.0f}" if _finite(x) else NA


def _speedup(x: float | None) -> str:
    return f"{x:.1f}x" if _finite(x) else NA


def _cell(text: str) -> str:
    return str(text).replace("\n", " ").replace("|", "\\|")


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


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
            mine = [r for r in runs if r["teacher"] and r["teacher"]["name"] == name]
            t = mine[0]["teacher"]
            # the teacher's speed was measured beside every run: report the median of those measurements
            rates = [
                r["speed"]["teacher_sentences_per_s"]
                for r in mine
                if r["speed"] and _finite(r["speed"].get("teacher_sentences_per_s"))
            ]
            devices = sorted({str(r["speed"].get("device", NA)) for r in mine if r["speed"]})
            row = _Row(
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
            )
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


def _main_table(rows: Sequence[_Row]) -> list[str]:
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
                format_metric((row.dev or {}).get(m), row.task_type),
                format_metric((row.test or {}).get(m), row.task_type) if row.test else NA,
                *_params(row),
                _rate(row.sentences_per_s),
                _speedup(row.speedup),
                row.device,
            )
        )
    return _table(MAIN_HEADER, body)


def _spec_table(spec: TableSpec, by_run: Mapping[str, _Row]) -> list[str]:
    header = ["Run", "Model", "Dataset", "Metric", "Dev", "Test"]
    if spec.paper is not None:
        header.append("Paper")
    header += ["Params (M)", "w/o emb. (M)", "Sent./s", "Speed-up"]
    body = []
    for name in spec.runs:
        paper = [spec.paper.get(name, "")] if spec.paper is not None else []
        row = by_run.get(name)
        if row is None:
            body.append([name, "", "", spec.metric or "", NOT_RUN, NOT_RUN, *paper, "", "", "", ""])
            continue
        m = spec.metric or row.primary_metric
        body.append(
            [
                name,
                row.model,
                row.dataset,
                m,
                format_metric((row.dev or {}).get(m), row.task_type),
                format_metric((row.test or {}).get(m), row.task_type) if row.test else NA,
                *paper,
                *_params(row),
                _rate(row.sentences_per_s),
                _speedup(row.speedup),
            ]
        )
    return _table(header, body)


def _speed_settings(results: Sequence[Mapping[str, Any]]) -> str:
    settings = sorted(
        {(str(s.get("device", NA)), s.get("batch_size"), s.get("seq_len")) for s in (r["speed"] for r in results) if s}
    )
    if not settings:
        return "No speed was measured."
    parts = [f"{d} with batches of {b} random sequences of length {L}" for d, b, L in settings]
    return "Speed measured on " + "; ".join(parts) + "."


def _tick_label(v: float, _pos: object, leading: tuple[int, ...] = (1,)) -> str:
    """Plain-number label ("2,000") for log-axis ticks whose leading digit is in ``leading``."""
    if v <= 0 or round(v / 10 ** math.floor(math.log10(v) + 1e-9)) not in leading:
        return ""
    return f"{v:,.0f}" if v >= 1 else f"{v:g}"


def _plot(rows: Sequence[_Row], out_png: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    datasets = list(dict.fromkeys(r.dataset for r in rows)) or ["(no runs)"]
    ncols = min(3, len(datasets))
    nrows = -(-len(datasets) // ncols)
    fig = Figure(figsize=(5.0 * ncols, 4.0 * nrows), dpi=100)
    FigureCanvasAgg(fig)
    for i, ds in enumerate(datasets):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        pts = []
        for row in rows:
            if row.dataset != ds:
                continue
            y = _metric_value(row.dev, row.primary_metric, row.task_type)
            if y is None or row.sentences_per_s is None or row.sentences_per_s <= 0:
                continue
            pts.append((row, row.sentences_per_s, y))
        metric = next((r.primary_metric for r in rows if r.dataset == ds), "")
        for row, x, y in pts:
            teacher = row.run.startswith(TEACHER_PREFIX)
            ax.scatter(
                [x],
                [y],
                marker="*" if teacher else "o",
                s=140 if teacher else 50,
                color="tab:red" if teacher else "tab:blue",
                zorder=3,
            )
            ax.annotate(
                f"teacher {row.model}" if teacher else row.run,
                (x, y),
                textcoords="offset points",
                xytext=(5, 5),
                fontsize=8,
            )
        if pts:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(_tick_label))
            ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: _tick_label(v, _, leading=(2, 5))))
            ax.margins(x=0.3, y=0.15)  # room for the labels at the edges
        else:
            ax.text(0.5, 0.5, "no run with speed and dev metric", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(ds)
        ax.set_xlabel("sentences / s (log scale)")
        ax.set_ylabel(f"dev {metric} (%)")
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, format="png", metadata={"Software": None})  # no version string: stable bytes


def render_results(
    results: Sequence[Mapping[str, Any]], tables: Sequence[TableSpec], *, out_md: Path | str, out_png: Path | str
) -> str:
    """Write the Markdown report and the speed-vs-quality PNG; returns the Markdown text."""
    out_md, out_png = Path(out_md), Path(out_png)
    _check(results)
    rows, teachers = _rows(results)
    by_run = {r.run: r for r in rows if not r.run.startswith(TEACHER_PREFIX)}
    by_run |= {f"{TEACHER_PREFIX}{ds}": row for ds, row in teachers.items()}
    caption = (
        "Metrics are percentages with one decimal, as in the papers (classification metrics x100; SQuAD-v2 "
        "EM/F1 are percentages already). Params: millions, total and without embedding matrices. Sent./s: "
        "median over repeats of the inference throughput (no gradients, warm-up untimed); speed-up: student "
        "over teacher, both measured back to back in the same evaluate run. Teacher rows show the median of "
        "the teacher's measurements across that dataset's runs. " + _speed_settings(results)
    )
    lines = ["# Results", "", caption, "", "## All runs", ""]
    lines += _main_table(rows)
    for spec in tables:
        lines += ["", f"## {spec.title}", ""]
        if spec.caption:
            lines += [spec.caption, ""]
        lines += _spec_table(spec, by_run)
    rel_png = Path(os.path.relpath(out_png, out_md.parent)).as_posix()
    lines += ["", "## Speed vs quality", "", f"![Speed vs quality]({rel_png})", ""]
    text = "\n".join(lines)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(text, encoding="utf-8")
    _plot(rows, out_png)
    log.info("report: %d runs, %d tables -> %s, %s", len(results), len(tables), out_md, out_png)
    return text


def load_results(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    """Read per-run metrics JSON files, in the order given (sort the paths for a stable report)."""
    out = []
    for p in paths:
        try:
            out.append(json.loads(Path(p).read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read run metrics {p}: {e}") from e
    return out


def write_report(metrics_dir: Path | str, speed_dir: Path | str, cfg: Any, out_md: Path | str,
                 out_png: Path | str) -> str:
    """The ``report`` stage: every ``*.json`` in ``metrics_dir`` (evaluate's scores, sorted by name), each
    joined with its run's timings from ``speed_dir`` (the speed stage's ``<run>.json``; a run without
    one is reported without speed), and the tables of the ``report`` params section (a
    :class:`distillpipe.config.report.ReportConfig`); returns a one-line summary."""
    paths = sorted(Path(metrics_dir).glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"no run metrics in {metrics_dir}: run the evaluate stage first (`dvc repro evaluate`)")
    results = load_results(paths)
    for r in results:
        timing = Path(speed_dir) / f"{r['run']}.json"
        r["speed"] = load_results([timing])[0] if timing.is_file() else None
    tables = [TableSpec(title=t.title, runs=list(t.runs), paper=t.paper, caption=t.caption, metric=t.metric)
              for t in cfg.tables]
    render_results(results, tables, out_md=out_md, out_png=out_png)
    return f"report: {len(paths)} runs, {len(tables)} tables -> {out_md}, {out_png}"
