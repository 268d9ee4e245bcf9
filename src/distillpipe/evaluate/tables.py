"""The report's tables (:mod:`distillpipe.evaluate.report`): one line per model, every score with its bootstrap
interval; each model's score beside its task's trivial baseline (:mod:`distillpipe.evaluate.baseline`);
paper-style tables of selected runs with the paper's numbers and paired comparisons (with the smallest difference
their examples resolve).

Numbers: metrics are shown as percentages with one decimal, as the papers do. Classification and
regression metrics arrive as fractions (:mod:`distillpipe.evaluate.metrics`) and are multiplied by 100;
QA metrics (``task_type == "qa"``) arrive already in percent (``squad_v2_scores``) and are not.
Parameters in millions with two decimals; sentences/s rounded to integers; speed-ups with one decimal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from distillpipe.config.report import BootstrapConfig
from distillpipe.evaluate import intervals
from distillpipe.evaluate.baseline import trivial_baseline

NA = "n/a"
NOT_RUN = "not run"
SPLITS = ("dev", "test")


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
class Row:
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


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _percent(value: float, task_type: str) -> float:
    return value if task_type == "qa" else 100.0 * value


def format_metric(value: Any, task_type: str) -> str:
    """A metric as a percentage with one decimal (x100 unless QA, whose metrics are in % already)."""
    if not finite(value):
        return NA
    return f"{_percent(value, task_type):.1f}"


def _metric_value(metrics: Mapping[str, float] | None, key: str, task_type: str) -> float | None:
    if not metrics or not finite(metrics.get(key)):
        return None
    return _percent(float(metrics[key]), task_type)


def plot_score(row: Row) -> tuple[float, str] | None:
    """The plot's y value: the primary metric on test, or on dev where the run has no test score."""
    for split in ("test", "dev"):
        value = _metric_value(row.scores(split), row.primary_metric, row.task_type)
        if value is not None:
            return value, split
    return None


def _millions(n: Any) -> str:
    return f"{n / 1e6:.2f}" if finite(n) else NA


def _rate(x: float | None) -> str:
    return f"{x:,.0f}" if finite(x) else NA


def _speedup(x: float | None) -> str:
    return f"{x:.1f}x" if finite(x) else NA


def _p_value(p: float) -> str:
    if not finite(p):
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


class Scorer:
    """Formats scores with their intervals and paired comparisons, checking each against its records."""

    def __init__(self, boot: Bootstrap):
        self.boot = boot
        self._intervals: dict[tuple[str, str, str, str], intervals.Interval | None] = {}

    def _records(self, row: Row, split: str, metric: str) -> Sequence[Mapping[str, Any]] | None:
        recorded = (row.scores(split) or {}).get(metric)
        records = row.records.get(split)
        if not records or not finite(recorded):
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

    def interval(self, row: Row, split: str, metric: str) -> intervals.Interval | None:
        """The score's bootstrap interval, the one :meth:`cell` prints; None without records (fewer than two, or
        records that cannot give the score) or where the interval is undefined. Drawn once per row, split and
        metric: bootstrapping is the report's main cost, and every section that quotes an interval asks here."""
        # two teachers of one dataset share the run name teacher:<dataset>: the model tells them apart
        key = (row.run, row.model, split, metric)
        if key not in self._intervals:
            self._intervals[key] = self._draw(row, split, metric)
        return self._intervals[key]

    def _draw(self, row: Row, split: str, metric: str) -> intervals.Interval | None:
        records = self._records(row, split, metric)
        if records is None or len(records) < 2:
            return None
        ci = intervals.interval(metric, row.task_type, records, n_resamples=self.boot.n_resamples,
                                confidence=self.boot.confidence, seed=self.boot.seed,
                                key=f"{row.run}/{split}/{metric}")
        return ci if finite(ci.low) and finite(ci.high) else None

    def cell(self, row: Row, split: str, metric: str) -> str:
        """``71.0 [66.2, 75.4]``: the score and its interval (the score alone when there are no records)."""
        scores = row.scores(split)
        if not scores:
            return NA
        text = format_metric(scores.get(metric), row.task_type)
        ci = self.interval(row, split, metric)
        if ci is None:
            return text
        return f"{text} [{_percent(ci.low, row.task_type):.1f}, {_percent(ci.high, row.task_type):.1f}]"

    def comparison(self, a: Row, b: Row, split: str, metric: str) -> list[str] | None:
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
        diff = f"{_percent(d.value, a.task_type):+.1f}" if finite(d.value) else NA
        ci = resolves = NA
        if finite(d.low) and finite(d.high):
            ci = f"[{_percent(d.low, a.task_type):+.1f}, {_percent(d.high, a.task_type):+.1f}]"
            resolves = f"±{_percent(d.high - d.low, a.task_type) / 2:.1f}"
        return [f"{a.run} - {b.run}", split, metric, diff, ci, resolves, res.test, _p_value(res.p_value),
                f"{res.n:,}"]


def _params(row: Row) -> tuple[str, str]:
    p = row.params or {}
    return _millions(p.get("total")), _millions(p.get("without_embeddings"))


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
COMPARISON_HEADER = ("Comparison", "Split", "Metric", "Difference", "95% CI", "Resolves", "Test", "p", "Examples")


def main_table(rows: Sequence[Row], scorer: Scorer) -> list[str]:
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


@dataclass(frozen=True)
class Versus:
    """A row's primary score on one split beside its trivial baseline's, in the metrics files' units."""

    predicts: str
    """What the trivial predictor predicts."""
    baseline: float
    """Its score on the split's records."""
    low: float | None
    """Low end of the row's interval (the main table's); None: no interval."""

    @property
    def clearly_above(self) -> bool | None:
        return None if self.low is None else self.low > self.baseline


def versus_baseline(row: Row, split: str, scorer: Scorer) -> Versus | None:
    """The row's primary score on ``split`` against the trivial predictor scored on the same records (without train
    labels: for classification the split's own majority class); None without records or a baseline (an MLM
    corpus, or records that cannot give the metric)."""
    records = row.records.get(split)
    if not records:
        return None
    try:
        base = trivial_baseline(row.task_type, row.primary_metric, records)
    except intervals.RecordsError:
        return None
    if base is None:
        return None
    ci = scorer.interval(row, split, row.primary_metric)
    return Versus(base[0], base[1], None if ci is None else ci.low)


BASELINE_HEADER = ("Run", "Metric", "Baseline", "Dev: baseline", "Dev: low", "Dev: clearly above?",
                   "Test: baseline", "Test: low", "Test: clearly above?")


def _yes_no(v: Versus | None) -> str:
    return NA if v is None or v.clearly_above is None else ("yes" if v.clearly_above else "no")


def baseline_table(compared: Sequence[tuple[Row, Versus | None, Versus | None]]) -> list[str]:
    """One line per ``(row, dev, test)`` of :func:`versus_baseline`'s results."""
    body = []
    for row, *splits in compared:
        said = {split: v.predicts for split, v in zip(SPLITS, splits) if v is not None}
        # a split's own majority class can differ from the other's: then name each
        what = (next(iter(said.values())) if len(set(said.values())) == 1 else
                "; ".join(f"{split}: {text}" for split, text in said.items()) or NA)
        cells = [row.run, row.primary_metric, what]
        for v in splits:
            cells += [NA, NA, NA] if v is None else [format_metric(v.baseline, row.task_type),
                                                     format_metric(v.low, row.task_type), _yes_no(v)]
        body.append(cells)
    return _table(BASELINE_HEADER, body)


def spec_table(spec: TableSpec, by_run: Mapping[str, Row], scorer: Scorer) -> list[str]:
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
            comparisons.append([f"{a} - {b}", "", "", NOT_RUN, "", "", "", "", ""])
            continue
        m = spec.metric or ra.primary_metric
        comparisons += [line for split in SPLITS if (line := scorer.comparison(ra, rb, split, m))]
    if comparisons:
        lines += ["", *_table(COMPARISON_HEADER, comparisons)]
    return lines


QA_THRESHOLDS_CAPTION = (
    "SQuAD v2 EM/F1 above are at `tuned_threshold`, the no-answer threshold applied: the one at which dev F1 is "
    "the best any threshold reaches (`reachable_best_f1`); test is scored at dev's. `best_exact`, `best_f1` and "
    "their thresholds are the official evaluate-v2.0.py figures on dev, the ones papers quote: they can exceed "
    "what their threshold gives (the official sweep can stop inside a group of tied no-answer scores, and charges "
    "an unanswerable question answered with a text that normalises to empty, such as \"the\", as wrong)."
)
QA_THRESHOLDS_HEADER = ("Run", "Model", "tuned_threshold", "reachable_best_f1", "reachable_best_exact",
                        "best_f1", "best_f1_thresh", "best_exact", "best_exact_thresh")


def _threshold(x: Any) -> str:
    return f"{x:.4g}" if finite(x) else NA


def qa_thresholds_table(rows: Sequence[Row]) -> list[str]:
    """Dev's no-answer thresholds and tuned scores of the SQuAD v2 rows that have them ([] when none does)."""
    body = []
    for row in rows:
        dev = row.dev or {}
        if row.task_type != "qa" or "tuned_threshold" not in dev:
            continue
        body.append([row.run, row.model, _threshold(dev["tuned_threshold"]),
                     format_metric(dev.get("reachable_best_f1"), "qa"),
                     format_metric(dev.get("reachable_best_exact"), "qa"),
                     format_metric(dev.get("best_f1"), "qa"), _threshold(dev.get("best_f1_thresh")),
                     format_metric(dev.get("best_exact"), "qa"), _threshold(dev.get("best_exact_thresh"))])
    return _table(QA_THRESHOLDS_HEADER, body) if body else []
