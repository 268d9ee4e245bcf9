"""Students on a regression task (STS-B), on the real GLUE sample in ../shared/data: the teacher is fine-tuned
on 0.2-wide bins, the student trains on the same bins (hard bin label + soft KL against the teacher's bin
distribution, CMOW paper sec. IV-A), and both are scored by Pearson/Spearman of the expected value."""

from __future__ import annotations

import collections
import json
import re

import numpy as np
import pytest
import torch
from _tiny import PRECISION_F16, SPECIAL, finetune_params
from scipy import stats
from scipy.special import softmax

from distillpipe.config.base import build
from distillpipe.config.evaluate import EvaluateConfig
from distillpipe.config.prepare import LocalGlueConfig
from distillpipe.config.run import LoaderConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.teacher_finetune import TeacherFinetuneTaskConfig
from distillpipe.config.tokenize import TokenizeClassificationConfig, TokenizeConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.data.collate import IGNORE, collate
from distillpipe.data.prepare import prepare_dataset
from distillpipe.data.tokenize import tokenize_dataset
from distillpipe.evaluate.run import evaluate_run
from distillpipe.students import load_student
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.train.loop import train_student
from distillpipe.train.teacher_finetune import finetune_teacher

WIDTH = 0.2


def _tiny_bert_for(texts, path, n_words=1500):
    """A tiny random BERT whose WordPiece vocabulary is the most frequent words of ``texts``."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    counts = collections.Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
    path.mkdir(parents=True)
    (path / "vocab.txt").write_text("\n".join(SPECIAL + [w for w, _ in counts.most_common(n_words)]) + "\n")
    BertTokenizerFast(vocab=str(path / "vocab.txt"), do_lower_case=True).save_pretrained(path)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(SPECIAL) + n_words, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def stsb(tmp_path_factory, shared_data):
    root = tmp_path_factory.mktemp("stsb")
    d = shared_data / "glue" / "STS-B"
    cfg = build(LocalGlueConfig, {"format": "glue", "task": "stsb", "path": str(d),
                                  "files": {"train": "train.tsv", "dev": "dev.tsv"}, "encoding": "utf-8",
                                  "on_bad_rows": "error", "carve": {"dev": 0.0, "test": 0.1, "seed": 0}},
                "prepare.local.stsb")
    prepare_dataset("stsb", cfg, root / "prepared")
    from datasets import load_from_disk

    train = load_from_disk(str(root / "prepared"))["train"]
    base = _tiny_bert_for(list(train["text_a"]) + list(train["text_b"]), root / "base")
    tokens = root / "tokens"
    tokenize_dataset("stsb", root / "prepared",
                     TokenizeConfig(str(base), 64, {"stsb": TokenizeClassificationConfig("classification", None)}),
                     tokens)
    # 480 of the ~1,800 train rows: the teacher's bins and its cache are what the tests read, not its score (all rows
    # took ~40 s of the suite)
    tcfg = build(TeacherFinetuneTaskConfig, finetune_params(epochs=2, batch_size=32, lr=1e-3, checkpoint_minutes=10,
                                                            max_train_rows=480, regression_bin_width=WIDTH),
                 "teacher_finetune.tasks.stsb")
    teacher = finetune_teacher("stsb", base, tokens, root / "prepared", tcfg, "cpu", root / "teacher", root / "tck",
                               root / "teacher.live")
    cache_cfg = build(TeacherCacheDatasetConfig, {
        "teacher": "stsb", "head": "classification", "split": "train", "max_rows": None,
        "signals": {"logits": True, "mlm_topk": 0, "hidden_layers": [], "attn_layers": [], "pool": 1,
                    "attn_probs": False, "embeddings": False, "precision": PRECISION_F16,
                    "hidden_rank": None, "hidden_fit_rows": 16, "attn_rank": None}},
        "teacher_cache.datasets.stsb")
    build_teacher_cache("stsb", tokens, root / "teacher", cache_cfg, "cpu", 64, 1024, root / "stsb.zarr", cpu_threads=1)
    return {"root": root, "tokens": tokens, "prepared": root / "prepared", "teacher": root / "teacher",
            "teacher_summary": teacher}


def test_collate_bins_real_scores_like_the_teacher(stsb):
    """Hard labels are round(score / 0.2), the bins the teacher was fine-tuned on (a naive loop as reference)."""
    from datasets import load_from_disk

    rows = load_from_disk(str(stsb["tokens"]))["train"].select(range(64)).to_dict()
    _, targets = collate(rows, kind="classification", pad_id=0, labeled=True, pairs=False,
                         bin_width=WIDTH)
    # reference: the scores as written in the TSV (3 decimals), to the nearest 0.2, halves up, in exact integers
    expected = [(int(round(float(y) * 1000)) + 100) // 200 for y in rows["label"]]
    assert targets["labels"].tolist() == expected
    assert any(round(float(y) * 1000) % 200 == 100 for y in rows["label"])  # the sample has halves (0.5, 2.5, ...)
    assert max(expected) <= 25 and min(expected) >= 0
    unlabeled = dict(rows, label=[-1.0] * 64)  # GLUE test rows
    _, targets = collate(unlabeled, kind="classification", pad_id=0, labeled=True, pairs=False,
                         bin_width=WIDTH)
    assert (targets["labels"] == IGNORE).all()


def _run(loss_weights):
    return build(TrainRunConfig, {
        "dataset": "stsb", "teacher": "data/teacher/stsb.zarr", "mlm_views": "static",
        "model": {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 4,
                  "d_vec": 32, "init_std": 0.01, "embedding_init": "random", "dropout": 0.0},
        "encoding": "diffcat", "head": {"type": "mlp", "hidden_size": 64, "dropout": 0.0},
        "objective": {"loss_weights": loss_weights, "hidden_loss": "cosine", "layer_map": [-1],
                      "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                   "temperature_decay": False}},
        "optim": {"epochs": 3, "max_steps": None, "batch_size": 32, "lr": 3e-3, "weight_decay": 0.0,
                  "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
        "note": "stsb"}, "train.runs.stsb")


def test_student_learns_the_bins_and_is_scored_by_the_expected_value(stsb, tmp_path):
    root = stsb["root"]
    run = _run({"hard": 0.5, "soft": 0.5})
    summary = train_student("stsb", model_cfg=run.model, run=run, loader_cfg=LoaderConfig(64, 4, 1), device="cpu",
                            tokens_dir=stsb["tokens"], store_path=root / "stsb.zarr", prepared_dir=stsb["prepared"],
                            out_dir=tmp_path / "student", ckpt_dir=tmp_path / "ck", live_dir=tmp_path / "plots")
    assert summary.metric == "pearson"
    model, record = load_student(tmp_path / "student", torch.device("cpu"))
    teacher_bins = len(json.loads((stsb["teacher"] / "config.json").read_text())["id2label"])
    assert record["task"].bin_width == WIDTH and record["task"].num_labels == teacher_bins == 26

    ecfg = build(EvaluateConfig, {"device": "cpu", "batch_size": 64, "splits": ["dev"],
                                  "runs": {"stsb": {"student": "cmow_hybrid", "dataset": "stsb", "teacher": "stsb"}}},
                 "evaluate")
    res = evaluate_run("stsb", ecfg, ecfg.runs["stsb"], student_dir=tmp_path / "student", tokens_dir=stsb["tokens"],
                       prepared_dir=stsb["prepared"], teacher_dir=stsb["teacher"], out_path=tmp_path / "e.json",
                       predictions_path=tmp_path / "p.json", live_dir=tmp_path / "e.live")
    assert res["primary_metric"] == "pearson" and res["task_type"] == "regression"

    # reference: the student's bin logits -> expected score -> SciPy correlations, computed here
    from datasets import load_from_disk

    dev = load_from_disk(str(stsb["tokens"]))["dev"]
    batch, _ = collate(dev.to_dict(), kind="classification", pad_id=0, labeled=True, pairs=True,
                       bin_width=WIDTH)
    with torch.no_grad():
        logits = model(batch).logits.double().numpy()
    expected = softmax(logits, axis=-1) @ (np.arange(26) * WIDTH)
    gold = np.asarray(dev["label"], np.float64)
    assert res["dev"]["pearson"] == pytest.approx(stats.pearsonr(gold, expected)[0], abs=1e-4)
    assert res["dev"]["spearman"] == pytest.approx(stats.spearmanr(gold, expected)[0], abs=1e-4)
    preds = json.loads((tmp_path / "p.json").read_text())["student"]["dev"]
    assert [p["pred"] for p in preds] == pytest.approx(expected.tolist(), abs=1e-4)

    # it learned (an untrained student scores ~0; 3 epochs give 0.63), and the teacher is scored the same way
    assert res["dev"]["pearson"] > 0.4, res["dev"]
    assert res["teacher"]["dev"]["pearson"] == pytest.approx(stsb["teacher_summary"].metrics["pearson"])


def test_regression_needs_a_teacher_fine_tuned_on_bins(stsb, tmp_path):
    """A cache whose teacher has no bin width cannot train a regression student (the bins would be guesses)."""
    import shutil

    teacher = tmp_path / "teacher"
    shutil.copytree(stsb["teacher"], teacher)
    cfg = json.loads((teacher / "config.json").read_text())
    del cfg["distillpipe"]
    (teacher / "config.json").write_text(json.dumps(cfg))
    cache_cfg = build(TeacherCacheDatasetConfig, {
        "teacher": "stsb", "head": "classification", "split": "train", "max_rows": None,
        "signals": {"logits": True, "mlm_topk": 0, "hidden_layers": [], "attn_layers": [], "pool": 1,
                    "attn_probs": False, "embeddings": False, "precision": PRECISION_F16,
                    "hidden_rank": None, "hidden_fit_rows": 16, "attn_rank": None}},
        "teacher_cache.datasets.stsb")
    build_teacher_cache("stsb", stsb["tokens"], teacher, cache_cfg, "cpu", 64, 1024, tmp_path / "c.zarr", cpu_threads=1)
    run = _run({"hard": 1.0})
    with pytest.raises(ValueError, match="regression_bin_width"):
        train_student("stsb", model_cfg=run.model, run=run, loader_cfg=LoaderConfig(64, 4, 1), device="cpu",
                      tokens_dir=stsb["tokens"], store_path=tmp_path / "c.zarr", prepared_dir=stsb["prepared"],
                      out_dir=tmp_path / "student", ckpt_dir=tmp_path / "ck", live_dir=tmp_path / "plots")
