"""Scores and per-example records from model outputs: unlabeled rows skipped, argmax and the binned expected value
against naive loops, and a hand-built SQuAD v2 pair (one answered, one abstained) through the span search."""

import math

import numpy as np
import pytest
from datasets import Dataset

from distillpipe.evaluate.scoring import example_ids, expected_values, score_classification, score_qa


def test_expected_values_against_a_loop():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=(7, 6))
    width = 5 / 5  # STS-B's 0..5 in 6 bins
    for row, got in zip(logits, expected_values(logits, width)):
        z = sum(math.exp(v) for v in row)
        assert got == pytest.approx(sum(math.exp(v) / z * i * width for i, v in enumerate(row)), rel=1e-12)
    # a confident bin gives its own value
    assert expected_values(np.array([[0.0, 0.0, 60.0]]), 2.5) == pytest.approx([5.0])


def test_classification_skips_unlabeled_rows_and_keeps_ids_aligned():
    ids = ["a", "b", "c", "d", "e"]
    labels = [1, -1, 0, 2, -1]  # -1: GLUE test rows without a label
    logits = np.array([[0.1, 0.9, 0.0], [5.0, 0.0, 0.0], [0.3, 0.2, 0.1], [0.0, 1.0, 0.5], [0.0, 0.0, 9.0]])
    s = score_classification(ids, labels, logits, None)
    # scored: a (gold 1, argmax 1), c (gold 0, argmax 0), d (gold 2, argmax 1)
    assert s.examples == [{"id": "a", "gold": 1, "pred": 1}, {"id": "c", "gold": 0, "pred": 0},
                          {"id": "d", "gold": 2, "pred": 1}]
    assert s.metrics["accuracy"] == pytest.approx(2 / 3)


def test_classification_without_any_label_scores_nothing():
    s = score_classification(["a", "b"], [-1, -1], np.zeros((2, 3)), None)
    assert s.metrics == {} and s.examples == []


def test_binned_regression_scores_the_expected_values():
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 2, size=(20, 6)).astype(np.float32)  # float32 as the model gives them
    gold = rng.integers(0, 6, size=20).astype(float)
    s = score_classification([str(i) for i in range(20)], gold, logits, 1.0)
    preds = [sum(math.exp(v) * i for i, v in enumerate(row)) / sum(math.exp(v) for v in row)
             for row in logits.astype(np.float64)]
    assert [r["pred"] for r in s.examples] == pytest.approx(preds, rel=1e-9)
    assert [r["gold"] for r in s.examples] == gold.tolist()
    assert s.metrics["pearson"] == pytest.approx(float(np.corrcoef(gold, preds)[0, 1]), abs=1e-9)


def test_example_ids_from_the_column_or_the_position():
    assert example_ids(Dataset.from_dict({"example_id": [7, 3], "x": [0, 0]})) == ["7", "3"]
    assert example_ids(Dataset.from_dict({"x": [0, 0, 0]})) == ["0", "1", "2"]


def test_qa_scores_and_records_by_hand():
    ctx = "Paris is in France"
    examples = [
        {"id": "q1", "context": ctx, "answers": {"text": ["France"], "answer_start": [12]}},
        {"id": "q2", "context": ctx, "answers": {"text": [], "answer_start": []}},
    ]
    # tokens: [CLS] question [SEP] Paris is in France [SEP]; question and specials are outside the context
    offsets = [[-1, -1], [-1, -1], [-1, -1], [0, 5], [6, 8], [9, 11], [12, 18], [-1, -1]]
    windows = [{"example_id": "q1", "offset_mapping": offsets}, {"example_id": "q2", "offset_mapping": offsets}]
    # q1: "France" (token 6) scores 4 + 4 = 8 against a null score of 0 + 0: margin -8, answered.
    s1 = np.array([0.0, 9, 9, 1, 0, 0, 4, 9])
    # q2: the best span "Paris" (token 3) scores 1 + 1 = 2 against a null score of 3 + 3: margin 4, abstains.
    s2 = np.array([3.0, 0, 0, 1, 0, 0, 0, 0])
    scored = score_qa(examples, windows, [s1, s2], [s1, s2], threshold=0.0)
    assert scored.metrics["exact"] == 100.0 and scored.metrics["f1"] == 100.0
    assert scored.metrics["HasAns_exact"] == 100.0 and scored.metrics["NoAns_exact"] == 100.0
    by_id = {r["id"]: r for r in scored.examples}
    assert by_id["q1"]["has_answer"] and by_id["q1"]["em"] == 1.0
    assert not by_id["q2"]["has_answer"] and by_id["q2"]["em"] == 1.0
    assert by_id["q2"]["span_em"] == 0.0  # its best non-null span ("Paris") would have been wrong
    # above q2's margin of 4 nobody abstains: q2 is answered "Paris", wrong
    loose = score_qa(examples, windows, [s1, s2], [s1, s2], threshold=5.0)
    assert loose.metrics["exact"] == 50.0
