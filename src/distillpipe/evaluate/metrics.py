"""GLUE-style task metrics, from scikit-learn and SciPy (not re-implemented)."""

from __future__ import annotations

import numpy as np
from scipy import stats
from sklearn import metrics as skm


def classification_metrics(labels: np.ndarray, preds: np.ndarray) -> dict[str, float]:
    """Accuracy, macro F1 (binary F1 of class 1 for two classes) and Matthews correlation."""
    labels, preds = np.asarray(labels), np.asarray(preds)
    binary = len(np.union1d(labels, preds)) <= 2 and labels.max(initial=0) <= 1
    return {
        "accuracy": float(skm.accuracy_score(labels, preds)),
        "f1": float(skm.f1_score(labels, preds, average="binary" if binary else "macro", zero_division=0)),
        "matthews": float(skm.matthews_corrcoef(labels, preds)),
    }


def regression_metrics(labels: np.ndarray, preds: np.ndarray) -> dict[str, float]:
    """Pearson and Spearman correlation (STS-B); nan when a side is constant."""
    labels, preds = np.asarray(labels, float), np.asarray(preds, float)
    if np.ptp(labels) == 0 or np.ptp(preds) == 0:
        return {"pearson": float("nan"), "spearman": float("nan")}
    return {"pearson": float(stats.pearsonr(labels, preds)[0]), "spearman": float(stats.spearmanr(labels, preds)[0])}
