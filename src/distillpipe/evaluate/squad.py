"""SQuAD v2 evaluation: span post-processing over windows and the official EM/F1.

The metric follows the official ``evaluate-v2.0.py`` (the SQuAD v2.0 evaluation script,
https://rajpurkar.github.io/SQuAD-explorer/, "Evaluation Script v2.0") exactly: answers are normalised
(lowercase, punctuation and articles removed, whitespace collapsed); an unanswerable question's gold is
the empty string; a question's score is the max over its gold answers; a question abstains when its
"no-answer score" (here the null margin, the script's ``na_prob``) exceeds the threshold.

Two threshold sweeps on dev, reported side by side:

* ``tuned_threshold``: the threshold we apply, on dev and then to test: the one at which F1 is the best
  any threshold really reaches on dev (``reachable_best_*``, :func:`_reachable_best`);
* ``best_exact``/``best_f1`` and their ``_thresh``: the official script's figures, transcribed from its
  ``find_best_thresh``/``find_all_best_thresh`` (:func:`official_best`), so they compare with papers.
  They can exceed what their threshold gives (see there).
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

    Scores (all EM/F1 in %): ``exact``, ``f1``, the HasAns/NoAns breakdown, all at ``tuned_threshold``, the
    no-answer threshold applied. ``threshold=None`` (dev) tunes it on ``examples``: the threshold of the best F1
    any threshold reaches (``reachable_best_f1``, equal to ``f1``); ``reachable_best_exact`` (and its
    ``_thresh``) is EM's; and the official ``best_exact``, ``best_exact_thresh``, ``best_f1``,
    ``best_f1_thresh`` are added (:func:`official_best`). With a given ``threshold`` (dev's, applied to test)
    nothing is tuned and there are no ``best_*`` fields.
    """
    golds = {ex["id"]: gold_answers(ex["answers"]["text"]) for ex in examples}
    # official make_qid_to_has_ans: any gold at all, even one that normalises to empty (whose gold is then "")
    has_ans = {ex["id"]: bool(ex["answers"]["text"]) for ex in examples}
    raw_em = {qid: max(exact_match(g, preds[qid].text) for g in gs) for qid, gs in golds.items()}
    raw_f1 = {qid: max(f1_score(g, preds[qid].text) for g in gs) for qid, gs in golds.items()}
    margins = {qid: preds[qid].null_margin for qid in golds}  # in the examples' order: official_best's ties
    n = max(len(golds), 1)
    tuned: dict[str, float] = {}
    if threshold is None:
        threshold, f1_count = _reachable_best(raw_f1, margins, has_ans)
        exact_thresh, exact_count = _reachable_best(raw_em, margins, has_ans)
        texts = {qid: preds[qid].text for qid in golds}
        best_exact, best_exact_thresh = official_best(raw_em, texts, margins, has_ans)
        best_f1, best_f1_thresh = official_best(raw_f1, texts, margins, has_ans)
        tuned = {"reachable_best_exact": 100 * exact_count / n, "reachable_best_exact_thresh": exact_thresh,
                 "reachable_best_f1": 100 * f1_count / n,
                 "best_exact": best_exact, "best_exact_thresh": best_exact_thresh,
                 "best_f1": best_f1, "best_f1_thresh": best_f1_thresh}
    em = {q: (float(not has_ans[q]) if margins[q] > threshold else raw_em[q]) for q in golds}
    f1 = {q: (float(not has_ans[q]) if margins[q] > threshold else raw_f1[q]) for q in golds}
    has = [q for q in golds if has_ans[q]]
    no = [q for q in golds if not has_ans[q]]
    res = {"exact": 100 * sum(em.values()) / n, "f1": 100 * sum(f1.values()) / n, "total": len(golds),
           "tuned_threshold": float(threshold), **tuned}
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


def official_best(raw: Mapping[str, float], texts: Mapping[str, str], margins: Mapping[str, float],
                  has_ans: Mapping[str, bool]) -> tuple[float, float]:
    """(best score in %, its threshold) as the official evaluate-v2.0.py's ``find_best_thresh`` computes them
    (``best_exact``/``best_f1`` from ``find_all_best_thresh``), rule for rule:

    * start from abstaining on every question (the count of unanswerable ones), threshold 0.0;
    * walk the questions by ascending no-answer score (a stable sort: ties keep the examples' order, which is
      the order of the script's na-prob file when it is written in dataset order), adding for each: its raw
      score if answerable; else -1 if its predicted text is non-empty *as written* (``if preds[qid]``, not
      normalised: "the" counts -1 although its raw EM/F1 against the empty gold is 1), else 0;
    * keep a running total strictly greater than the best so far, with that question's score as threshold.

    So the figure can exceed what its threshold gives: the walk may stop inside a group of tied scores (no
    threshold answers part of a tie), and an unanswerable question answered with a text that normalises to
    empty is charged -1 where answering it costs nothing. With nothing better than abstaining on everything
    the threshold is 0.0, which need not abstain on everything. :func:`_reachable_best` picks the threshold we
    apply."""
    cur = best = sum(not v for v in has_ans.values())
    best_thresh = 0.0
    for qid in sorted(margins, key=lambda q: margins[q]):
        if has_ans[qid]:
            diff = raw[qid]
        elif texts[qid]:
            diff = -1
        else:
            diff = 0
        cur += diff
        if cur > best:
            best, best_thresh = cur, margins[qid]
    return 100.0 * best / max(len(raw), 1), float(best_thresh)


def _reachable_best(scores: Mapping[str, float], margins: Mapping[str, float],
                    has_ans: Mapping[str, bool]) -> tuple[float, float]:
    """(threshold, summed score at it): the best score any threshold really gives, and a threshold giving it.

    The same walk as :func:`official_best` with what a threshold does: it answers every question whose score is
    at or below it, so only the ends of groups of equal scores are candidates (bf16 logits tie often); an
    answered unanswerable question scores its raw EM/F1 against the empty gold (1 for any text that normalises
    to empty), so answering it costs ``1 - raw``; and when nothing beats abstaining on everything, the threshold
    is one below the lowest score, which does abstain on everything."""
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
