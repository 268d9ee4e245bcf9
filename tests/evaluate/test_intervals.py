"""Bootstrap intervals and paired tests against independent references: the library metrics on the whole
split, the exact binomial formula of McNemar's test, the normal approximation of a proportion's interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from distillpipe.evaluate import intervals as iv

KW = {"n_resamples": 1000, "confidence": 0.95, "seed": 0}


def _records(gold, pred):
    return [{"id": f"q{i}", "gold": g, "pred": p} for i, (g, p) in enumerate(zip(gold.tolist(), pred.tolist()))]


def _noisy(gold, accuracy, seed):
    rng = np.random.default_rng(seed)
    return np.where(rng.random(len(gold)) < accuracy, gold, 1 - gold)


GOLD = np.random.default_rng(0).integers(0, 2, 400)


def test_points_are_the_library_scores():
    pred = _noisy(GOLD, 0.8, 1)
    rec = _records(GOLD, pred)
    assert iv.point("accuracy", "classification", rec) == pytest.approx(skm.accuracy_score(GOLD, pred))
    assert iv.point("f1", "classification", rec) == pytest.approx(skm.f1_score(GOLD, pred))
    assert iv.point("matthews", "classification", rec) == pytest.approx(skm.matthews_corrcoef(GOLD, pred))
    three = np.random.default_rng(2).integers(0, 3, 300)
    p3 = np.where(np.random.default_rng(3).random(300) < 0.6, three, (three + 1) % 3)
    assert iv.point("f1", "classification", _records(three, p3)) == pytest.approx(
        skm.f1_score(three, p3, average="macro"))
    x = np.random.default_rng(4).normal(size=200)
    y = x + np.random.default_rng(5).normal(size=200)
    reg = _records(x, y)
    assert iv.point("pearson", "regression", reg) == pytest.approx(stats.pearsonr(x, y)[0])
    assert iv.point("spearman", "regression", reg) == pytest.approx(stats.spearmanr(x, y)[0])


def test_qa_scores_are_means_of_the_per_question_values():
    rng = np.random.default_rng(0)
    rec = [{"id": str(i), "has_answer": bool(h), "em": float(e), "f1": float(f), "span_em": float(se),
            "span_f1": float(sf)}
           for i, (h, e, f, se, sf) in enumerate(zip(rng.random(50) < 0.6, rng.random(50) < 0.4, rng.random(50),
                                                     rng.random(50) < 0.5, rng.random(50)))]
    has = [r for r in rec if r["has_answer"]]
    assert iv.point("exact", "qa", rec) == pytest.approx(100 * np.mean([r["em"] for r in rec]))
    assert iv.point("HasAns_f1", "qa", rec) == pytest.approx(100 * np.mean([r["f1"] for r in has]))
    assert iv.point("HasAns_span_f1", "qa", rec) == pytest.approx(100 * np.mean([r["span_f1"] for r in has]))
    assert iv.point("HasAns_span_exact", "qa", rec) == pytest.approx(100 * np.mean([r["span_em"] for r in has]))
    with pytest.raises(iv.RecordsError, match="best_exact"):
        iv.point("best_exact", "qa", rec)


def test_interval_of_a_proportion_matches_the_normal_approximation():
    pred = _noisy(GOLD, 0.8, 1)
    ci = iv.interval("accuracy", "classification", _records(GOLD, pred), key="x", **KW)
    p = np.mean(GOLD == pred)
    half = 1.96 * math.sqrt(p * (1 - p) / len(GOLD))
    assert ci.value == pytest.approx(p)
    assert ci.low == pytest.approx(p - half, abs=0.01) and ci.high == pytest.approx(p + half, abs=0.01)
    again = iv.interval("accuracy", "classification", _records(GOLD, pred), key="x", **KW)
    assert again == ci  # seeded


def _mcnemar_by_hand(b: int, c: int) -> float:
    """Exact two-sided McNemar: 2 * P(X <= min(b, c)) for X ~ Bin(b + c, 1/2), capped at 1."""
    n = b + c
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def test_mcnemar_for_accuracy():
    a, b = _noisy(GOLD, 0.85, 1), _noisy(GOLD, 0.8, 2)
    res = iv.paired("accuracy", "classification", _records(GOLD, a), _records(GOLD, b), key="ab", **KW)
    only_a = int(np.sum((a == GOLD) & (b != GOLD)))
    only_b = int(np.sum((a != GOLD) & (b == GOLD)))
    assert res.test == "McNemar" and res.n == len(GOLD)
    assert res.p_value == pytest.approx(_mcnemar_by_hand(only_a, only_b))
    assert res.difference.value == pytest.approx(np.mean(a == GOLD) - np.mean(b == GOLD))
    assert res.difference.low < res.difference.value < res.difference.high


def test_paired_bootstrap_finds_a_real_difference_and_not_a_null_one():
    x = np.random.default_rng(4).normal(size=300)
    good = x + 0.5 * np.random.default_rng(5).normal(size=300)
    bad = x + 1.5 * np.random.default_rng(6).normal(size=300)
    real = iv.paired("pearson", "regression", _records(x, good), _records(x, bad), key="real", **KW)
    assert real.test == "paired bootstrap" and real.p_value < 0.01 and real.difference.low > 0
    same_a = x + np.random.default_rng(7).normal(size=300)
    same_b = x + np.random.default_rng(8).normal(size=300)
    null = iv.paired("pearson", "regression", _records(x, same_a), _records(x, same_b), key="null", **KW)
    assert null.p_value > 0.05 and null.difference.low < 0 < null.difference.high


def test_identical_predictions_differ_by_exactly_zero():
    pred = _noisy(GOLD, 0.8, 1)
    for metric in ("accuracy", "f1"):  # 100 resamples: every one is exactly 0 (1000 of f1 took ~10 s)
        res = iv.paired(metric, "classification", _records(GOLD, pred), _records(GOLD, pred), key="same",
                        **{**KW, "n_resamples": 100})
        assert (res.difference.value, res.difference.low, res.difference.high, res.p_value) == (0, 0, 0, 1)


def test_pairs_must_cover_the_same_examples_with_the_same_gold():
    pred = _noisy(GOLD, 0.8, 1)
    a = _records(GOLD, pred)
    with pytest.raises(iv.RecordsError, match="same examples"):
        iv.paired("accuracy", "classification", a, a[:-1], key="k", **KW)
    flipped = [dict(r, gold=1 - r["gold"]) if i == 0 else r for i, r in enumerate(a)]
    with pytest.raises(iv.RecordsError, match="different gold"):
        iv.paired("accuracy", "classification", a, flipped, key="k", **KW)
    # order does not matter: records are matched by id
    res = iv.paired("accuracy", "classification", a, list(reversed(a)), key="k", **KW)
    assert res.difference.value == 0
