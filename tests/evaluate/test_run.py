"""The evaluate stage on a QA student: test is scored with the no-answer threshold tuned on dev, for the
student and for the teacher, never with one tuned on test itself."""

import json

import pytest
import torch
from _tiny import TINY_WALDORF, live_files, make_qa_tokens, make_tiny_bert_dir, signals

from distillpipe.config.base import build
from distillpipe.config.evaluate import EvaluateConfig, EvaluateRunConfig
from distillpipe.config.run import LoaderConfig
from distillpipe.config.speed import SpeedConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.data.schema import read_meta
from distillpipe.evaluate.run import evaluate_run
from distillpipe.evaluate.student import evaluate_student
from distillpipe.evaluate.timing import time_run
from distillpipe.students import load_student
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.train.loop import train_student

RUN = {"student": "waldorf", "dataset": "toy_qa", "teacher": "t"}


@pytest.fixture(scope="module")
def qa_student(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_qa")
    teacher = make_tiny_bert_dir(root / "teacher", qa=True, layers=2, heads=4)
    prepared, tokens = make_qa_tokens(root, teacher, n_test=24)
    cache = build(TeacherCacheDatasetConfig, {"teacher": "t", "head": "qa", "split": "train", "max_rows": None,
                                              "signals": signals(logits=True, hidden_layers=[], attn_layers=[],
                                                                 pool=1)}, "teacher_cache.datasets.toy_qa")
    build_teacher_cache("toy_qa", tokens, teacher, cache, "cpu", 16, 32, root / "qa.zarr", cpu_threads=1)
    run = build(TrainRunConfig, {
        "dataset": "toy_qa", "model": TINY_WALDORF, "encoding": "joint", "head": None,
        "teacher": "data/teacher/toy_qa.zarr", "mlm_views": "static",
        "objective": {"loss_weights": {"hard": 1.0, "soft": 1.0}, "hidden_loss": "mse", "layer_map": [2],
                      "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                   "temperature_decay": False}},
        "optim": {"epochs": 1, "max_steps": 12, "batch_size": 4, "lr": 1e-3, "weight_decay": 0.0,
                  "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
        "note": "test"}, "train.runs.w")
    train_student("w", model_cfg=run.model, run=run, loader_cfg=LoaderConfig(32, 2, 1), device="cpu",
                  tokens_dir=tokens, store_path=root / "qa.zarr", prepared_dir=prepared, out_dir=root / "w",
                  ckpt_dir=root / "ck", live_dir=root / "p")
    return {"teacher": teacher, "prepared": prepared, "tokens": tokens, "student": root / "w"}


def test_qa_test_split_uses_the_dev_threshold(qa_student, tmp_path):
    import shutil

    from datasets import load_from_disk

    from distillpipe.data.overlap import leakage_report
    from distillpipe.data.schema import write_meta

    # the prepared dataset's leakage report (prepare writes it) is carried into the metrics, for the report
    prepared = tmp_path / "prepared"
    shutil.copytree(qa_student["prepared"], prepared)
    splits = load_from_disk(str(prepared))
    leakage = leakage_report({s: [d["context"][:]] for s, d in splits.items()})
    write_meta(prepared, {**read_meta(prepared), "leakage": leakage})
    cfg = build(EvaluateConfig, {"device": "cpu", "batch_size": 8, "splits": ["test"],
                                 "runs": {"w": RUN}}, "evaluate")
    out = tmp_path / "w.json"
    res = evaluate_run("w", cfg, build(EvaluateRunConfig, RUN, "run"),
                       student_dir=qa_student["student"], tokens_dir=qa_student["tokens"],
                       prepared_dir=prepared, teacher_dir=qa_student["teacher"], out_path=out,
                       predictions_path=tmp_path / "w.predictions.json", live_dir=tmp_path / "w.live")
    assert json.loads(out.read_text())["leakage"] == leakage and len(leakage["pairs"]) == 3
    # only test was asked for; dev is scored too, because test needs its threshold
    assert res["dev"] is not None and res["test"] is not None and res["test"]["total"] == 24
    assert res["test"]["tuned_threshold"] == res["dev"]["tuned_threshold"]
    assert res["teacher"]["test"]["tuned_threshold"] == res["teacher"]["dev"]["tuned_threshold"]
    assert json.loads(out.read_text())["test"]["tuned_threshold"] == res["dev"]["tuned_threshold"]

    # the same numbers as scoring test directly at dev's threshold
    model, _ = load_student(qa_student["student"], torch.device("cpu"))
    test = load_from_disk(str(qa_student["tokens"]))["test"]
    kw = {"kind": "qa", "pad_id": 0, "device": torch.device("cpu"), "batch_size": 8, "pairs": False,
          "prepared_dir": qa_student["prepared"], "split": "test"}
    at_dev = evaluate_student(model, test, threshold=res["dev"]["tuned_threshold"], **kw)
    assert at_dev["f1"] == pytest.approx(res["test"]["f1"]) and at_dev["exact"] == pytest.approx(res["test"]["exact"])
    # and a threshold tuned on test itself is its own (F1-best on test), which evaluate must not report
    tuned_on_test = evaluate_student(model, test, **kw)
    assert tuned_on_test["f1"] >= at_dev["f1"]


def test_evaluate_twice_gives_byte_identical_metrics(qa_student, tmp_path):
    """The metrics DVC tracks are a function of the student and the data: no timing, no timestamps. (They
    held sentences/s, so every re-run changed dvc.lock and the metrics in git.)"""
    cfg = build(EvaluateConfig, {"device": "cpu", "batch_size": 8, "splits": ["dev", "test"],
                                 "runs": {"w": RUN}}, "evaluate")
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in paths:
        evaluate_run("w", cfg, cfg.runs["w"], student_dir=qa_student["student"], tokens_dir=qa_student["tokens"],
                     prepared_dir=qa_student["prepared"], teacher_dir=qa_student["teacher"], out_path=out,
                     predictions_path=out.with_suffix(".predictions.json"), live_dir=out.with_suffix(".live"))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert "per_s" not in paths[0].read_text() and "speed" not in json.loads(paths[0].read_text())
    preds = [p.with_suffix(".predictions.json") for p in paths]
    assert preds[0].read_bytes() == preds[1].read_bytes()
    live = [live_files(p.with_suffix(".live")) for p in paths]
    assert live[0] == live[1] and set(live[0]) == {"metrics.json", "params.yaml"}


def test_predictions_reproduce_the_reported_scores(qa_student, tmp_path):
    """The per-example records evaluate writes give back every score it reports, for student and teacher, on
    dev and on test (at dev's threshold): the report's intervals are drawn around the numbers they belong to."""
    from distillpipe.evaluate.intervals import point

    cfg = build(EvaluateConfig, {"device": "cpu", "batch_size": 8, "splits": ["dev", "test"],
                                 "runs": {"w": RUN}}, "evaluate")
    res = evaluate_run("w", cfg, cfg.runs["w"], student_dir=qa_student["student"], tokens_dir=qa_student["tokens"],
                       prepared_dir=qa_student["prepared"], teacher_dir=qa_student["teacher"],
                       out_path=tmp_path / "m.json", predictions_path=tmp_path / "p.json", live_dir=tmp_path / "live")
    # the dvclive summary: the evaluation schema, the student's test score first
    live = json.loads((tmp_path / "live" / "metrics.json").read_text())
    t = res["teacher"]
    assert list(live.items()) == [("test", res["test"]["f1"]), ("dev", res["dev"]["f1"]),
                                  ("teacher_test", t["test"]["f1"]), ("teacher_dev", t["dev"]["f1"]), ("metric", "f1"),
                                  ("params", res["params"]["total"])]
    preds = json.loads((tmp_path / "p.json").read_text())
    assert preds["teacher"]["name"] == "t" and preds["task_type"] == "qa"
    for who, scores in (("student", res), ("teacher", res["teacher"])):
        for split in ("dev", "test"):
            records = preds[who][split]
            assert len(records) == scores[split]["total"] and len({r["id"] for r in records}) == len(records)
            for metric in ("exact", "f1", "HasAns_f1", "NoAns_exact"):
                assert point(metric, "qa", records) == pytest.approx(scores[split][metric]), (who, split, metric)


def test_speed_stage_times_student_and_teacher_apart_from_the_scores(qa_student, tmp_path):
    cfg = build(SpeedConfig, {"device": "cpu", "batch_size": 4, "seq_len": 16, "warmup": 0, "repeats": 2,
                              "batches_per_repeat": 1, "runs": {"w": {"student": "waldorf", "teacher": "t"}}}, "speed")
    res = time_run("w", cfg, student_dir=qa_student["student"], teacher_dir=qa_student["teacher"],
                   out_path=tmp_path / "speed" / "w.json")
    assert json.loads((tmp_path / "speed" / "w.json").read_text()) == res
    assert res["student_sentences_per_s"] > 0 and res["teacher_sentences_per_s"] > 0
    assert res["speedup"] == pytest.approx(res["student_sentences_per_s"] / res["teacher_sentences_per_s"])
    assert len(res["student"]["seconds"]) == 2 and res["seq_len"] == 16 and res["device"] == "cpu"


def test_a_recorded_qa_teacher_without_tuned_threshold_is_refused(tmp_path):
    """Teacher scores recorded before the field was named tuned_threshold must not let test be tuned on itself."""
    from distillpipe.config.base import ConfigError
    from distillpipe.evaluate.run import _recorded_record, _recorded_teacher

    dev = {"exact": 50.0, "f1": 50.0, "total": 2.0}
    meta = {"fingerprint": "fp", "task_type": "qa"}
    (tmp_path / "predictions.json").write_text(json.dumps({"tokens": "fp", "dev": []}))
    (tmp_path / "metrics.json").write_text(json.dumps({"task": "toy_qa", "tokens": "fp", **dev, "threshold": 0.0}))
    with pytest.raises(ConfigError, match="tuned_threshold.*re-run teacher_finetune"):
        _recorded_teacher(tmp_path, meta, _recorded_record(tmp_path, meta))
    (tmp_path / "metrics.json").write_text(json.dumps({"task": "toy_qa", "tokens": "fp", **dev,
                                                       "tuned_threshold": 0.0}))
    recorded = _recorded_teacher(tmp_path, meta, _recorded_record(tmp_path, meta))
    assert recorded["dev"].metrics["tuned_threshold"] == 0.0


def test_a_recorded_teacher_is_not_loaded_and_gives_the_same_bytes(qa_student, tmp_path, monkeypatch):
    """A teacher teacher_finetune recorded (its dev and test scores, per-example records and parameter counts on these
    tokens) is read, not loaded and run: the evaluation's files are the bytes a live scoring of it gives."""
    import shutil

    from datasets import load_from_disk

    import distillpipe.evaluate.run as run_module
    from distillpipe.evaluate.size import count_parameters
    from distillpipe.evaluate.teacher import METRICS_FILE, PREDICTIONS_FILE, score_teacher
    from distillpipe.teacher.load import load_teacher

    cfg = build(EvaluateConfig, {"device": "cpu", "batch_size": 8, "splits": ["dev", "test"],
                                 "runs": {"w": RUN}}, "evaluate")
    recorded = tmp_path / "recorded"
    shutil.copytree(qa_student["teacher"], recorded)
    meta, data = read_meta(qa_student["tokens"]), load_from_disk(str(qa_student["tokens"]))
    teacher, _ = load_teacher(qa_student["teacher"], "qa", "cpu")
    pad = meta["tokenizer"]["pad_id"]
    dev = score_teacher(teacher, data["dev"], "qa", pad, torch.device("cpu"), 8, None, qa_student["prepared"])
    test = score_teacher(teacher, data["test"], "qa", pad, torch.device("cpu"), 8, None, qa_student["prepared"],
                         split="test", threshold=dev.metrics["tuned_threshold"])
    (recorded / METRICS_FILE).write_text(json.dumps({"task": "toy_qa", "tokens": meta["fingerprint"], **dev.metrics,
                                                     "test": test.metrics, "params": count_parameters(teacher)}))
    (recorded / PREDICTIONS_FILE).write_text(json.dumps({"task": "toy_qa", "tokens": meta["fingerprint"],
                                                         "dev": dev.examples, "test": test.examples}))

    def evaluate(teacher_dir, out):
        evaluate_run("w", cfg, cfg.runs["w"], student_dir=qa_student["student"], tokens_dir=qa_student["tokens"],
                     prepared_dir=qa_student["prepared"], teacher_dir=teacher_dir, out_path=out,
                     predictions_path=out.with_suffix(".predictions.json"), live_dir=out.with_suffix(".live"))
        return out.read_bytes(), out.with_suffix(".predictions.json").read_bytes()

    live = evaluate(qa_student["teacher"], tmp_path / "live.json")
    monkeypatch.setattr(run_module, "load_teacher", lambda *a, **k: pytest.fail("a recorded teacher was loaded"))
    assert evaluate(recorded, tmp_path / "recorded.json") == live
