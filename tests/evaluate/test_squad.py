"""SQuAD v2 metric and span post-processing: hand-checked cases, the real-format sample, and the no-answer
threshold sweeps against brute force and a transcription of the official script."""

import collections
import json
import re
import string

import numpy as np
import pytest

from distillpipe.evaluate.squad import (
    SpanPrediction,
    best_spans,
    exact_match,
    f1_score,
    normalize_answer,
    squad_v2_scores,
)


def test_normalize_answer_official_rules():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theatre") == "theatre"  # 'the' only as a whole word
    assert normalize_answer("  ") == ""


def test_em_f1_by_hand():
    assert exact_match("the Eiffel Tower", "Eiffel tower.") == 1
    # gold 'denver broncos' vs pred 'the denver broncos team': p=2/3, r=1 -> f1=0.8
    assert f1_score("Denver Broncos", "the Denver Broncos team") == pytest.approx(0.8)
    assert f1_score("", "") == 1.0 and f1_score("", "x") == 0.0 and f1_score("x", "") == 0.0
    assert f1_score("a b c", "d e") == 0.0


def _examples():
    return [
        {"id": "q1", "context": "Paris is the capital of France.", "answers": {"text": ["Paris"], "answer_start": [0]}},
        {"id": "q2", "context": "Bern is in Switzerland.", "answers": {"text": [], "answer_start": []}},
        {"id": "q3", "context": "It was built in 1889 by Eiffel.",
         "answers": {"text": ["1889", "in 1889"], "answer_start": [16, 13]}},
    ]


def test_scores_multiple_golds_and_no_answer():
    ex = _examples()
    preds = {"q1": SpanPrediction("Paris", -5.0), "q2": SpanPrediction("Bern", 3.0),
             "q3": SpanPrediction("in 1889", -1.0)}
    s = squad_v2_scores(ex, preds, threshold=0.0)
    # q1 right, q2 abstains (margin 3 > 0) which is right, q3 matches the second gold exactly.
    assert s["exact"] == pytest.approx(100.0) and s["f1"] == pytest.approx(100.0)
    assert s["HasAns_total"] == 2 and s["NoAns_total"] == 1
    s = squad_v2_scores(ex, preds, threshold=10.0)  # nobody abstains: q2 wrong
    assert s["exact"] == pytest.approx(200 / 3) and s["NoAns_exact"] == 0.0
    # Tuning picks a threshold that is at least as good as any fixed one.
    tuned = squad_v2_scores(ex, preds)
    assert tuned["f1"] == pytest.approx(100.0)
    assert -1.0 <= tuned["tuned_threshold"] < 3.0
    # The span scores ignore the abstain decision: with every question made to abstain, HasAns F1 is 0
    # but the best non-null spans (both right) still score 100.
    abstain = squad_v2_scores(ex, preds, threshold=-10.0)
    assert abstain["HasAns_f1"] == 0.0 and abstain["HasAns_span_f1"] == pytest.approx(100.0)
    assert abstain["HasAns_span_exact"] == pytest.approx(100.0)


def _window(example_id, context, spans):
    """Token windows: [CLS] then one token per (start, end) char span of the context."""
    return {"example_id": example_id, "offset_mapping": [[-1, -1]] + [list(s) for s in spans]}


def test_best_spans_over_windows():
    ctx = "aa bb cc dd"
    spans = [(0, 2), (3, 5), (6, 8), (9, 11)]
    ex = [{"id": "e", "context": ctx, "answers": {"text": ["cc dd"], "answer_start": [6]}}]
    # Two windows: the first sees tokens 0-2, the second tokens 2-3 (stride overlap on 'cc').
    wins = [_window("e", ctx, spans[:3]), _window("e", ctx, spans[2:])]
    s1, e1 = np.array([0.0, 1.0, 0.5, 0.2]), np.array([0.0, 0.1, 1.0, 0.3])
    s2, e2 = np.array([-1.0, 3.0, 0.0]), np.array([-1.0, 0.0, 4.0])
    pred = best_spans(ex, wins, [s1, s2], [e1, e2])["e"]
    assert pred.text == "cc dd"  # 3 + 4 in window 2 beats 1 + 1 in window 1
    assert pred.null_margin == pytest.approx(min(0.0, -2.0) - 7.0)
    # end before start is never chosen: the best start is 'cc', the best end 'aa' (before it)
    win = [_window("e", ctx, spans)]
    s3, e3 = np.array([0.0, 0.0, 0.0, 9.0, 0.0]), np.array([0.0, 9.0, 0.0, 0.0, 0.0])
    assert best_spans(ex, win, [s3], [e3])["e"].text == "cc"
    # a span longer than max_answer_len tokens is never chosen ('bb cc dd' is 3 tokens)
    s4, e4 = np.array([0.0, 0.0, 9.0, 0.0, 0.0]), np.array([0.0, 0.0, 0.0, 0.0, 9.0])
    assert best_spans(ex, win, [s4], [e4])["e"].text == "bb cc dd"
    short = best_spans(ex, win, [s4], [e4], max_answer_len=2)["e"].text
    assert short in {"bb", "bb cc", "cc dd", "dd"} and short != "bb cc dd"


def test_official_metric_on_real_sample(shared_data):
    data = json.loads((shared_data / "squad_v2" / "train-sample.json").read_text())
    ex = [{"id": q["id"], "context": p["context"],
           "answers": {"text": [a["text"] for a in q["answers"]],
                       "answer_start": [a["answer_start"] for a in q["answers"]]}}
          for art in data["data"] for p in art["paragraphs"] for q in p["qas"]]
    assert len(ex) == 2013
    gold = {e["id"]: SpanPrediction(e["answers"]["text"][0] if e["answers"]["text"] else "", -1.0) for e in ex}
    s = squad_v2_scores(ex, gold, threshold=0.0)
    assert s["exact"] == pytest.approx(100.0) and s["f1"] == pytest.approx(100.0)
    abstain = {e["id"]: SpanPrediction("x", 1.0) for e in ex}
    s = squad_v2_scores(ex, abstain, threshold=0.0)
    assert s["NoAns_total"] == 1013 and s["exact"] == pytest.approx(100 * 1013 / 2013)


def _brute_force_best(examples, preds, key):
    """Every threshold that separates the margins differently, scored by the metric itself."""
    margins = sorted({p.null_margin for p in preds.values()})
    candidates = [margins[0] - 1.0, *margins]
    return max(squad_v2_scores(examples, preds, threshold=t)[key] for t in candidates)


def _qa(qid, golds):
    return {"id": qid, "answers": {"text": golds}}


def test_tied_scores_official_sweep_stops_inside_the_tie():
    """q1 (answerable, right span) and q2 (unanswerable, answered "Paris") tie at margin 0.0; q3 (unanswerable,
    "Rome") has 1.0.

    Official, file order q1, q2, q3: start at 2 (the unanswerable ones), threshold 0.0; q1 +1 -> 3 > 2: best 3 at
    0.0; q2 -1 -> 2; q3 -1 -> 1. best_f1 = best_exact = 100 * 3/3 = 100.0 at 0.0.
    Reachable: no threshold answers q1 without q2: t < 0 abstains on all (q2, q3 right: 2); t in [0, 1) answers
    q1 and q2 (q1, q3 right: 2); t >= 1 answers all (q1: 1). Best 2/3 = 66.67, first reached below every margin:
    tuned_threshold = 0.0 - 1 = -1.0, and EM/F1 at it are 66.67.
    File order q2, q1, q3: q2 -1 -> 1; q1 +1 -> 2, not > 2; q3 -> 1: official best 2/3 = 66.67 at 0.0."""
    preds = {"q1": SpanPrediction("Warsaw", 0.0), "q2": SpanPrediction("Paris", 0.0), "q3": SpanPrediction("Rome", 1.0)}
    examples = [_qa("q1", ["Warsaw"]), _qa("q2", []), _qa("q3", [])]
    s = squad_v2_scores(examples, preds)
    assert (s["best_f1"], s["best_f1_thresh"], s["best_exact"], s["best_exact_thresh"]) == (100.0, 0.0, 100.0, 0.0)
    assert s["tuned_threshold"] == -1.0
    assert s["f1"] == s["exact"] == s["reachable_best_f1"] == s["reachable_best_exact"] == pytest.approx(200 / 3)
    assert s["reachable_best_exact_thresh"] == -1.0
    # what the official threshold really gives: 2/3, not its reported 100
    assert squad_v2_scores(examples, preds, threshold=s["best_f1_thresh"])["f1"] == pytest.approx(200 / 3)
    swapped = squad_v2_scores([examples[1], examples[0], examples[2]], preds)
    assert (swapped["best_f1"], swapped["best_f1_thresh"]) == (pytest.approx(200 / 3), 0.0)


def test_answer_normalising_to_empty_is_charged_by_the_official_sweep():
    """q1 unanswerable answered "the" (margin -1.0), q2 answerable answered right (0.5), q3 unanswerable answered
    "Rome" (2.0). "the" normalises to "", so answering q1 scores raw EM/F1 1 against its empty gold.

    Official: start 2 at 0.0; q1 is unanswerable and "the" is a non-empty string: -1 -> 1; q2 +1 -> 2, not > 2;
    q3 -1 -> 1. best_f1 = best_exact = 100 * 2/3 = 66.67 at 0.0.
    Reachable: t in [0.5, 2) answers q1 (1: "the" == "" normalised), q2 (1) and abstains on q3 (1): 3/3 = 100 at
    tuned_threshold 0.5.
    With q1 answered "" (the raw empty string) the official sweep charges 0: 2, then q2 -> 3 > 2: 100 at 0.5."""
    examples = [_qa("q1", []), _qa("q2", ["Warsaw"]), _qa("q3", [])]
    preds = {"q1": SpanPrediction("the", -1.0), "q2": SpanPrediction("Warsaw", 0.5), "q3": SpanPrediction("Rome", 2.0)}
    s = squad_v2_scores(examples, preds)
    assert (s["best_f1"], s["best_f1_thresh"]) == (pytest.approx(200 / 3), 0.0)
    assert (s["best_exact"], s["best_exact_thresh"]) == (pytest.approx(200 / 3), 0.0)
    assert (s["tuned_threshold"], s["f1"], s["exact"], s["reachable_best_f1"]) == (0.5, 100.0, 100.0, 100.0)
    assert (s["reachable_best_exact"], s["reachable_best_exact_thresh"]) == (100.0, 0.5)
    empty = squad_v2_scores(examples, preds | {"q1": SpanPrediction("", -1.0)})
    assert (empty["best_f1"], empty["best_f1_thresh"], empty["best_exact"]) == (100.0, 0.5, 100.0)


def test_nothing_beats_abstaining_official_threshold_is_zero():
    """q1 answerable ("Warsaw") answered "Paris" (margin -2.0), q2 unanswerable answered "Rome" (3.0).

    Official: start 1 at 0.0; q1 +0 -> 1, not > 1; q2 -1 -> 0. best_f1 = best_exact = 100 * 1/2 = 50.0 at 0.0
    (a threshold that answers q1, which abstaining on everything would not).
    Reachable: abstaining on all gives 1 (q2); t in [-2, 3) answers q1 (wrong): still 1, not better; t >= 3: 0.
    Best 50.0 first reached below every margin: tuned_threshold = -2.0 - 1 = -3.0."""
    examples = [_qa("q1", ["Warsaw"]), _qa("q2", [])]
    preds = {"q1": SpanPrediction("Paris", -2.0), "q2": SpanPrediction("Rome", 3.0)}
    s = squad_v2_scores(examples, preds)
    assert (s["best_f1"], s["best_f1_thresh"], s["best_exact"], s["best_exact_thresh"]) == (50.0, 0.0, 50.0, 0.0)
    assert (s["tuned_threshold"], s["f1"], s["exact"]) == (-3.0, 50.0, 50.0)
    assert (s["reachable_best_exact"], s["reachable_best_exact_thresh"]) == (50.0, -3.0)
    assert s["NoAns_exact"] == 100.0 and s["HasAns_exact"] == 0.0  # abstains on both


def test_tuned_fields_only_where_tuned():
    ex = _examples()
    preds = {"q1": SpanPrediction("Paris", -5.0), "q2": SpanPrediction("Bern", 3.0),
             "q3": SpanPrediction("in 1889", -1.0)}
    given = squad_v2_scores(ex, preds, threshold=0.5)
    assert given["tuned_threshold"] == 0.5
    assert not [k for k in given if k.startswith(("best_", "reachable_"))]  # test is never tuned on itself


def test_threshold_search_never_splits_a_group_of_tied_margins():
    """q1 (answerable, right span) and q2 (unanswerable) tie at margin 0.0: no threshold answers q1 without
    also answering q2. The official sweep stops between them and reports F1 100 * 3/3 at threshold 0.0,
    where the real F1 is 2/3; the applied threshold is one that gives its F1."""
    examples = [{"id": "q1", "answers": {"text": ["Warsaw"]}}, {"id": "q2", "answers": {"text": []}},
                {"id": "q3", "answers": {"text": []}}]
    preds = {"q1": SpanPrediction("Warsaw", 0.0), "q2": SpanPrediction("Paris", 0.0),
             "q3": SpanPrediction("Rome", 1.0)}
    tuned = squad_v2_scores(examples, preds)
    at_threshold = squad_v2_scores(examples, preds, threshold=tuned["tuned_threshold"])
    assert tuned["f1"] == at_threshold["f1"] == pytest.approx(100 * 2 / 3)  # reported = what the threshold gives
    assert tuned["f1"] == pytest.approx(_brute_force_best(examples, preds, "f1"))
    assert tuned["reachable_best_exact"] == pytest.approx(_brute_force_best(examples, preds, "exact"))


def _random_set(rng, n):
    """Few distinct margins (many ties), golds and predictions that normalise to empty, the raw empty string."""
    texts = ["red house", "the red house", "house", "the", "A", "", "blue car", "."]
    examples, preds = [], {}
    for i in rng.permutation(n):
        golds = [] if rng.random() < 0.4 else list(rng.choice(["red house", "the house", "red", "an"],
                                                              size=int(rng.integers(1, 3))))
        examples.append({"id": f"q{i}", "answers": {"text": golds}})
        margin = float(rng.integers(-2, 3)) if rng.random() < 0.8 else float(rng.normal())
        preds[f"q{i}"] = SpanPrediction(str(rng.choice(texts)), margin)
    return examples, preds


def test_threshold_search_matches_brute_force_on_random_ties():
    rng = np.random.default_rng(0)
    for _ in range(50):
        examples, preds = _random_set(rng, int(rng.integers(3, 12)))
        tuned = squad_v2_scores(examples, preds)
        assert tuned["f1"] == pytest.approx(_brute_force_best(examples, preds, "f1"))
        assert tuned["reachable_best_f1"] == pytest.approx(tuned["f1"])
        assert tuned["reachable_best_exact"] == pytest.approx(_brute_force_best(examples, preds, "exact"))
        assert tuned["f1"] == pytest.approx(
            squad_v2_scores(examples, preds, threshold=tuned["tuned_threshold"])["f1"])
        assert tuned["reachable_best_exact"] == pytest.approx(
            squad_v2_scores(examples, preds, threshold=tuned["reachable_best_exact_thresh"])["exact"])


# --- A straight transcription of the official evaluate-v2.0.py (SQuAD v2.0 evaluation script): normalize_answer,
# compute_exact, compute_f1, get_raw_scores, apply_no_ans_threshold, find_best_thresh, written independently of
# distillpipe.evaluate.squad, on dicts as the script reads them (dataset questions, preds {qid: text}, na_probs). ---

def _official_normalize(s):
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _official_exact(a_gold, a_pred):
    return int(_official_normalize(a_gold) == _official_normalize(a_pred))


def _official_f1(a_gold, a_pred):
    gold_toks = _official_normalize(a_gold).split() if a_gold else []
    pred_toks = _official_normalize(a_pred).split() if a_pred else []
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def _official_raw_scores(qas, preds):
    exact_scores, f1_scores = {}, {}
    for qa in qas:
        gold_answers = [a for a in qa["answers"]["text"] if _official_normalize(a)] or [""]
        exact_scores[qa["id"]] = max(_official_exact(a, preds[qa["id"]]) for a in gold_answers)
        f1_scores[qa["id"]] = max(_official_f1(a, preds[qa["id"]]) for a in gold_answers)
    return exact_scores, f1_scores


def _official_apply(scores, na_probs, qid_to_has_ans, na_prob_thresh):
    return {qid: float(not qid_to_has_ans[qid]) if na_probs[qid] > na_prob_thresh else s
            for qid, s in scores.items()}


def _official_find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for qid in qid_list:
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        elif preds[qid]:
            diff = -1
        else:
            diff = 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def test_best_fields_equal_the_official_script_on_random_sets():
    rng = np.random.default_rng(1)
    differs = 0
    for _ in range(300):
        examples, spans = _random_set(rng, int(rng.integers(1, 15)))
        preds = {q: p.text for q, p in spans.items()}
        na_probs = {e["id"]: spans[e["id"]].null_margin for e in examples}  # the na-prob file, in dataset order
        qid_to_has_ans = {e["id"]: bool(e["answers"]["text"]) for e in examples}  # make_qid_to_has_ans
        exact_raw, f1_raw = _official_raw_scores(examples, preds)
        best_exact, exact_thresh = _official_find_best_thresh(preds, exact_raw, na_probs, qid_to_has_ans)
        best_f1, f1_thresh = _official_find_best_thresh(preds, f1_raw, na_probs, qid_to_has_ans)
        ours = squad_v2_scores(examples, spans)
        assert (ours["best_exact"], ours["best_exact_thresh"]) == (best_exact, exact_thresh)
        assert (ours["best_f1"], ours["best_f1_thresh"]) == (best_f1, f1_thresh)
        # and EM/F1 at the threshold we apply are the official script's at --na-prob-thresh tuned_threshold
        t = ours["tuned_threshold"]
        n = len(examples)
        assert ours["exact"] == pytest.approx(100.0 * sum(_official_apply(exact_raw, na_probs, qid_to_has_ans, t)
                                                           .values()) / n, abs=1e-12)
        assert ours["f1"] == pytest.approx(100.0 * sum(_official_apply(f1_raw, na_probs, qid_to_has_ans, t)
                                                        .values()) / n, abs=1e-12)
        differs += (ours["best_f1"], ours["best_f1_thresh"]) != (ours["reachable_best_f1"], t)
    assert differs > 30  # the random sets do exercise the rules where the two sweeps part
