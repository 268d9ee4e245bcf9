"""SQuAD v2 metric and span post-processing: hand-checked cases and the real-format sample."""

import json

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
    assert -1.0 <= tuned["threshold"] < 3.0
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


def test_threshold_search_never_splits_a_group_of_tied_margins():
    """q1 (answerable, right span) and q2 (unanswerable) tie at margin 0.0: no threshold answers q1 without
    also answering q2. The official sweep stops between them and reports F1 100 * 3/3 at threshold 0.0,
    where the real F1 is 2/3."""
    examples = [{"id": "q1", "answers": {"text": ["Warsaw"]}}, {"id": "q2", "answers": {"text": []}},
                {"id": "q3", "answers": {"text": []}}]
    preds = {"q1": SpanPrediction("Warsaw", 0.0), "q2": SpanPrediction("Paris", 0.0),
             "q3": SpanPrediction("Rome", 1.0)}
    tuned = squad_v2_scores(examples, preds)
    at_threshold = squad_v2_scores(examples, preds, threshold=tuned["threshold"])
    assert tuned["f1"] == at_threshold["f1"] == pytest.approx(100 * 2 / 3)  # reported = what the threshold gives
    assert tuned["f1"] == pytest.approx(_brute_force_best(examples, preds, "f1"))
    assert tuned["best_exact"] == pytest.approx(_brute_force_best(examples, preds, "exact"))


def test_threshold_search_matches_brute_force_on_random_ties():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(3, 12))
        examples, preds = [], {}
        for i in range(n):
            answerable = bool(rng.random() < 0.6)
            examples.append({"id": f"q{i}", "answers": {"text": ["red house"] if answerable else []}})
            text = str(rng.choice(["red house", "house", "blue car"]))
            preds[f"q{i}"] = SpanPrediction(text, float(rng.integers(-2, 3)))  # few distinct margins: many ties
        tuned = squad_v2_scores(examples, preds)
        assert tuned["f1"] == pytest.approx(_brute_force_best(examples, preds, "f1"))
        assert tuned["best_exact"] == pytest.approx(_brute_force_best(examples, preds, "exact"))
        assert tuned["f1"] == pytest.approx(squad_v2_scores(examples, preds, threshold=tuned["threshold"])["f1"])
