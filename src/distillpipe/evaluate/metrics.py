"""GLUE-style task metrics, from scikit-learn and SciPy (not re-implemented).

Both are imported where they are used: together they cost a stage process ~1.5 s of CPU to import, and the
training and evaluation stages of MLM, language-model and QA students import this module without calling them.
"""

from __future__ import annotations

import numpy as np


def f1_average(labels: np.ndarray, preds: np.ndarray) -> str:
    """GLUE's F1: of class 1 for a binary task, else macro-averaged."""
    return "binary" if len(np.union1d(labels, preds)) <= 2 and np.max(labels, initial=0) <= 1 else "macro"


def classification_metrics(labels: np.ndarray, preds: np.ndarray) -> dict[str, float]:
    """Accuracy, macro F1 (binary F1 of class 1 for two classes) and Matthews correlation."""
    from sklearn import metrics as skm

    labels, preds = np.asarray(labels), np.asarray(preds)
    return {
        "accuracy": float(skm.accuracy_score(labels, preds)),
        "f1": float(skm.f1_score(labels, preds, average=f1_average(labels, preds), zero_division=0)),
        "matthews": float(skm.matthews_corrcoef(labels, preds)),
    }


def correlation(kind: str, labels: np.ndarray, preds: np.ndarray) -> float:
    """``pearson`` or ``spearman`` correlation; nan when a side is constant."""
    from scipy import stats

    labels, preds = np.asarray(labels, float), np.asarray(preds, float)
    if np.ptp(labels) == 0 or np.ptp(preds) == 0:
        return float("nan")
    fn = {"pearson": stats.pearsonr, "spearman": stats.spearmanr}[kind]
    return float(fn(labels, preds)[0])


def regression_metrics(labels: np.ndarray, preds: np.ndarray) -> dict[str, float]:
    """Pearson and Spearman correlation (STS-B); nan when a side is constant."""
    return {kind: correlation(kind, labels, preds) for kind in ("pearson", "spearman")}
