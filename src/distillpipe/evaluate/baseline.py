"""Is a teacher worth distilling from? Its dev score beside the score a trivial predictor gets on the same examples.

A student distilled from a teacher that is barely better than guessing learns the guess; and a report that shows a
student above its teacher says the teacher was short of training, not that distillation beat it. So after
``teacher_finetune`` scores its dev split, :func:`teacher_check` compares the headline score with the trivial
predictor of the task, scored by the same code on the same records (:mod:`distillpipe.evaluate.intervals`):

* classification: the majority class of the train labels, predicted for every dev example (its accuracy is the
  majority share; its Matthews correlation is 0; its F1 whatever that constant gives);
* regression (STS-B): a constant score; its Pearson/Spearman correlation is undefined, taken as 0 (no ranking);
* extractive QA (SQuAD v2): always abstaining (the null answer for every question): EM = F1 = the share of
  unanswerable questions.

The teacher is **clearly above** the baseline when the low end of the 95% bootstrap interval of its dev score
(BCa, as the report draws it) is above the baseline's score. Otherwise ``teacher_finetune`` logs a warning, records
it beside the teacher's scores (``metrics.json``: ``baseline``), and the report shows it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from distillpipe.evaluate.intervals import RecordsError, interval, point

CONFIDENCE = 0.95
RESAMPLES = 1000
SEED = 0
DOCS = "docs/your-data.md#a-teacher-worth-distilling-from"
"""Where the warnings point a user (what undertrains a teacher, and what to raise)."""


def trivial_baseline(task_type: str, metric: str, dev: Sequence[Mapping[str, Any]],
                     train_labels: Sequence[int] | None = None) -> tuple[str, float] | None:
    """``(what it predicts, its dev score)`` of the task's trivial predictor, in the units of the metrics files;
    None for a task without one here (an MLM head)."""
    if task_type == "classification":
        if not dev:
            return None
        labels = [int(x) for x in (train_labels if train_labels is not None and len(train_labels) else
                                   [r["gold"] for r in dev]) if int(x) >= 0]
        majority = Counter(labels).most_common(1)[0][0]
        value = point(metric, task_type, [{"gold": r["gold"], "pred": majority} for r in dev])
        return f"the majority class ({majority}) for every example", value
    if task_type == "regression":
        return "a constant score (no ranking: correlation 0)", 0.0
    if task_type == "qa":
        if not dev:
            return None
        abstain = [{**r, "em": float(not r["has_answer"]), "f1": float(not r["has_answer"])} for r in dev]
        return "no answer for every question", point(metric, task_type, abstain)
    return None


def teacher_check(task_type: str, metric: str, value: float, dev: Sequence[Mapping[str, Any]],
                  train_labels: Sequence[int] | None = None) -> dict[str, Any] | None:
    """The teacher's dev ``value`` of ``metric`` against the trivial baseline: what the baseline predicts and
    scores, the low end of the teacher's interval, and ``clearly_above``. None when there is no baseline."""
    base = trivial_baseline(task_type, metric, dev, train_labels)
    if base is None or not math.isfinite(value):
        return None
    what, score = base
    try:
        low = interval(metric, task_type, dev, n_resamples=RESAMPLES, confidence=CONFIDENCE, seed=SEED,
                       key=f"teacher-baseline/{metric}").low
    except RecordsError:
        low = math.nan  # too few examples for an interval: only the point estimate counts
    bound = low if math.isfinite(low) else value
    return {"metric": metric, "predicts": what, "value": score, "teacher": value, "teacher_low": low,
            "confidence": CONFIDENCE, "clearly_above": bool(bound > score)}


def weak_teacher_message(name: str, check: Mapping[str, Any]) -> str:
    """One line naming a teacher that is not clearly above its baseline."""
    m = check["metric"]
    low = check.get("teacher_low")
    interval_text = (f", {100 * check['confidence']:g}% interval from {low:.4g}" if low is not None
                     and math.isfinite(low) else "")
    return (f"teacher {name}: dev {m} {check['teacher']:.4g}{interval_text} is not clearly above the trivial "
            f"baseline ({check['predicts']}: {check['value']:.4g}); students distilled from it learn little more "
            f"than that. Undertrained? More rows or epochs for it (teacher_finetune.tasks.{name}), see {DOCS}")
