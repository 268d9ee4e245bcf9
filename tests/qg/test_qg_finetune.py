"""qg_finetune: a tiny T5 from config learns (its dev loss falls), the output is a loadable HF model with its
input format recorded, long contexts drop pairs whose answer is cut off, hub names fail fast offline, and a
killed run resumes to identical weights."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from _qg_tiny import qg_params
from _tiny import invoke_cli

from distillpipe.assets import AssetError
from distillpipe.config.base import build
from distillpipe.config.qg_finetune import QgFinetuneConfig
from distillpipe.qg.finetune import build_scratch_t5, dev_metrics, encode_pairs, finetune_qg
from distillpipe.qg.model import source_text
from distillpipe.runtime import seed_everything


def _cfg(**over):
    return build(QgFinetuneConfig, qg_params(**over), "qg_finetune")


def test_tiny_t5_trains_and_its_loss_falls(toy_qa, tmp_path):
    from datasets import load_from_disk
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    cfg = _cfg(epochs=6)
    s = finetune_qg(toy_qa, cfg, tmp_path / "qg", tmp_path / "ckpt", tmp_path / "m.json")
    tok = AutoTokenizer.from_pretrained(tmp_path / "qg")
    dev = encode_pairs(tok, load_from_disk(str(toy_qa))["dev"], cfg)
    seed_everything(cfg.seed)  # the very model the run started from
    before = dev_metrics(build_scratch_t5(cfg.model, len(tok)), dev, tok.pad_token_id, torch.device("cpu"), 8)
    assert s.metrics["dev_loss"] < 0.5 * before["dev_loss"], (before, s.metrics)
    assert s.steps == 6 * -(-s.train_pairs // cfg.batch_size)

    # The reported dev loss, recomputed row by row from the saved weights (an independent loop).
    model = T5ForConditionalGeneration.from_pretrained(tmp_path / "qg").eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for src, tgt in zip(dev.sources, dev.targets):
            loss = model(input_ids=torch.tensor([src]), labels=torch.tensor([tgt])).loss.item()
            total, tokens = total + loss * len(tgt), tokens + len(tgt)
    assert abs(total / tokens - s.metrics["dev_loss"]) < 1e-4


def test_output_layout(tiny_qg):
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    meta = json.loads((tiny_qg / "qg.json").read_text())
    assert meta["input_format"] == "generate question: context: <context>" and meta["answer_hint"] is False
    assert len(meta["samples"]) == 2 and {"context", "reference", "generated"} <= set(meta["samples"][0])
    assert (tiny_qg / "spiece.model").is_file()
    model = T5ForConditionalGeneration.from_pretrained(tiny_qg)
    tok = AutoTokenizer.from_pretrained(tiny_qg)
    assert model.config.vocab_size == len(tok) and tok.pad_token_id == model.config.decoder_start_token_id == 0
    assert not any((tiny_qg.parent / "ckpt").glob("step-*.pt")), "checkpoints are cleared once the model is saved"
    assert "dev_loss" in json.loads((tiny_qg.parent / "metrics.json").read_text())


def test_answer_hint_format_and_cut_off_answers(toy_qa, tmp_path):
    from datasets import Dataset

    from distillpipe.qg.vocab import SPM_FILE, load_spm_tokenizer, train_sentencepiece

    assert source_text("C.", "Alma") == "generate question: Alma context: C."
    assert source_text("C.", None) == "generate question: context: C."
    long = " ".join(["Alma built the river near the tower."] * 12)
    rows = Dataset.from_dict({
        "context": [long + " Hugo sold the palace.", long, long],
        "question": ["Who sold the palace?", "Who built the river near the tower?", "Who?"],
        "answers": [{"text": ["Hugo"], "answer_start": [len(long) + 1]},  # beyond max_source_len: dropped
                    {"text": ["Alma"], "answer_start": [0]},
                    {"text": [], "answer_start": []}]})
    train_sentencepiece(list(rows["context"]) + list(rows["question"]), 60, 1.0, tmp_path / SPM_FILE)
    tok = load_spm_tokenizer(tmp_path)
    for hint in (False, True):
        pairs = encode_pairs(tok, rows, _cfg(answer_hint=hint, max_source_len=48, max_target_len=4))
        assert pairs.dropped == {"unanswerable rows": 1, "answers beyond max_source_len": 1, "questions truncated": 1}
        assert pairs.questions == ["Who built the river near the tower?"]
        assert len(pairs.sources[0]) == 48 and pairs.sources[0][-1] == tok.eos_token_id
        assert len(pairs.targets[0]) == 4 and pairs.targets[0][-1] == tok.eos_token_id
        assert pairs.source_texts[0].startswith("generate question: Alma context: " if hint else
                                                "generate question: context: Alma")


def test_hub_model_offline_fails_fast(toy_qa, tmp_path):
    cfg = _cfg(model={"source": "pretrained", "base": "google/flan-t5-base"})
    t = time.perf_counter()
    with pytest.raises(AssetError,
                       match=r"'google/flan-t5-base' is not in the local Hugging Face cache.*HF_HUB_OFFLINE"):
        finetune_qg(toy_qa, cfg, tmp_path / "qg", tmp_path / "ckpt", tmp_path / "m.json")
    assert time.perf_counter() - t < 10
    assert not (tmp_path / "qg").exists()


def test_cli_reports_offline_hub_model_as_user_error(toy_qa, tmp_path):
    import yaml

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"qg_finetune": qg_params(model={"source": "pretrained", "base": "t5-large"})}))
    res = invoke_cli(["qg-finetune", "--prepared", toy_qa, "--out", tmp_path / "qg", "--checkpoints", tmp_path / "c",
                      "--metrics", tmp_path / "m.json", "--params", params])  # the real command, in this process
    assert res.returncode == 2, res.stderr
    assert "error: model 't5-large' is not in the local Hugging Face cache" in res.stderr
    assert "Traceback" not in res.stderr


def _cli(params, prepared, out, ckpt):
    return [sys.executable, "-m", "distillpipe.cli", "qg-finetune", "--prepared", str(prepared), "--out", str(out),
            "--checkpoints", str(ckpt), "--metrics", str(out) + ".json", "--params", str(params)]


@pytest.mark.slow
def test_killed_run_resumes_to_identical_weights(toy_qa, tmp_path):
    import yaml
    from safetensors.torch import load_file

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"qg_finetune": qg_params(epochs=30, checkpoint_minutes=0,
                                                               model=_dropout_model())}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ref = subprocess.run(_cli(params, toy_qa, tmp_path / "ref", tmp_path / "ref_ckpt"), env=env,
                         capture_output=True, text=True, check=False)
    assert ref.returncode == 0, ref.stderr
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(_cli(params, toy_qa, tmp_path / "out", ckpt), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not any(ckpt.glob("step-*.pt")) and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "out").exists(), "the run finished before it could be killed; make it longer"
    res = subprocess.run(_cli(params, toy_qa, tmp_path / "out", ckpt), env=env, capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert "resuming qg_finetune at epoch" in res.stderr
    a, b = load_file(tmp_path / "ref" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _dropout_model():
    from _qg_tiny import scratch_model

    return scratch_model(dropout=0.1)  # dropout draws from the RNG: resume must restore its state
