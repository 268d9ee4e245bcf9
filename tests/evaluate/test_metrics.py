"""GLUE-style metrics against hand-worked examples and the textbook formulas computed in float64 loops."""

import math

import numpy as np
import pytest

from distillpipe.evaluate.metrics import classification_metrics, correlation, f1_average, regression_metrics


def _macro_f1(labels, preds):
    """Macro F1 by hand: per class of the union, F1 = 2PR / (P + R), 0 where P or R is undefined or both 0."""
    out = []
    for c in sorted(set(labels) | set(preds)):
        tp = sum(g == c and p == c for g, p in zip(labels, preds))
        fp = sum(g != c and p == c for g, p in zip(labels, preds))
        fn = sum(g == c and p != c for g, p in zip(labels, preds))
        prec = tp / (tp + fp) if tp + fp else 0.0
        rec = tp / (tp + fn) if tp + fn else 0.0
        out.append(2 * prec * rec / (prec + rec) if prec + rec else 0.0)
    return sum(out) / len(out)


def _mcc(labels, preds):
    """Gorodkin's multi-class Matthews correlation from the confusion matrix (c: correct, s: total, t_k/p_k: true
    and predicted counts of class k): (c s - sum p_k t_k) / sqrt((s^2 - sum p_k^2) (s^2 - sum t_k^2))."""
    classes = sorted(set(labels) | set(preds))
    s, c = len(labels), sum(g == p for g, p in zip(labels, preds))
    t = [sum(g == k for g in labels) for k in classes]
    p = [sum(q == k for q in preds) for k in classes]
    den = math.sqrt((s * s - sum(x * x for x in p)) * (s * s - sum(x * x for x in t)))
    return (c * s - sum(a * b for a, b in zip(p, t))) / den if den else 0.0


def test_binary_metrics_by_hand():
    labels = np.array([1, 1, 0, 0, 1, 0])
    preds = np.array([1, 0, 0, 1, 1, 0])
    # tp = 2 (rows 0, 4), tn = 2 (rows 2, 5), fp = 1 (row 3), fn = 1 (row 1)
    m = classification_metrics(labels, preds)
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["f1"] == pytest.approx(2 / 3)  # F1 of class 1: P = 2/3, R = 2/3
    # MCC = (tp tn - fp fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = (4 - 1) / sqrt(3^4) = 1/3
    assert m["matthews"] == pytest.approx(1 / 3)


def test_multiclass_metrics_against_loops():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=200)
    preds = np.where(rng.random(200) < 0.6, labels, rng.integers(0, 4, size=200))
    m = classification_metrics(labels, preds)
    assert m["accuracy"] == pytest.approx(float(np.mean(labels == preds)))
    assert m["f1"] == pytest.approx(_macro_f1(labels.tolist(), preds.tolist()))
    assert m["matthews"] == pytest.approx(_mcc(labels.tolist(), preds.tolist()))


def test_constant_predictions_have_zero_matthews_and_zero_f1():
    labels = np.array([0, 1, 1, 0])
    m = classification_metrics(labels, np.zeros(4, dtype=int))
    assert m == {"accuracy": 0.5, "f1": 0.0, "matthews": 0.0}  # class 1 never predicted: F1 0, no warning


@pytest.mark.parametrize(("labels", "preds", "average"), [
    ([0, 1, 1], [1, 1, 0], "binary"),
    ([1, 1, 1], [1, 1, 1], "binary"),  # one class seen, labels within {0, 1}
    ([0, 1, 2], [0, 1, 1], "macro"),
    ([0, 1, 1], [0, 2, 1], "macro"),  # a third class among the predictions
    ([1, 2, 2], [1, 2, 1], "macro"),  # two classes but not 0/1: no "class 1 is positive" convention
])
def test_f1_average_is_binary_only_for_zero_one_tasks(labels, preds, average):
    assert f1_average(np.array(labels), np.array(preds)) == average


def _pearson(x, y):
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return sxy / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def _ranks(x):
    """1-based ranks, ties given the mean of the ranks they span."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    r = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def test_correlations_against_the_formulas():
    rng = np.random.default_rng(1)
    labels = np.round(rng.uniform(0, 5, size=50), 1)  # STS-B-like scores, with ties
    preds = labels + rng.normal(0, 1.0, size=50)
    m = regression_metrics(labels, preds)
    assert set(m) == {"pearson", "spearman"}
    assert m["pearson"] == pytest.approx(_pearson(labels.tolist(), preds.tolist()), abs=1e-12)
    assert m["spearman"] == pytest.approx(_pearson(_ranks(labels.tolist()), _ranks(preds.tolist())), abs=1e-12)
    # a monotone but non-linear prediction: Spearman 1, Pearson below
    assert correlation("spearman", labels, np.exp(labels)) == pytest.approx(1.0)
    assert correlation("pearson", labels, np.exp(labels)) < 0.99


def test_correlation_of_a_constant_side_is_nan():
    assert math.isnan(correlation("pearson", [1.0, 2.0, 3.0], [2.0, 2.0, 2.0]))
    assert all(math.isnan(v) for v in regression_metrics([4.0, 4.0], [1.0, 2.0]).values())
