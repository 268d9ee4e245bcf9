"""MiniALBERT through the same loop: a teacher cache with per-token hidden states and attention probabilities
(``attn_probs``), the attention-KL and hidden-cosine terms read from it against a live teacher, a row-capped
cache, and a tiny general distillation that learns on held-out rows."""

import numpy as np
import pytest
import torch
from _tiny import make_mlm_tokens, make_tiny_bert_dir, signals

from distillpipe.config.base import build
from distillpipe.config.run import LoaderConfig, ObjectiveConfig
from distillpipe.config.students import MiniALBERTConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.data.collate import collate
from distillpipe.store.reader import open_store
from distillpipe.students import build_student, load_student
from distillpipe.students.base import TaskSpec
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.train.data import teacher_targets
from distillpipe.train.loop import train_student
from distillpipe.train.objective import Objective, probe_student, store_names
from distillpipe.train.schedule import AllOnes

MODEL = {"student": "minialbert", "embedding_size": 16, "d_model": 32, "n_heads": 4, "d_ff": 64, "n_iterations": 2,
         "adapter_size": 8, "max_position_embeddings": 32, "dropout": 0.0, "init_std": 0.02, "embedding_init": "random"}
ALL_AT_ONCE = {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0, "temperature_decay": False}


def _cache(tokens, teacher, out, max_rows=None):
    cfg = build(TeacherCacheDatasetConfig, {
        "teacher": "t", "head": "base", "split": "train", "max_rows": max_rows,
        "signals": signals(hidden_layers=[1, 2], attn_layers=[1, 2], pool=1, attn_probs=True)},
        "teacher_cache.datasets.toy_mlm")
    build_teacher_cache("toy_mlm", tokens, teacher, cfg, "cpu", 16, 32, out, cpu_threads=1)
    return out


def _peaked(folder):
    """A random BERT attends almost uniformly (scores ~ 0 at init std 0.02): scale its query and key weights so
    that its attention maps have structure a student must learn."""
    from transformers import BertModel

    model = BertModel.from_pretrained(folder)
    with torch.no_grad():
        for layer in model.encoder.layer:
            layer.attention.self.query.weight.mul_(12.0)
            layer.attention.self.key.weight.mul_(12.0)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    root = tmp_path_factory.mktemp("minialbert")
    teacher = _peaked(make_tiny_bert_dir(root / "teacher", layers=2, heads=4))
    tokens = make_mlm_tokens(root / "mlm", teacher, n_rows=64, n_dev=16, repeat=True)
    held = make_mlm_tokens(root / "held", teacher, n_rows=32, seed=1, repeat=True)
    return {"teacher": teacher, "tokens": tokens, "store": _cache(tokens, teacher, root / "mlm.zarr"),
            "held": held, "held_store": _cache(held, teacher, root / "held.zarr")}


def _objective_cfg(weights):
    return build(ObjectiveConfig, {"loss_weights": weights, "hidden_loss": "cosine", "layer_map": [1, 2],
                                   "schedule": ALL_AT_ONCE}, "objective")


def _batches(tokens, store_path, names, size=16):
    """(batch, targets) of every cached row, read and collated as the loop does."""
    from datasets import load_from_disk

    store = open_store(store_path)
    rows = load_from_disk(str(tokens))["train"]
    for start in range(0, store.n_rows, size):
        arrays = store.read(["row_index", *names], start, min(store.n_rows, start + size))
        part = rows.select(arrays.pop("row_index").tolist())[:]
        batch, targets = collate(part, kind="mlm", pad_id=0, labeled=True, pairs=False)
        yield batch, targets | teacher_targets(arrays, batch["attention_mask"], pool=1)


def test_cached_attention_kl_and_hidden_cosine_equal_a_live_teacher(mlm):
    """The terms ``attn_kl/<j>`` and ``hidden/<j>`` computed by the objective from the store equal eqs. (7) and (8)
    written out naively against the live teacher (HF BertModel, eager attention) on the same rows."""
    from transformers import BertModel

    store = open_store(mlm["store"])
    assert {"attn_probs/L1", "attn_probs/L2", "hidden/L1", "hidden/L2"} <= set(store.arrays)
    assert not any(a.startswith("attn_scores/") for a in store.arrays)  # probabilities instead of scores
    task = TaskSpec(kind="mlm", vocab_size=65, max_seq_len=32, pad_id=0, num_labels=0, encoding="joint", head=None)
    torch.manual_seed(0)
    student = build_student(build(MiniALBERTConfig, MODEL, "model"), task).eval()
    cfg = _objective_cfg({"hidden": 3.0, "attn_kl": 3.0})
    names = store_names(cfg, "mlm", store.manifest.signals)
    assert names == ["length", "hidden/L1", "hidden/L2", "attn_probs/L1", "attn_probs/L2"]
    batch, targets = next(_batches(mlm["tokens"], mlm["store"], names))
    objective = Objective(cfg, kind="mlm", signals=store.manifest.signals, dims=probe_student(student, batch))
    teacher = BertModel.from_pretrained(mlm["teacher"], attn_implementation="eager").eval()
    with torch.no_grad():
        out = student(batch)
        _, parts = objective(out, targets, multipliers=AllOnes(), temperature=1.0)
        live = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long(),
                       token_type_ids=batch["token_type_ids"], output_attentions=True, output_hidden_states=True)
    assert set(parts) == {"hidden/0", "hidden/1", "attn_kl/0", "attn_kl/1"}
    lengths = batch["attention_mask"].sum(1).tolist()
    for j, t in enumerate((1, 2)):
        kl, n = 0.0, 0  # eq. (7): KL(teacher row || student row) per head and valid query, over valid keys
        for b, L in enumerate(lengths):
            p = live.attentions[t - 1][b, :, :L, :L].double()  # (H, L, L)
            logq = torch.log_softmax(out.attn_scores[j][b, :, :L, :L].double(), dim=-1)
            kl += torch.where(p > 0, p * (p.log() - logq), torch.zeros_like(p)).sum().item()
            n += p.shape[0] * L
        assert parts[f"attn_kl/{j}"].item() == pytest.approx(kl / n, abs=2e-3)
        cos, n = 0.0, 0  # eq. (8): mean of 1 - cos over valid tokens (student through the learned projection)
        proj = objective.hidden_proj(out.hidden[j]).detach()
        for b, L in enumerate(lengths):
            cos += (1 - torch.cosine_similarity(proj[b, :L].double(), live.hidden_states[t][b, :L].double(), -1)).sum()
            n += L
        assert parts[f"hidden/{j}"].item() == pytest.approx(float(cos) / n, abs=2e-3)


def test_max_rows_caches_evenly_spaced_rows(mlm, tmp_path):
    """``max_rows``: the subset's row_index names the tokens rows, and its arrays are the full cache's rows."""
    small = open_store(_cache(mlm["tokens"], mlm["teacher"], tmp_path / "small.zarr", max_rows=10))
    full = open_store(mlm["store"])
    idx = small.read(["row_index"], 0, 10)["row_index"]
    np.testing.assert_array_equal(idx, np.round(np.arange(10) * 63 / 9).astype(int))
    assert small.manifest.row_subset == {"max_rows": 10, "rule": "evenly_spaced"}
    a, b = small.read(["attn_probs/L2"], 0, 10)["attn_probs/L2"], full.read(["attn_probs/L2"], 0, 64)["attn_probs/L2"]
    # the same rows, batched with other neighbours (padding changes the last fp32 bits before the fp16 store)
    np.testing.assert_allclose(a.astype(np.float32), b[idx].astype(np.float32), rtol=0, atol=2e-3)


def _train(mlm, tmp_path, name, epochs):
    run = build(TrainRunConfig, {
        "dataset": "toy_mlm", "teacher": "data/teacher/toy_mlm.zarr", "model": MODEL, "encoding": "joint", "head": None,
        "mlm_views": "static",
        "objective": {"loss_weights": {"hard": 1.0, "hidden": 3.0, "attn_kl": 3.0}, "hidden_loss": "cosine",
                      "layer_map": [1, 2], "schedule": {**ALL_AT_ONCE, "warmup_fraction": 0.1}},
        "optim": {"epochs": epochs, "max_steps": None, "batch_size": 8, "lr": 3e-3, "weight_decay": 0.0,
                  "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
        "note": "test"}, f"train.runs.{name}")
    train_student(name, model_cfg=run.model, run=run, loader_cfg=LoaderConfig(32, 2, 1), device="cpu",
                  tokens_dir=mlm["tokens"], store_path=mlm["store"], prepared_dir=None, out_dir=tmp_path / name,
                  ckpt_dir=tmp_path / f"{name}.ck", live_dir=tmp_path / f"{name}.p")
    return load_student(tmp_path / name, torch.device("cpu"))[0]


def test_general_distillation_learns_on_held_out_rows(mlm, tmp_path):
    """Eq. (11) without the output KL (the tiny teacher has no MLM head): training lowers the MLM CE and the
    attention KL on 32 rows the student never saw (160 steps), against their own teacher cache."""
    cfg = _objective_cfg({"hard": 1.0, "attn_kl": 3.0})
    signals_ = open_store(mlm["held_store"]).manifest.signals
    names = store_names(cfg, "mlm", signals_)

    def held_out(model):
        sums = {}
        for batch, targets in _batches(mlm["held"], mlm["held_store"], names):
            obj = Objective(cfg, kind="mlm", signals=signals_, dims=probe_student(model, batch))
            with torch.no_grad():
                _, parts = obj(model(batch), targets, multipliers=AllOnes(), temperature=1.0)
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        return sums

    before, after = held_out(_train(mlm, tmp_path, "init", 0)), held_out(_train(mlm, tmp_path, "trained", 20))
    assert set(before) == {"hard", "attn_kl/0", "attn_kl/1"}
    # measured: MLM CE 8.34 -> 7.99 (sum of 2 batches; uniform is 2 log 65 = 8.35), KL 1.29 -> 0.77, 1.02 -> 0.74
    for term in before:
        assert after[term] < 0.97 * before[term], (term, before[term], after[term])

    def total(x):
        return x["hard"] + 3.0 * (x["attn_kl/0"] + x["attn_kl/1"])

    assert total(after) < 0.9 * total(before)


def test_attention_kl_needs_the_cached_probabilities(mlm):
    """A cache of pooled scores (or of other layers) cannot feed the attention KL: refused, naming the fix."""
    import dataclasses

    from distillpipe.train.objective import ObjectiveError, StudentDims

    spec = open_store(mlm["store"]).manifest.signals
    dims = StudentDims(hidden=(32, 32), hidden_stride=1, attn_heads=(4, 4), embedding=0, lm=False)
    Objective(_objective_cfg({"attn_kl": 1.0}), kind="mlm", signals=spec, dims=dims)  # the cache has L1, L2
    scores_only = dataclasses.replace(spec, attn_layers=(1, 2), attn_probs_layers=())
    with pytest.raises(ObjectiveError, match=r"attention probabilities of layers \[1, 2\].*attn_probs: true"):
        Objective(_objective_cfg({"attn_kl": 1.0}), kind="mlm", signals=scores_only, dims=dims)
    with pytest.raises(ObjectiveError, match=r"as many student heads as teacher heads \(4\)"):
        Objective(_objective_cfg({"attn_kl": 1.0}), kind="mlm", signals=spec,
                  dims=dataclasses.replace(dims, attn_heads=(2, 2)))
