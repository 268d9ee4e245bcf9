"""SQuAD v2 evaluation: span post-processing over windows and the official EM/F1.

The metric follows the official ``evaluate-v2.0.py`` exactly: answers are normalised (lowercase,
punctuation and articles removed, whitespace collapsed); an unanswerable question's gold is the
empty string; a question's score is the max over its gold answers; the no-answer threshold is
applied to a per-question "no-answer score" and can be tuned on dev (``best_thresh``).
"""

from __future__ import annotations

import collections
import re
import string
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lowercase, remove punctuation, articles and extra whitespace (official script)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_score(gold: str, pred: str) -> float:
    gold_toks = normalize_answer(gold).split()
    pred_toks = normalize_answer(pred).split()
    if not gold_toks or not pred_toks:
        # No-answer questions: F1 is 1 if both are empty, else 0.
        return float(gold_toks == pred_toks)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def gold_answers(answer_texts: Iterable[str]) -> list[str]:
    golds = [a for a in answer_texts if normalize_answer(a)]
    return golds or [""]


@dataclass(frozen=True)
class SpanPrediction:
    text: str
    """Best non-null span text ('' when no valid span exists)."""
    null_margin: float
    """null score - best span score: the no-answer score; answer '' when it exceeds the threshold."""


def best_spans(examples: Sequence[Mapping], windows: Sequence[Mapping], start_logits: Sequence[np.ndarray],
               end_logits: Sequence[np.ndarray], n_best: int = 20,
               max_answer_len: int = 30) -> dict[str, SpanPrediction]:
    """Best span per example over all its windows.

    ``examples``: rows with ``id`` and ``context``. ``windows``: token rows with ``example_id`` and
    ``offset_mapping`` ([-1, -1] outside the context). Candidate spans start <= end, lie within the
    context and span at most ``max_answer_len`` tokens; score = start + end logit. The null score
    of an example is the minimum over its windows of start[0] + end[0] (the [CLS] logits).
    """
    by_example: dict[str, list[int]] = collections.defaultdict(list)
    for w, win in enumerate(windows):
        by_example[win["example_id"]].append(w)
    out = {}
    for ex in examples:
        best_score, best_text, null = -np.inf, "", np.inf
        for w in by_example.get(ex["id"], []):
            s, e = np.asarray(start_logits[w], np.float64), np.asarray(end_logits[w], np.float64)
            offsets = np.asarray(windows[w]["offset_mapping"]).reshape(-1, 2)
            n = min(len(offsets), len(s))
            s, e, offsets = s[:n], e[:n], offsets[:n]
            null = min(null, s[0] + e[0])
            in_ctx = offsets[:, 0] >= 0
            top_s = [i for i in np.argsort(-s)[:n_best] if in_ctx[i]]
            top_e = [j for j in np.argsort(-e)[:n_best] if in_ctx[j]]
            for i in top_s:
                for j in top_e:
                    if j < i or j - i + 1 > max_answer_len:
                        continue
                    score = s[i] + e[j]
                    if score > best_score:
                        best_score = score
                        best_text = ex["context"][offsets[i, 0]:offsets[j, 1]]
        if not np.isfinite(null):
            null = 0.0  # no window at all (should not happen): count as no answer
        margin = null - best_score if np.isfinite(best_score) else np.inf
        out[ex["id"]] = SpanPrediction(best_text, float(margin))
    return out


def squad_v2_scores(examples: Sequence[Mapping], preds: Mapping[str, SpanPrediction],
                    threshold: float | None = None) -> dict[str, float]:
    """Official EM/F1 (in %), HasAns/NoAns breakdown, and the dev-tuned no-answer threshold (see
    :func:`squad_v2_evaluate`)."""
    return squad_v2_evaluate(examples, preds, threshold)[0]


def squad_v2_evaluate(examples: Sequence[Mapping], preds: Mapping[str, SpanPrediction],
                      threshold: float | None = None) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(scores, per question ``{"id", "has_answer", "em", "f1", "span_em", "span_f1"}``: em/f1 at the threshold
    used, span_em/span_f1 of the best non-null span).

    Scores: EM/F1 in %, the HasAns/NoAns breakdown and ``threshold``. ``threshold=None`` tunes it on
    ``examples`` (the official ``best_f1_thresh`` sweep, done between distinct no-answer scores: see
    :func:`_best_threshold`); scores are then reported at the F1-best threshold, and ``best_exact`` /
    ``best_exact_thresh`` give EM at its own best threshold, as the official script reports them too.
    With a given ``threshold`` (dev's, applied to test) there is no tuning and no ``best_exact``.
    """
    golds = {ex["id"]: gold_answers(ex["answers"]["text"]) for ex in examples}
    has_ans = {qid: g != [""] for qid, g in golds.items()}
    raw_em = {qid: max(exact_match(g, preds[qid].text) for g in gs) for qid, gs in golds.items()}
    raw_f1 = {qid: max(f1_score(g, preds[qid].text) for g in gs) for qid, gs in golds.items()}
    margins = {qid: preds[qid].null_margin for qid in golds}
    best_exact: dict[str, float] = {}
    if threshold is None:
        threshold, _ = _best_threshold(raw_f1, margins, has_ans)
        exact_thresh, exact_count = _best_threshold(raw_em, margins, has_ans)
        best_exact = {"best_exact": 100 * exact_count / max(len(golds), 1), "best_exact_thresh": exact_thresh}
    em = {q: (float(not has_ans[q]) if margins[q] > threshold else raw_em[q]) for q in golds}
    f1 = {q: (float(not has_ans[q]) if margins[q] > threshold else raw_f1[q]) for q in golds}
    n = max(len(golds), 1)
    has = [q for q in golds if has_ans[q]]
    no = [q for q in golds if not has_ans[q]]
    res = {"exact": 100 * sum(em.values()) / n, "f1": 100 * sum(f1.values()) / n, "total": len(golds),
           "threshold": float(threshold), **best_exact}
    if has:
        res |= {"HasAns_exact": 100 * np.mean([em[q] for q in has]), "HasAns_f1": 100 * np.mean([f1[q] for q in has]),
                "HasAns_total": len(has),
                # reading skill apart from the abstain decision: the best non-null span of every answerable
                # question, as if the threshold answered all of them (not an official figure)
                "HasAns_span_exact": 100 * np.mean([raw_em[q] for q in has]),
                "HasAns_span_f1": 100 * np.mean([raw_f1[q] for q in has])}
    if no:
        res |= {"NoAns_exact": 100 * np.mean([em[q] for q in no]), "NoAns_f1": 100 * np.mean([f1[q] for q in no]),
                "NoAns_total": len(no)}
    per_question = [{"id": str(q), "has_answer": bool(has_ans[q]), "em": float(em[q]), "f1": float(f1[q]),
                     "span_em": float(raw_em[q]), "span_f1": float(raw_f1[q])} for q in golds]
    return {k: float(v) for k, v in res.items()}, per_question


def _best_threshold(scores: Mapping[str, float], margins: Mapping[str, float],
                    has_ans: Mapping[str, bool]) -> tuple[float, float]:
    """(threshold, summed score at it): the official find_best_thresh sweep over the sorted no-answer
    scores, with one correction: a threshold answers every question whose score is at or below it, so
    it is only considered at the end of a group of equal scores. (The official script can stop inside
    such a group and report a score that its threshold does not give; bf16 logits tie often.)"""
    num_no_ans = sum(not v for v in has_ans.values())
    cur = best = float(num_no_ans)  # threshold below every margin: everything predicted as no-answer
    best_thresh = min(margins.values(), default=0.0) - 1.0
    order = sorted(margins, key=lambda q: margins[q])
    for k, qid in enumerate(order):
        # Answering instead of abstaining: gain the raw score, lose the 1 a no-answer question had.
        cur += scores[qid] - (0.0 if has_ans[qid] else 1.0)
        if k + 1 < len(order) and margins[order[k + 1]] == margins[qid]:
            continue  # still inside a group of tied margins: no threshold separates them
        if cur > best:
            best, best_thresh = cur, margins[qid]
    return (float(best_thresh) if np.isfinite(best_thresh) else 0.0), best
