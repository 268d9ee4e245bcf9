"""Scores and per-example records from a model's outputs on one split: the same code for students and
teachers, so their numbers are comparable and the report can pair them example by example.

* classification: argmax; accuracy, F1 and Matthews correlation (scikit-learn);
* regression cast to bins (STS-B, CMOW paper after Raffel et al.): the prediction is the expected value
  ``sum_i softmax(logits)_i * i * bin_width``; Pearson and Spearman correlation (SciPy);
* extractive QA: the official SQuAD v2 procedure (:mod:`distillpipe.evaluate.squad`), per question EM and
  F1 at the no-answer threshold.

Each :class:`Scored` keeps one record per scored example (its id, and gold/pred or em/f1), which the
``evaluate`` stage writes and ``report`` resamples for confidence intervals and paired tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distillpipe.evaluate.metrics import classification_metrics, regression_metrics
from distillpipe.evaluate.squad import SpanPrediction, best_spans, squad_v2_evaluate


@dataclass
class Scored:
    metrics: dict[str, float]
    examples: list[dict[str, Any]] = field(default_factory=list)
    """One record per scored example: ``{"id", "gold", "pred"}`` (classification, regression) or
    ``{"id", "has_answer", "em", "f1", "span_em", "span_f1"}`` (QA: at the threshold used, and of the best
    non-null span)."""


def example_ids(rows: Any) -> list[str]:
    """The rows' example ids (their position when the tokens carry none)."""
    if "example_id" in rows.column_names:
        return [str(x) for x in rows["example_id"]]
    return [str(i) for i in range(len(rows))]


def expected_values(logits: np.ndarray, bin_width: float) -> np.ndarray:
    """Expected score under the predicted bin distribution: (N, C) logits -> (N,) values."""
    from scipy.special import softmax  # here: an MLM, LM or QA stage need not import SciPy

    return softmax(logits, axis=-1) @ (np.arange(logits.shape[-1]) * bin_width)


def score_classification(ids: Sequence[str], labels: Sequence, logits: np.ndarray,
                         bin_width: float | None) -> Scored:
    """Scores of (N, C) ``logits`` against ``labels``; ``bin_width`` set: a regression task cast to bins."""
    labels = np.asarray(labels)
    keep = labels >= 0  # unlabeled rows (-1, e.g. GLUE test) are not scored
    if not keep.any():
        return Scored({})
    ids = [i for i, k in zip(ids, keep) if k]
    labels, logits = labels[keep], np.asarray(logits)[keep]
    if bin_width is not None:
        preds = expected_values(logits.astype(np.float64), bin_width)
        return Scored(regression_metrics(labels, preds),
                      [{"id": i, "gold": float(g), "pred": float(p)} for i, g, p in zip(ids, labels, preds)])
    preds = logits.argmax(-1)
    return Scored(classification_metrics(labels, preds),
                  [{"id": i, "gold": int(g), "pred": int(p)} for i, g, p in zip(ids, labels, preds)])


def score_qa(examples: Sequence[Mapping], windows: Sequence[Mapping], starts: Sequence[np.ndarray],
             ends: Sequence[np.ndarray], threshold: float | None) -> Scored:
    """SQuAD v2 scores over ``examples`` from per-window start/end logits (``threshold`` None: tuned here)."""
    preds: dict[str, SpanPrediction] = best_spans(examples, windows, starts, ends)
    scores, per_question = squad_v2_evaluate(examples, preds, threshold=threshold)
    return Scored(scores, per_question)
