"""Teacher fine-tuning: it learns, it saves HF layout + metrics, and a killed run resumes exactly."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from _tiny import (
    finetune_params,
    invoke_cli,
    live_files,
    make_classification_tokens,
    make_tiny_bert_dir,
    read_curve,
    write_params,
)
from safetensors.torch import load_file

from distillpipe.assets import tokenizer_sha256, weights_sha256
from distillpipe.config.base import build
from distillpipe.config.teacher_finetune import TeacherFinetuneTaskConfig
from distillpipe.train.teacher_finetune import FinetuneError, finetune_teacher


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    base = make_tiny_bert_dir(root / "base")
    tokens = make_classification_tokens(root / "tokens", base, n_train=256, n_dev=64)
    return base, tokens


def _files(folder):
    return sorted((p.relative_to(folder), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file())


def test_finetune_learns_and_saves(toy, tmp_path):
    base, tokens = toy
    before = _files(tokens)
    cfg = build(TeacherFinetuneTaskConfig, finetune_params(epochs=3, max_train_rows=200), "teacher_finetune.tasks.toy")
    s = finetune_teacher("toy", base, tokens, tokens, cfg, "cpu", tmp_path / "out", tmp_path / "ckpt",
                         tmp_path / "live")
    assert _files(tokens) == before, "fine-tuning must not write into its input (another stage's DVC output)"
    assert s.steps == 3 * 200 // 8
    assert s.metrics["accuracy"] > 0.9, s.metrics  # 'contains token 7' is easy
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out")
    assert model.config.num_labels == 2 and model.config.id2label[1] == "yes"
    assert tokenizer_sha256(tmp_path / "out") == tokenizer_sha256(base)  # tokens stay valid for this teacher
    # the parameter counts evaluate shows beside its students, so that it need not load the teacher
    from distillpipe.evaluate.size import count_parameters

    recorded = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert recorded["params"] == count_parameters(model)
    # a teacher worth distilling from: clearly above the majority class (evaluate/baseline.py), no warning
    assert recorded["baseline"]["clearly_above"] and recorded["baseline"]["value"] == 0.5 and s.weak is None
    # dvclive: the teacher schema (no test split here), the loss and lr of every step, the task's params
    assert json.loads((tmp_path / "live" / "metrics.json").read_text()) == {
        "dev": s.metrics["accuracy"], "metric": "accuracy", "step": s.steps}
    assert list(read_curve(tmp_path / "live", "train/loss")) == list(range(1, s.steps + 1))
    lr = read_curve(tmp_path / "live", "train/lr")
    # no warm-up (warmup_fraction 0): the step-k rate of a linear decay to 0 over the run, k = 1, 2, ...
    assert lr == pytest.approx({k: 2e-3 * (s.steps - k + 1) / s.steps for k in range(1, s.steps + 1)}, rel=1e-9)
    assert yaml.safe_load((tmp_path / "live" / "params.yaml").read_text()) == {"task": "toy", **cfg.__dict__}


def test_regression_is_cast_to_bins(toy, tmp_path):
    base, _ = toy
    tokens = make_classification_tokens(tmp_path / "reg", base, n_train=200, n_dev=48, regression=True)
    cfg = build(TeacherFinetuneTaskConfig, finetune_params(epochs=8, regression_bin_width=0.2), "t")
    s = finetune_teacher("toy", base, tokens, tokens, cfg, "cpu", tmp_path / "out", tmp_path / "ckpt",
                         tmp_path / "m.json")
    from transformers import AutoConfig

    # 0.2-wide bins up to the largest train score, 0.6: classes 0..3 (CMOW paper, after Raffel et al.)
    assert AutoConfig.from_pretrained(tmp_path / "out").num_labels == 4
    assert s.metrics["pearson"] > 0.8, s.metrics


def test_wrong_task_config_is_refused(toy, tmp_path):
    base, tokens = toy
    cfg = build(TeacherFinetuneTaskConfig, finetune_params(regression_bin_width=0.2), "t")
    with pytest.raises(FinetuneError, match="regression_bin_width must be set for regression tasks and null otherwise"):
        finetune_teacher("toy", base, tokens, tokens, cfg, "cpu", tmp_path / "o", tmp_path / "c", tmp_path / "l")


def _cli(params, base, tokens, out, ckpt):
    return [sys.executable, "-m", "distillpipe.cli", "teacher-finetune", "--task", "toy", "--base", str(base),
            "--tokens", str(tokens), "--prepared", str(tokens), "--out", str(out), "--checkpoints", str(ckpt),
            "--live", str(out) + ".live", "--params", str(params)]


def test_killed_run_resumes_to_identical_weights(toy, tmp_path):
    base, tokens = toy
    params = write_params(tmp_path / "params.yaml", {"teacher_finetune": {
        "device": "cpu", "tasks": {"toy": finetune_params(epochs=3, checkpoint_minutes=0)}}})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # the uninterrupted reference and the resumed run in this process (the same command, no ~5 s of imports); the
    # run to kill in a process of its own
    ref = invoke_cli(_cli(params, base, tokens, tmp_path / "ref", tmp_path / "ref_ckpt")[3:])
    assert ref.returncode == 0, ref.stderr

    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(_cli(params, base, tokens, tmp_path / "out", ckpt), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not any(ckpt.glob("step-*.pt")) and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "out").exists(), "the run finished before it could be killed; make it longer"
    assert any(ckpt.glob("step-*.pt"))

    res = invoke_cli(_cli(params, base, tokens, tmp_path / "out", ckpt)[3:])
    assert res.returncode == 0, res.stderr
    assert "resuming toy at epoch" in res.stderr
    assert not any(ckpt.glob("step-*.pt")), "checkpoints are cleared once the model is saved"
    a = load_file(tmp_path / "ref" / "model.safetensors")
    b = load_file(tmp_path / "out" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the per-step curves come from the checkpointed log: no step lost or repeated by the kill
    assert live_files(tmp_path / "ref.live") == live_files(tmp_path / "out.live")
    assert list(read_curve(tmp_path / "out.live", "train/loss")) == list(range(1, 3 * 256 // 8 + 1))


def test_qa_test_scores_use_the_dev_threshold(tmp_path):
    from _tiny import make_qa_tokens

    base = make_tiny_bert_dir(tmp_path / "base", qa=True)
    prepared, tokens = make_qa_tokens(tmp_path, base, n_test=24)
    cfg = build(TeacherFinetuneTaskConfig, finetune_params(epochs=1), "teacher_finetune.tasks.toy_qa")
    s = finetune_teacher("toy_qa", base, tokens, prepared, cfg, "cpu", tmp_path / "out", tmp_path / "ckpt",
                         tmp_path / "live")
    recorded = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert recorded["test"]["total"] == 24 and "tuned_threshold" in s.metrics
    assert recorded["test"]["tuned_threshold"] == recorded["tuned_threshold"] == s.metrics["tuned_threshold"]
    live = json.loads((tmp_path / "live" / "metrics.json").read_text())
    assert live == {"dev": recorded["f1"], "test": recorded["test"]["f1"], "metric": "f1", "step": s.steps}


def test_the_learning_rate_is_selected_on_dev_and_a_finished_rate_is_not_rerun(toy, tmp_path, caplog):
    """BERT's recipe (Devlin et al. sec. 4.1): the rate with the best dev score is kept; the kept model is the run at
    that rate, bit for bit; a rate finished before a kill is not trained again."""
    import logging

    base, tokens = toy
    kw = dict(epochs=3, max_train_rows=200)
    single = build(TeacherFinetuneTaskConfig, finetune_params(**kw), "t")  # lr 2e-3: learns (> 0.9 above)
    ckpt = tmp_path / "ckpt"
    cfg = build(TeacherFinetuneTaskConfig, finetune_params(lr_grid=[1e-6], **kw), "t")  # 1e-6: barely moves
    # as if the selection was killed after its first rate: a grid of that rate alone leaves it finished, and
    # a selection that knows another grid, of other epochs, does not reuse it
    other = build(TeacherFinetuneTaskConfig, finetune_params(epochs=1, max_train_rows=200, lr_grid=[1e-6]), "t")
    finetune_teacher("toy", base, tokens, tokens, other, "cpu", tmp_path / "o", ckpt, tmp_path / "ol")
    first = finetune_teacher("toy", base, tokens, tokens, single, "cpu", tmp_path / "first", tmp_path / "fc",
                             tmp_path / "fl")
    reference = load_file(tmp_path / "first" / "model.safetensors")
    with caplog.at_level(logging.INFO, logger="distillpipe.train.teacher_finetune"):
        s = finetune_teacher("toy", base, tokens, tokens, cfg, "cpu", tmp_path / "out", ckpt, tmp_path / "live")
    assert "already fine-tuned" not in caplog.text  # the epochs-1 candidates were removed with their selection
    sel = json.loads((tmp_path / "out" / "metrics.json").read_text())["lr_selection"]
    assert sel["metric"] == "accuracy" and sel["chosen"] == 2e-3 and set(sel["dev"]) == {"0.002", "1e-06"}
    assert sel["dev"]["0.002"] == first.metrics["accuracy"] > sel["dev"]["1e-06"]
    assert sel["margin"] == pytest.approx(sel["dev"]["0.002"] - sel["dev"]["1e-06"])
    assert s.chosen.startswith(f"lr 0.002 chosen on dev accuracy {first.metrics['accuracy']:.4f}")
    assert s.chosen in s.one_line()
    kept = load_file(tmp_path / "out" / "model.safetensors")
    assert kept.keys() == reference.keys() and all(torch.equal(kept[k], reference[k]) for k in kept)
    assert json.loads((tmp_path / "live" / "metrics.json").read_text())["dev"] == first.metrics["accuracy"]
    assert not list(ckpt.glob("lr-*")), "the candidates are removed once the winner is saved"
    assert s.steps == first.steps

    # killed after its first rate: that rate is finished in its folder, and is not trained again
    import shutil

    (ckpt / "lr-0.002").mkdir(parents=True)
    shutil.copytree(tmp_path / "first", ckpt / "lr-0.002" / "model")
    shutil.copytree(tmp_path / "fl", ckpt / "lr-0.002" / "live")
    from distillpipe.identity import json_sha256, stage_code

    run_id = json_sha256({"cfg": {**single.__dict__, "lr_grid": None}, "tokens": json.loads(
        (tokens / "meta.json").read_text())["fingerprint"], "base": weights_sha256(base), "task": "toy",
        "code": stage_code("teacher_finetune"), "device": "cpu"})
    (ckpt / "lr-0.002" / "done.json").write_text(json.dumps({"run_id": run_id}))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="distillpipe.train.teacher_finetune"):
        again = finetune_teacher("toy", base, tokens, tokens, cfg, "cpu", tmp_path / "out2", ckpt, tmp_path / "l2")
    assert "lr 0.002 already fine-tuned" in caplog.text and "lr 1e-06 already" not in caplog.text
    assert again.metrics == first.metrics and again.chosen == s.chosen
    (ckpt / "lr-0.002").mkdir(parents=True)  # the same, but trained with other params: trained again
    shutil.copytree(tmp_path / "first", ckpt / "lr-0.002" / "model")
    (ckpt / "lr-0.002" / "done.json").write_text(json.dumps({"run_id": "another"}))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="distillpipe.train.teacher_finetune"):
        finetune_teacher("toy", base, tokens, tokens, cfg, "cpu", tmp_path / "out3", ckpt, tmp_path / "l3")
    assert "lr 0.002 was fine-tuned with other params" in caplog.text
    with pytest.raises(Exception, match="lr_grid"):
        build(TeacherFinetuneTaskConfig, finetune_params(lr_grid=[2e-3]), "t")  # lr itself again
