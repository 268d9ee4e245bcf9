"""A teacher worth distilling from: the trivial baselines (against naive counts), the interval rule, the warning of a
deliberately undertrained teacher, and the report's marks."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from _tiny import finetune_params, make_classification_tokens, make_tiny_bert_dir

from distillpipe.config.base import build
from distillpipe.config.teacher_finetune import TeacherFinetuneTaskConfig
from distillpipe.evaluate.baseline import teacher_check, trivial_baseline
from distillpipe.evaluate.report import Bootstrap, render_results
from distillpipe.train.teacher_finetune import finetune_teacher


def _records(gold, pred):
    return [{"id": f"e{i}", "gold": int(g), "pred": int(p)} for i, (g, p) in enumerate(zip(gold, pred))]


def test_classification_baseline_is_the_train_majority_scored_on_dev():
    train = [2] * 50 + [0] * 30 + [1] * 20
    gold = np.random.default_rng(0).integers(0, 3, 200)
    dev = _records(gold, gold)  # the teacher's own predictions do not matter to the baseline
    what, value = trivial_baseline("classification", "accuracy", dev, train)
    assert "2" in what and value == pytest.approx(np.mean(gold == 2))  # train's majority, not dev's
    assert trivial_baseline("classification", "matthews", dev, train)[1] == 0.0  # a constant has no correlation
    # without train labels: dev's own majority (an upper bound of a train majority's accuracy)
    assert trivial_baseline("classification", "accuracy", dev)[1] == pytest.approx(np.bincount(gold).max() / 200)


def test_qa_baseline_is_always_abstaining():
    has = [True, False, False, True, False]
    dev = [{"id": str(i), "has_answer": h, "em": 1.0, "f1": 1.0, "span_em": 1.0, "span_f1": 1.0}
           for i, h in enumerate(has)]
    assert trivial_baseline("qa", "f1", dev)[1] == pytest.approx(100 * 3 / 5)
    assert trivial_baseline("qa", "exact", dev)[1] == pytest.approx(100 * 3 / 5)
    assert trivial_baseline("regression", "pearson", [])[1] == 0.0
    assert trivial_baseline("corpus", "mlm_accuracy", []) is None


def test_clearly_above_means_the_interval_clears_the_baseline():
    rng = np.random.default_rng(1)
    gold = rng.integers(0, 2, 400)
    train = gold.tolist()

    def check(pred):
        recs = _records(gold, pred)
        return teacher_check("classification", "accuracy", float(np.mean(gold == pred)), recs, train)

    good = check(np.where(rng.random(400) < 0.9, gold, 1 - gold))
    assert good["clearly_above"] and good["teacher_low"] > good["value"]
    assert not check(np.full(400, np.bincount(gold).argmax()))["clearly_above"]  # the baseline itself
    # above the baseline by a point on 400 examples: inside the noise, so not clearly above
    share = np.bincount(gold).max() / 400
    near = np.full(400, np.bincount(gold).argmax())
    flip = np.flatnonzero(near != gold)[:4]
    near[flip] = gold[flip]
    c = check(near)
    assert c["teacher"] == pytest.approx(share + 0.01) and not c["clearly_above"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    base = make_tiny_bert_dir(root / "base")
    return base, make_classification_tokens(root / "tokens", base, n_train=128, n_dev=64)


def test_an_undertrained_teacher_is_named_and_a_student_above_it_is_marked(toy, tmp_path, caplog):
    base, tokens = toy
    # one step at a negligible learning rate: the head stays at its random init
    cfg = build(TeacherFinetuneTaskConfig, finetune_params(epochs=1, max_train_rows=8, lr=1e-9), "t")
    with caplog.at_level(logging.WARNING, logger="distillpipe.train.teacher_finetune"):
        s = finetune_teacher("toy", base, tokens, tokens, cfg, "cpu", tmp_path / "out", tmp_path / "ck",
                             tmp_path / "live")
    assert s.weak and "warning: teacher toy" in s.one_line() and "not clearly above" in s.one_line()
    assert any("not clearly above the trivial baseline" in r.getMessage() for r in caplog.records)
    recorded = json.loads((tmp_path / "out" / "metrics.json").read_text())
    check = recorded["baseline"]
    assert check["metric"] == "accuracy" and not check["clearly_above"]
    assert check["value"] == pytest.approx(0.5) and check["teacher"] == recorded["accuracy"]  # balanced labels

    # the report: the teacher as evaluate passes it on, a student above it, another below
    def result(run, dev):
        return {"run": run, "student": "cmow_hybrid", "dataset": "toy", "task_type": "classification",
                "note": "n", "primary_metric": "accuracy", "dev": {"accuracy": dev}, "test": None,
                "params": {"total": 10, "without_embeddings": 5}, "speed": None,
                "teacher": {"name": "toy", "dev": {"accuracy": recorded["accuracy"]}, "test": None,
                            "params": recorded["params"], "baseline": check}}

    above, below = min(1.0, recorded["accuracy"] + 0.2), max(0.0, recorded["accuracy"] - 0.2)
    text = render_results([result("good", above), result("bad", below)], [],
                          bootstrap=Bootstrap(200, 0.95, 0), out_md=tmp_path / "r.md", out_png=tmp_path / "r.png")
    warnings = text.split("## Warnings", 1)[1].split("## All runs", 1)[0]
    assert "teacher:toy" in warnings and "not clearly above the trivial baseline" in warnings
    assert "**good** beats its teacher on dev" in warnings and "undertrained?" in warnings
    assert "**bad**" not in warnings
    rows = {line.split("|")[2].strip(): line for line in text.split("## All runs", 1)[1].splitlines()
            if line.startswith("| toy")}
    assert "beats its teacher on dev" in rows["good"] and "beats its teacher" not in rows["bad"]


def test_a_report_without_weak_teachers_has_no_warnings(tmp_path):
    r = {"run": "s", "student": "cmow_hybrid", "dataset": "d", "task_type": "classification", "note": "n",
         "primary_metric": "accuracy", "dev": {"accuracy": 0.7}, "test": None,
         "params": {"total": 10, "without_embeddings": 5}, "speed": None,
         "teacher": {"name": "d", "dev": {"accuracy": 0.9}, "test": None, "params": None,
                     "baseline": {"metric": "accuracy", "predicts": "x", "value": 0.5, "teacher": 0.9,
                                  "teacher_low": 0.85, "confidence": 0.95, "clearly_above": True}}}
    text = render_results([r], [], bootstrap=Bootstrap(200, 0.95, 0), out_md=tmp_path / "r.md",
                          out_png=tmp_path / "r.png")
    assert "## Warnings" not in text
