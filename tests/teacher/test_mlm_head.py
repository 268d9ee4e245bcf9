"""teacher_finetune on an MLM corpus: a BERT MLM head for a teacher that has none (encoder frozen), kept as it
is for one that has its head; the result is a teacher that teacher_cache reads MLM top-k from."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _tiny import finetune_params, make_mlm_tokens, make_tiny_bert_dir, signals
from safetensors.torch import load_file

from distillpipe.config.base import build
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.teacher_finetune import TeacherFinetuneTaskConfig
from distillpipe.evaluate.teacher import score_mlm
from distillpipe.store.reader import open_store
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.teacher.load import load_teacher
from distillpipe.teacher.mlm_head import build_mlm_model
from distillpipe.train.teacher_finetune import finetune_teacher


def _tokens(root, base):
    """MLM rows of one token repeated (one of 60): the context tells the masked token."""
    return make_mlm_tokens(root / "tokens", base, n_rows=192, n_dev=48, seed=1, repeat=True)


@pytest.fixture(scope="module")
def headless(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlm_head")
    base = make_tiny_bert_dir(root / "base")  # a BertModel: no MLM head
    tokens = _tokens(root, base)
    cfg = build(TeacherFinetuneTaskConfig, finetune_params(epochs=12, batch_size=16, lr=1e-2, checkpoint_minutes=10),
                "teacher_finetune.tasks.toy_mlm")
    summary = finetune_teacher("toy_mlm", base, tokens, tokens, cfg, "cpu", root / "teacher", root / "ck",
                               root / "live")
    return {"root": root, "base": base, "tokens": tokens, "summary": summary}


def test_only_the_head_trains_and_it_learns(headless):
    root, base, summary = headless["root"], headless["base"], headless["summary"]
    assert summary.steps == 12 * 192 // 16
    before, after = load_file(base / "model.safetensors"), load_file(root / "teacher" / "model.safetensors")
    encoder = {k.removeprefix("bert."): v for k, v in after.items() if k.startswith("bert.")}
    assert set(before) - {k for k in before if "pooler" in k} <= set(encoder)
    for k, v in before.items():
        if k in encoder:
            assert torch.equal(v, encoder[k]), f"{k} changed: the encoder must stay frozen"
    assert any(k.startswith("cls.predictions.transform") for k in after)

    # it learned: the same head untrained (same seed) is worse on dev by far; perplexity = exp(loss)
    from datasets import load_from_disk

    torch.manual_seed(0)
    untrained, is_new = build_mlm_model(base)
    assert is_new
    dev = load_from_disk(str(headless["tokens"]))["dev"]
    before_training = score_mlm(untrained, dev, 0, torch.device("cpu"), 16).metrics
    m = summary.metrics
    assert m["mlm_loss"] < before_training["mlm_loss"] - 0.25, (m, before_training)
    assert m["mlm_accuracy"] > 2 * before_training["mlm_accuracy"]
    assert m["perplexity"] == pytest.approx(math.exp(m["mlm_loss"]))
    assert m["masked_tokens"] > 0


def test_scores_match_the_full_masked_lm_forward(headless):
    """The head applied at the masked positions only gives what the HF masked LM gives at every position."""
    from datasets import load_from_disk

    model, _ = load_teacher(headless["root"] / "teacher", "mlm", "cpu")
    dev = load_from_disk(str(headless["tokens"]))["dev"]
    scored = score_mlm(model, dev, 0, torch.device("cpu"), 7).metrics
    nll, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for row in dev:  # one row at a time, no padding: the reference
            ids = torch.tensor([row["input_ids"]])
            logits = model(input_ids=ids, token_type_ids=torch.tensor([row["token_type_ids"]])).logits[0]  # (T, V)
            for pos, label in zip(row["masked_positions"], row["masked_labels"]):
                logp = torch.log_softmax(logits[pos].double(), -1)
                nll -= float(logp[label])
                correct += int(int(logits[pos].argmax()) == label)
                n += 1
    assert scored["masked_tokens"] == n
    assert scored["mlm_loss"] == pytest.approx(nll / n, rel=1e-4)
    assert scored["mlm_accuracy"] == pytest.approx(correct / n)


def test_the_teacher_caches_mlm_topk(headless, tmp_path):
    cfg = build(TeacherCacheDatasetConfig, {"teacher": "toy_mlm", "head": "mlm", "split": "train", "max_rows": None,
                                            "signals": signals(mlm_topk=8, hidden_layers=[], attn_layers=[], pool=1)},
                "teacher_cache.datasets.toy_mlm")
    build_teacher_cache("toy_mlm", headless["tokens"], headless["root"] / "teacher", cfg, "cpu", 32, 64,
                        tmp_path / "c.zarr", cpu_threads=1)
    store = open_store(tmp_path / "c.zarr")
    assert store.manifest.signals.mlm_topk == 8
    rows = store.read(["mlm/topk_ids", "mlm/positions"], 0, 4)
    assert rows["mlm/topk_ids"].shape[-1] == 8 and (rows["mlm/positions"] >= 0).any()


def test_a_teacher_with_its_mlm_head_is_kept_as_it_is(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    base = make_tiny_bert_dir(tmp_path / "base")
    torch.manual_seed(3)
    cfg = BertConfig.from_pretrained(base)
    BertForMaskedLM(cfg).save_pretrained(base)  # now with cls.predictions.*
    tokens = _tokens(tmp_path, base)
    params = build(TeacherFinetuneTaskConfig, finetune_params(epochs=2, batch_size=16), "teacher_finetune.tasks.x")
    summary = finetune_teacher("toy_mlm", base, tokens, tokens, params, "cpu", tmp_path / "teacher", tmp_path / "ck",
                               tmp_path / "live")
    assert summary.steps == 0
    before, after = load_file(base / "model.safetensors"), load_file(tmp_path / "teacher" / "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert summary.metrics["masked_tokens"] > 0


def test_topk_mass_is_what_the_k_most_likely_tokens_hold(headless):
    from datasets import load_from_disk

    model, _ = load_teacher(headless["root"] / "teacher", "mlm", "cpu")
    dev = load_from_disk(str(headless["tokens"]))["dev"]
    m = score_mlm(model, dev, 0, torch.device("cpu"), 16).metrics
    probs = []
    with torch.no_grad():
        for row in dev:
            logits = model(input_ids=torch.tensor([row["input_ids"]])).logits[0]
            probs += [torch.softmax(logits[p].double(), -1) for p in row["masked_positions"]]
    for k in (8, 64):
        ref = float(np.mean([float(torch.sort(p, descending=True).values[:k].sum()) for p in probs]))
        assert m[f"top{k}_mass"] == pytest.approx(ref, abs=1e-4)
    assert m["top256_mass"] == pytest.approx(1.0)  # the tiny vocabulary has 65 tokens
