"""Uncertainty of the reported scores, from the per-example records the ``evaluate`` stage writes.

* :func:`interval`: a 95% bootstrap confidence interval of one score, resampling the split's examples
  (scipy.stats.bootstrap, BCa, seeded);
* :func:`paired`: the paired difference of two models scored on the same examples, with its bootstrap
  interval and a test of "no difference": McNemar's exact test for accuracy (a binomial test on the
  discordant pairs, scipy.stats.binomtest), the paired bootstrap for every other score (two-sided, on
  the centred bootstrap distribution of the difference: p = (1 + #{|d* - d| >= |d|}) / (1 + B)).

A score is recomputed from the records by the same library call that computed it in ``evaluate``
(scikit-learn / SciPy, :mod:`distillpipe.evaluate.metrics`), or as a mean of per-example values where
the score is one (accuracy; SQuAD EM/F1 and their HasAns/NoAns parts, per question at the threshold
used). :func:`point` checks that the records reproduce the recorded score, so a report never pairs an
interval with a number it does not belong to.

Scale: resamples are drawn in batches of ``_BATCH`` (memory ~ _BATCH x n indices); mean scores are
vectorised, the others call scikit-learn once per resample (~1-2 ms for 1,000 examples).
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats
from sklearn import metrics as skm

from distillpipe.errors import UserError
from distillpipe.evaluate.metrics import correlation, f1_average

_BATCH = 100
"""Bootstrap resamples evaluated at once."""


class RecordsError(UserError, ValueError):
    """The per-example records do not fit the score or the comparison asked for."""


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float


@dataclass(frozen=True)
class Paired:
    """``a - b`` on the same examples."""

    difference: Interval
    test: str
    """``McNemar`` or ``paired bootstrap``."""
    p_value: float
    n: int


@dataclass(frozen=True)
class Statistic:
    """A score as a function of example indices: ``fn(idx, axis=-1)`` on (..., n) index arrays when
    ``vectorized``, else ``fn(idx)`` on one (n,) array (what scipy.stats.bootstrap calls)."""

    fn: Callable[..., Any]
    vectorized: bool

    def __call__(self, idx: np.ndarray, axis: int = -1) -> Any:
        return self.fn(idx, axis=axis) if self.vectorized else self.fn(idx)

    def on(self, idx: np.ndarray) -> float:
        return float(self(idx))


def _mean_statistic(values: np.ndarray) -> Statistic:
    return Statistic(lambda idx, axis=-1: values[idx].mean(axis=axis), vectorized=True)


def _masked_mean_statistic(values: np.ndarray, mask: np.ndarray) -> Statistic:
    def fn(idx, axis=-1):
        m = mask[idx]
        with np.errstate(invalid="ignore", divide="ignore"):
            return (values[idx] * m).sum(axis=axis) / m.sum(axis=axis)

    return Statistic(fn, vectorized=True)


def _call_statistic(fn: Callable[[np.ndarray, np.ndarray], float], gold: np.ndarray, pred: np.ndarray) -> Statistic:
    return Statistic(lambda idx: fn(gold[idx], pred[idx]), vectorized=False)


def statistic(metric: str, task_type: str, records: Sequence[Mapping[str, Any]]) -> Statistic:
    """The score ``metric`` as a function of example indices into ``records`` (in the units the metrics
    files use: fractions for classification and regression, percent for QA)."""
    if task_type == "qa":
        if metric not in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1",
                          "HasAns_span_exact", "HasAns_span_f1"):
            raise RecordsError(f"no interval for the QA score {metric!r}: use exact, f1, their HasAns/NoAns parts "
                               "or HasAns_span_exact/HasAns_span_f1")
        key = ("span_" if "_span_" in metric else "") + ("em" if metric.endswith("exact") else "f1")
        values = 100.0 * np.asarray([r[key] for r in records], np.float64)
        if metric.startswith(("HasAns", "NoAns")):
            has = np.asarray([r["has_answer"] for r in records], bool)
            return _masked_mean_statistic(values, has if metric.startswith("HasAns") else ~has)
        return _mean_statistic(values)
    gold = np.asarray([r["gold"] for r in records])
    pred = np.asarray([r["pred"] for r in records])
    if task_type == "regression":
        if metric not in ("pearson", "spearman"):
            raise RecordsError(f"no interval for the regression score {metric!r}: use pearson or spearman")
        return _call_statistic(lambda g, p: correlation(metric, g, p), gold.astype(np.float64),
                               pred.astype(np.float64))
    if metric == "accuracy":
        return _mean_statistic((gold == pred).astype(np.float64))
    if metric == "matthews":
        return _call_statistic(lambda g, p: float(skm.matthews_corrcoef(g, p)), gold, pred)
    if metric == "f1":
        # the averaging evaluate chose on the whole split (metrics.classification_metrics), kept for every resample
        average = f1_average(gold, pred)
        return _call_statistic(lambda g, p: float(skm.f1_score(g, p, average=average, zero_division=0)), gold, pred)
    raise RecordsError(f"no interval for the classification score {metric!r}: use accuracy, f1 or matthews")


def point(metric: str, task_type: str, records: Sequence[Mapping[str, Any]]) -> float:
    """The score on all of ``records``."""
    return statistic(metric, task_type, records).on(np.arange(len(records)))


def _seed(seed: int, key: str) -> np.random.Generator:
    """A generator per score, so that adding a row to the report leaves every other interval as it was."""
    return np.random.default_rng([seed, zlib.crc32(key.encode())])


def _bootstrap(stat: Statistic, n: int, *, n_resamples: int, confidence: float, rng: np.random.Generator):
    """(low, high, bootstrap distribution) of ``stat`` over ``n`` examples; a score that every resample gives
    the same value (e.g. two identical prediction lists) has the degenerate interval [value, value]."""
    value = stat.on(np.arange(n))
    with warnings.catch_warnings():
        # BCa on a distribution with one value: scipy warns and returns nan, handled below
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.bootstrap((np.arange(n),), stat.__call__, n_resamples=n_resamples, confidence_level=confidence,
                              vectorized=stat.vectorized, batch=_BATCH, method="BCa", rng=rng)
    dist = np.asarray(res.bootstrap_distribution, np.float64)
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if np.isfinite(dist).all() and np.ptp(dist) == 0:
        low = high = value
    return low, high, dist


def interval(metric: str, task_type: str, records: Sequence[Mapping[str, Any]], *, n_resamples: int,
             confidence: float, seed: int, key: str) -> Interval:
    """The score ``metric`` on ``records`` with its bootstrap interval (``key`` names it for the seed)."""
    if len(records) < 2:
        raise RecordsError(f"{key}: {len(records)} scored example(s), too few for an interval")
    stat = statistic(metric, task_type, records)
    value = stat.on(np.arange(len(records)))
    if not math.isfinite(value):
        return Interval(value, math.nan, math.nan)
    low, high, _ = _bootstrap(stat, len(records), n_resamples=n_resamples, confidence=confidence,
                              rng=_seed(seed, key))
    return Interval(value, low, high)


def align(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], what: str) -> list[Mapping[str, Any]]:
    """``b``'s records in ``a``'s order; both must cover the same examples (and, when they carry one, the same
    gold label)."""
    by_id = {r["id"]: r for r in b}
    if len(by_id) != len(b) or set(by_id) != {r["id"] for r in a} or len(a) != len(b):
        raise RecordsError(f"{what}: the two runs were not scored on the same examples; re-run their evaluate "
                           f"stages on the same tokens")
    out = [by_id[r["id"]] for r in a]
    for ra, rb in zip(a, out):
        if ra.get("gold", ra.get("has_answer")) != rb.get("gold", rb.get("has_answer")):
            raise RecordsError(f"{what}: example {ra['id']!r} has different gold labels in the two runs")
    return out


def mcnemar(correct_a: np.ndarray, correct_b: np.ndarray) -> float:
    """Two-sided exact McNemar p-value: a binomial test of the discordant pairs against 1/2."""
    only_a = int(np.sum(correct_a & ~correct_b))
    only_b = int(np.sum(~correct_a & correct_b))
    if only_a + only_b == 0:
        return 1.0
    return float(stats.binomtest(only_a, only_a + only_b, 0.5).pvalue)


def paired(metric: str, task_type: str, a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], *,
           n_resamples: int, confidence: float, seed: int, key: str) -> Paired:
    """``metric(a) - metric(b)`` on the same examples, with its interval and test (see the module doc)."""
    b = align(a, b, key)
    if len(a) < 2:
        raise RecordsError(f"{key}: {len(a)} paired example(s), too few for a comparison")
    sa, sb = statistic(metric, task_type, a), statistic(metric, task_type, b)

    if sa.vectorized:
        diff = Statistic(lambda idx, axis=-1: sa(idx, axis) - sb(idx, axis), vectorized=True)
    else:
        diff = Statistic(lambda idx: sa(idx) - sb(idx), vectorized=False)
    value = diff.on(np.arange(len(a)))
    if not math.isfinite(value):
        return Paired(Interval(value, math.nan, math.nan), "n/a", math.nan, len(a))
    low, high, dist = _bootstrap(diff, len(a), n_resamples=n_resamples, confidence=confidence, rng=_seed(seed, key))
    if task_type not in ("qa", "regression") and metric == "accuracy":
        gold = np.asarray([r["gold"] for r in a])
        correct_a = gold == np.asarray([r["pred"] for r in a])
        correct_b = gold == np.asarray([r["pred"] for r in b])
        test, p = "McNemar", mcnemar(correct_a, correct_b)
    else:
        dist = dist[np.isfinite(dist)]
        test = "paired bootstrap"
        p = 1.0 if value == 0 else float((1 + np.sum(np.abs(dist - value) >= abs(value))) / (1 + len(dist)))
    return Paired(Interval(value, low, high), test, p, len(a))
