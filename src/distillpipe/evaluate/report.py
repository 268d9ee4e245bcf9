"""The results report: ``reports/results.md`` and a speed-vs-quality PNG, from per-run metrics dicts.

Input: one metrics dict per run, as the ``evaluate`` stage writes them (one JSON per run), with the
``speed`` stage's timings of the run under ``"speed"`` and its per-example records under
``"predictions"`` (evaluate's ``predictions/<run>.json``; None: the run is shown without intervals)::

    {"run", "student", "dataset", "task_type", "note", "primary_metric",
     "dev": {metric: value}, "test": {metric: value} | None,
     "params": {"total", "without_embeddings"},
     "speed": {"device", "batch_size", "seq_len", "student_sentences_per_s",
               "teacher_sentences_per_s", "speedup"} | None,
     "teacher": {"name", "dev", "test" | None, "params", "baseline" (optional)} | None,
     "train": {"steps", "best_step", "init", "trainable_params"} (optional),
     "leakage": the prepared dataset's leakage report (optional; :mod:`distillpipe.evaluate.overlap`),
     "predictions": {"student": {split: [record]}, "teacher": {"name", split: [record]}} | None}

and a list of :class:`TableSpec` (paper-style tables naming runs in order, with the paper's numbers and
the pairs of rows to compare).

Output, all deterministic (no timestamps, seeded resampling; the same inputs give the same bytes):

0. warnings, when there are any: a teacher not clearly above its trivial baseline, a student above its teacher on
   dev (:mod:`distillpipe.evaluate.baseline`; the student's row says so too);
1. a main table: one row per teacher (once per dataset and teacher name) then one per run of that
   dataset, datasets in order of first appearance; every dev/test score with its bootstrap interval; then the
   overlap between each dataset's splits (:mod:`distillpipe.evaluate.overlap`);
2. against the trivial baseline: per main-table row and split, what the task's trivial predictor scores on the
   same records (:func:`distillpipe.evaluate.baseline.trivial_baseline`) and whether the low end of the row's
   interval (the main table's) is above it, under a count of the students clearly above it on dev and test;
3. one table per :class:`TableSpec` (a run it names that is absent is reported as "not run"), followed
   by its paired comparisons: difference, interval, the half-width it resolves, and test
   (:mod:`distillpipe.evaluate.intervals`);
4. where there are SQuAD v2 rows: dev's no-answer thresholds, the one applied (``tuned_threshold``) beside the
   official script's ``best_*`` figures;
5. the PNG (:mod:`distillpipe.evaluate.plot`).

The tables and their number formats: :mod:`distillpipe.evaluate.tables`.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from distillpipe.evaluate.baseline import DOCS, weak_teacher_message
from distillpipe.evaluate.overlap import overlap_section
from distillpipe.evaluate.plot import TEACHER_PREFIX, plot_speed_quality
from distillpipe.evaluate.tables import (
    NA,
    QA_THRESHOLDS_CAPTION,
    SPLITS,
    Bootstrap,
    Row,
    Scorer,
    TableSpec,
    baseline_table,
    finite,
    main_table,
    plot_score,
    qa_thresholds_table,
    spec_table,
    versus_baseline,
)

log = logging.getLogger(__name__)

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


def beats_teacher(r: Mapping[str, Any]) -> tuple[float, float] | None:
    """``(student, teacher)`` dev scores of the primary metric (higher is better) when the student's is above its
    teacher's, else None."""
    m = r["primary_metric"]
    s = (r["dev"] or {}).get(m)
    t = ((r["teacher"] or {}).get("dev") or {}).get(m)
    return (s, t) if finite(s) and finite(t) and s > t else None


def warnings_section(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Lines for the teachers that are not clearly above their trivial baseline, and the students that beat their
    teacher on dev (:mod:`distillpipe.evaluate.baseline`); [] when there are none."""
    lines, seen = [], set()
    for r in results:
        t = r["teacher"] or {}
        check = t.get("baseline")
        if check and not check.get("clearly_above") and (r["dataset"], t.get("name")) not in seen:
            seen.add((r["dataset"], t.get("name")))
            lines.append(f"- **{TEACHER_PREFIX}{r['dataset']}**: {weak_teacher_message(t.get('name'), check)}")
    for r in results:
        beat = beats_teacher(r)
        if beat:
            m = r["primary_metric"]
            lines.append(f"- **{r['run']}** beats its teacher on dev ({m} {beat[0]:.4g} vs {beat[1]:.4g}): the "
                         f"teacher is weaker than its student: undertrained? see {DOCS}")
    return ["## Warnings", "", *lines] if lines else []


def _run_row(r: Mapping[str, Any]) -> Row:
    speed = r["speed"] or {}
    s, t = speed.get("student_sentences_per_s"), speed.get("teacher_sentences_per_s")
    speedup = s / t if finite(s) and finite(t) and t > 0 else speed.get("speedup")
    return Row(
        run=r["run"],
        dataset=r["dataset"],
        model=r["student"],
        note=r["note"] + (" (beats its teacher on dev: see Warnings)" if beats_teacher(r) else ""),
        task_type=r["task_type"],
        primary_metric=r["primary_metric"],
        dev=r["dev"],
        test=r["test"],
        params=r["params"],
        sentences_per_s=s if finite(s) else None,
        speedup=speedup if finite(speedup) else None,
        device=str(speed.get("device", NA)),
        records=_records(r.get("predictions"), "student"),
        trainable=(r.get("train") or {}).get("trainable_params"),
    )


def _teacher_row(ds: str, name: str, mine: Sequence[Mapping[str, Any]]) -> Row:
    t = mine[0]["teacher"]
    # the teacher's speed was measured beside every run: report the median of those measurements
    rates = [
        r["speed"]["teacher_sentences_per_s"]
        for r in mine
        if r["speed"] and finite(r["speed"].get("teacher_sentences_per_s"))
    ]
    devices = sorted({str(r["speed"].get("device", NA)) for r in mine if r["speed"]})
    with_records = [r for r in mine if _records(r.get("predictions"), "teacher")]
    return Row(
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


def _rows(results: Sequence[Mapping[str, Any]]) -> tuple[list[Row], dict[str, Row]]:
    """Main-table rows (per dataset: teachers, then runs) and the first teacher row of each dataset."""
    datasets = list(dict.fromkeys(r["dataset"] for r in results))
    rows: list[Row] = []
    first_teacher: dict[str, Row] = {}
    for ds in datasets:
        runs = [r for r in results if r["dataset"] == ds]
        names = list(dict.fromkeys(r["teacher"]["name"] for r in runs if r["teacher"]))
        for name in names:
            row = _teacher_row(ds, name, [r for r in runs if r["teacher"] and r["teacher"]["name"] == name])
            rows.append(row)
            first_teacher.setdefault(ds, row)
        rows += [_run_row(r) for r in runs]
    return rows, first_teacher


# ------------------------------------------------------------------------------------------------
# rendering
# ------------------------------------------------------------------------------------------------

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
        "two-sided paired bootstrap for every other score. Resolves: half the width of the difference's interval, in "
        "points, about the smallest difference those examples can tell from none (a larger difference, either way, "
        "has an interval that excludes zero, up to the interval's asymmetry). Params: millions, total and without "
        "embedding matrices. Sent./s: median over repeats of the inference throughput (no gradients, warm-up untimed); "
        "speed-up: student over teacher, both measured back to back in the same speed run. Teacher rows show "
        "the median of the teacher's measurements across that dataset's runs. " + _speed_settings(results)
    )


def baseline_section(rows: Sequence[Row], scorer: Scorer, boot: Bootstrap) -> list[str]:
    """Every main-table row against its task's trivial baseline on dev and test, under a count of the students (the
    rows that are not teachers) clearly above it on both."""
    compared = [(row, *(versus_baseline(row, split, scorer) for split in SPLITS)) for row in rows]
    students = [(dev, test) for row, dev, test in compared if not row.run.startswith(TEACHER_PREFIX)]
    based = [(dev, test) for dev, test in students if dev is not None or test is not None]
    above = sum(1 for dev, test in based if dev and test and dev.clearly_above and test.clearly_above)
    short = sum(1 for pair in based if any(v is None or v.clearly_above is None for v in pair))
    summary = f"{above} of {len(based)} students are clearly above their trivial baseline on both dev and test."
    if short:
        summary += (f" {short} of the {len(based)} {'has' if short == 1 else 'have'} no interval on dev or test (no "
                    f"records there, e.g. no test split) and so {'is' if short == 1 else 'are'} not.")
    if len(students) > len(based):
        summary += (f" Not counted: {len(students) - len(based)} without a baseline (no per-example records, or a "
                    "task without a trivial predictor, such as an MLM corpus).")
    caption = (
        "The trivial predictor of each row's task, scored by the same code on the same split's records: "
        "classification, the split's own majority class for every example (for accuracy the best any constant "
        "scores on that split, so a majority of the train labels never scores higher); regression, a constant "
        "score (correlation 0); SQuAD v2, no answer for every question (the unanswerable share). Low: the low end of "
        "the row's "
        f"{100 * boot.confidence:g}% interval, the one the main table prints. Clearly above: that low end is above "
        "the baseline's score (compared before rounding); n/a: no records on the split, or no interval."
    )
    return ["## Against the trivial baseline", "", summary, "", caption, "", *baseline_table(compared)]


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
    scorer = Scorer(bootstrap)
    lines = ["# Results", "", _caption(results, bootstrap), ""]
    warned = warnings_section(results)
    lines += [*warned, ""] if warned else []
    lines += ["## All runs", ""]
    lines += main_table(rows, scorer)
    overlap = overlap_section(results)
    lines += ["", *overlap] if overlap else []
    lines += ["", *baseline_section(rows, scorer, bootstrap)]
    for spec in tables:
        lines += ["", f"## {spec.title}", ""]
        if spec.caption:
            lines += [spec.caption, ""]
        lines += spec_table(spec, by_run, scorer)
    thresholds = qa_thresholds_table(rows)
    if thresholds:
        lines += ["", "## SQuAD v2 no-answer thresholds (dev)", "", QA_THRESHOLDS_CAPTION, "", *thresholds]
    rel_png = Path(os.path.relpath(out_png, out_md.parent)).as_posix()
    lines += ["", "## Speed vs quality", "", f"![Speed vs quality]({rel_png})", ""]
    text = "\n".join(lines)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(text, encoding="utf-8")
    plot_speed_quality(rows, plot_score, out_png)
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
