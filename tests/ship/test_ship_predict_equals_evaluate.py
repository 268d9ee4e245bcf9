"""An exported student predicts what the pipeline's own evaluate stage predicted, example by example, from raw
text (the prepared test split, re-tokenized by predict): classification labels, regression scores, QA answers at
the dev-tuned threshold, and so the same scores. Through the command line, as a user runs it."""

import json

import numpy as np
import pytest
import torch
from datasets import load_from_disk
from scipy.special import softmax
from typer.testing import CliRunner

from distillpipe.cli import app
from distillpipe.evaluate.squad import exact_match, f1_score, gold_answers
from distillpipe.evaluate.student import _outputs
from distillpipe.ship.predict import Predictor, Row

runner = CliRunner()


def _tsv(path, header, rows):
    clean = [[str(c).replace("\t", " ").replace("\n", " ") for c in r] for r in rows]
    path.write_text("\n".join("\t".join(r) for r in [header, *clean]) + "\n")
    return path


def _predict_cli(folder, tsv, out, *extra):
    res = runner.invoke(app, ["predict", str(folder), "--input", str(tsv), "--out", str(out), *extra])
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in out.read_text().splitlines()]


def _evaluated(r, split="test"):
    return {rec["id"]: rec for rec in json.loads(r["predictions"].read_text())["student"][split]}


def test_classification_labels_equal_evaluate(cls_run, exported, tmp_path):
    test = load_from_disk(str(cls_run["prepared"]))["test"]
    tsv = _tsv(tmp_path / "test.tsv", ["id", "sentence"], zip(test["id"], test["text_a"]))
    got = _predict_cli(exported["classification"], tsv, tmp_path / "p.jsonl")
    evaluated = _evaluated(cls_run)
    assert [g["id"] for g in got] == list(test["id"]) and set(evaluated) == set(test["id"])
    assert {g["id"]: g["label_id"] for g in got} == {i: e["pred"] for i, e in evaluated.items()}
    assert len({g["label_id"] for g in got}) == 2, "a constant predictor would make this test vacuous"
    for g in got:
        assert g["label"] == ["neg", "pos"][g["label_id"]]
        assert sum(g["probabilities"].values()) == pytest.approx(1.0)
        assert max(g["probabilities"], key=g["probabilities"].get) == g["label"]
    # the two 50-word test sentences are cut to 32 tokens, as the tokenize stage cut them
    assert [g["id"] for g in got if g.get("truncated")] == ["test-0", "test-1"]
    # and the probabilities are those of evaluate's own forward over the tokens stage's rows
    tokens = load_from_disk(str(cls_run["tokens"]))["test"]
    logits = {}
    for idx, _, _, out in _outputs(cls_run["model"], tokens, kind="classification", pad_id=0,
                                   device=torch.device("cpu"), batch_size=8, pairs=False):
        logits |= {tokens[int(i)]["example_id"]: row for i, row in zip(idx, out.logits.numpy())}
    for g in got:
        np.testing.assert_allclose(list(g["probabilities"].values()), softmax(logits[g["id"]]), atol=1e-6)
    metrics = json.loads(cls_run["metrics"].read_text())["test"]
    gold = dict(zip(test["id"], test["label"]))
    assert sum(g["label_id"] == gold[g["id"]] for g in got) / len(got) == pytest.approx(metrics["accuracy"])


def test_regression_scores_equal_evaluate(reg_run, exported, tmp_path):
    test = load_from_disk(str(reg_run["prepared"]))["test"]
    tsv = _tsv(tmp_path / "test.tsv", ["id", "sentence1", "sentence2"], zip(test["id"], test["text_a"], test["text_b"]))
    got = _predict_cli(exported["regression"], tsv, tmp_path / "p.jsonl")
    evaluated = _evaluated(reg_run)
    for g in got:
        # evaluate batches 8 rows, predict 32: padding moves the last bits of a transformer's output, no more
        assert g["score"] == pytest.approx(evaluated[g["id"]]["pred"], abs=1e-5)
    assert max(g["score"] for g in got) - min(g["score"] for g in got) > 0.01


def test_qa_answers_equal_evaluate(qa_run, exported, tmp_path):
    test = load_from_disk(str(qa_run["prepared"]))["test"]
    tsv = _tsv(tmp_path / "test.tsv", ["id", "question", "context"], zip(test["id"], test["question"],
                                                                          test["context"]))
    got = _predict_cli(exported["qa"], tsv, tmp_path / "p.jsonl")
    evaluated = _evaluated(qa_run)
    golds = {ex["id"]: gold_answers(ex["answers"]["text"]) for ex in test}
    for g in got:
        em = max(exact_match(a, g["answer"]) for a in golds[g["id"]])
        f1 = max(f1_score(a, g["answer"]) for a in golds[g["id"]])
        span_em = max(exact_match(a, g["best_span"]) for a in golds[g["id"]])
        e = evaluated[g["id"]]
        assert (em, f1, span_em) == (e["em"], pytest.approx(e["f1"]), e["span_em"]), g
    answered = [g for g in got if g["has_answer"]]
    assert answered and len(answered) < len(got), "all or no abstentions would make the threshold untested"
    metrics = json.loads(qa_run["metrics"].read_text())["test"]
    assert all(g["threshold"] == json.loads(qa_run["metrics"].read_text())["dev"]["tuned_threshold"] for g in got)
    assert 100 * sum(evaluated[g["id"]]["em"] for g in got) / len(got) == pytest.approx(metrics["exact"])


def test_lines_stdin_and_text_inputs_agree(cls_run, exported, tmp_path):
    sentences = ["w11 w12 w13", "w40 w7 w41 w42", "w55"]
    p = Predictor(exported["classification"])
    direct, _ = p.predict([Row(i + 1, (s,)) for i, s in enumerate(sentences)])
    lines = tmp_path / "s.txt"
    lines.write_text("\n".join(sentences) + "\n")
    from_file = _predict_cli(exported["classification"], lines, tmp_path / "a.jsonl")
    res = runner.invoke(app, ["predict", str(exported["classification"])], input="\n".join(sentences) + "\n")
    assert res.exit_code == 0, res.output
    from_stdin = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    res = runner.invoke(app, ["predict", str(exported["classification"]), *sum((["--text", s] for s in sentences),
                                                                                 [])])
    from_text = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert from_file == from_stdin == from_text == direct
    assert [r["line"] for r in direct] == [1, 2, 3]
