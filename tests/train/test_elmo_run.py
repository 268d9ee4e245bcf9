"""ELMo-C, ELMo-A and ELMo-Sub through the student loop: each learns (held-out LM loss and accuracy over a fixed
number of steps), a frozen-feature fine-tune keeps the LM and its table bit-identical, and a SIGKILLed run
resumes to the same weights."""

import json

import numpy as np
import pytest
import torch
from _tiny import (
    make_classification_store,
    make_mlm_tokens,
    make_tiny_bert_dir,
    run_train_cli,
    signals,
    write_params,
)

from distillpipe.config.base import build
from distillpipe.config.finetune import FinetuneRunConfig
from distillpipe.config.run import LoaderConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train_lm import TrainLMRunConfig
from distillpipe.config.word_vectors import TrainedVectorsConfig
from distillpipe.data.fasttext import make_word_vectors
from distillpipe.data.word_vectors import table_fingerprint
from distillpipe.students import load_student
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.train.loop import train_student

LOADER = {"block_rows": 32, "buffer_blocks": 2, "streams": 1}
SCHEDULE = {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0, "temperature_decay": False}


def _model(output, dropout=0.0):
    return {"student": "elmo", "d_input": 16, "output": output, "d_hidden": 32, "d_proj": 16, "n_layers": 2,
            "adaptive_cutoffs": [20, 40], "adaptive_div_value": 2.0, "dropout": dropout, "init_std": 0.02}


def _run(output, dropout=0.0, **optim):
    o = {"epochs": 1, "max_steps": None, "batch_size": 8, "lr": 1e-2, "weight_decay": 0.0, "max_grad_norm": 1.0,
         "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0}
    o.update(optim)
    return {"dataset": "toy_mlm", "word_vectors": "ft", "model": _model(output, dropout), "encoding": "joint",
            "head": None, "objective": {"loss_weights": {"lm": 1.0}, "hidden_loss": "cosine", "layer_map": [-1, -1],
                                        "schedule": SCHEDULE},
            "optim": o, "note": "test"}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from datasets import Dataset, DatasetDict

    root = tmp_path_factory.mktemp("elmo")
    base = make_tiny_bert_dir(root / "base")
    tokens = make_mlm_tokens(root / "mlm", base, n_rows=96, n_dev=16, repeat=True, held_out=True)
    cfg = build(TeacherCacheDatasetConfig, {"teacher": "t", "head": "base", "split": "train", "max_rows": None,
                                            "signals": signals(hidden_layers=[2], attn_layers=[], pool=2)}, "tc")
    build_teacher_cache("mlm", tokens, base, cfg, "cpu", 16, 32, root / "mlm.zarr", cpu_threads=1)  # LM reads `length`
    rng = torch.Generator().manual_seed(0)
    texts = [" ".join(f"w{int(i)}" for i in torch.randint(0, 60, (12,), generator=rng)) for _ in range(200)]
    DatasetDict({"train": Dataset.from_dict({"text": texts})}).save_to_disk(str(root / "corpus"))
    wv = {"corpus": "toy", "dim": 16, "epochs": 1, "window": 3, "min_count": 1, "min_n": 2, "max_n": 3, "seed": 0,
          "center": True}
    make_word_vectors("ft", build(TrainedVectorsConfig, wv, "wv"), str(base), root / "ft", root / "corpus")
    # FastText on 60 random 'w<i>' words gives near-parallel vectors (shared n-grams: nearest-neighbour accuracy
    # says little); the learning test also runs on a random table in the same format
    rnd = root / "rnd"
    rnd.mkdir()
    table = np.random.default_rng(0).standard_normal((65, 16)).astype(np.float32)
    table[:5] = 0.0  # special tokens
    np.save(rnd / "vectors.npy", table)
    meta = json.loads((root / "ft" / "meta.json").read_text())
    (rnd / "meta.json").write_text(json.dumps({**meta, "name": "rnd", "fingerprint": table_fingerprint(table)}))
    return {"root": root, "base": base, "tokens": tokens, "store": root / "mlm.zarr", "wv": root / "ft", "rnd": rnd}


def _train(toy, tmp_path, run, name, table="wv", **kw):
    rcfg = build(TrainLMRunConfig, run, f"runs.{name}")
    return train_student(name, model_cfg=rcfg.model, run=rcfg, loader_cfg=build(LoaderConfig, LOADER, "loader"),
                         device="cpu", tokens_dir=toy["tokens"], store_path=toy["store"], prepared_dir=None,
                         out_dir=tmp_path / name, ckpt_dir=tmp_path / f"{name}.ckpt",
                         live_dir=tmp_path / f"{name}.plots",
                         word_vectors=toy[table], **kw)


@pytest.mark.parametrize("output", ["continuous", "adaptive", "subword"])
def test_each_variant_learns_on_held_out_rows(toy, tmp_path, output):
    init = _train(toy, tmp_path, _run(output, epochs=0), "init", table="rnd")
    trained = _train(toy, tmp_path, _run(output, epochs=6), "lm", table="rnd")  # 72 steps
    assert trained.metric == "lm_accuracy" and trained.steps == 72
    assert trained.dev["lm_loss"] < 0.7 * init.dev["lm_loss"], (init.dev, trained.dev)
    assert trained.dev["lm_accuracy"] > init.dev["lm_accuracy"] + 0.3, (init.dev, trained.dev)
    state = torch.load(tmp_path / "lm" / "model.pt", weights_only=True)
    table = torch.from_numpy(np.load(toy["rnd"] / "vectors.npy"))
    assert torch.equal(state["input_vectors"], table)  # the table travels with the student, unchanged


def test_frozen_feature_finetune_keeps_the_lm_bit_identical(toy, tmp_path):
    _train(toy, tmp_path, _run("continuous", epochs=1), "lm")
    cls = make_classification_store(tmp_path)  # same tiny vocabulary
    run = build(FinetuneRunConfig, {
        "init": "lm", "student": "elmo", "tune": "head", "dataset": "toy", "encoding": "joint",
        "teacher": "data/teacher/toy.zarr",
        "head": {"type": "mlp", "hidden_size": 16, "dropout": 0.0},
        "objective": {"loss_weights": {"hard": 1.0}, "hidden_loss": "cosine", "layer_map": [-1, -1],
                      "schedule": SCHEDULE},
        "optim": {"epochs": 2, "max_steps": None, "batch_size": 8, "lr": 1e-2, "weight_decay": 0.0,
                  "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
        "note": "test"}, "runs.ft")
    model_cfg = load_student(tmp_path / "lm", torch.device("cpu"))[1]["model"]
    train_student("ft", model_cfg=model_cfg, run=run, loader_cfg=build(LoaderConfig, LOADER, "loader"), device="cpu",
                  tokens_dir=cls["tokens"], store_path=cls["store"], prepared_dir=None, out_dir=tmp_path / "ft",
                  ckpt_dir=tmp_path / "ft.ckpt", live_dir=tmp_path / "ft.plots",
                  init_dir=tmp_path / "lm")
    lm = torch.load(tmp_path / "lm" / "model.pt", weights_only=True)
    ft = torch.load(tmp_path / "ft" / "model.pt", weights_only=True)
    encoder = {k for k in lm if not k.startswith("mlm_head.")}
    assert encoder == {k for k in ft if not k.startswith("head.")}
    assert all(torch.equal(lm[k], ft[k]) for k in encoder)
    assert not torch.equal(ft["head.mix.scalars"], torch.zeros(2))  # the scalar mix trained


@pytest.mark.slow  # ~20 s: three processes (the loop's own resume test runs by default)
def test_sigkill_then_resume_gives_the_same_weights(toy, tmp_path):
    params = write_params(tmp_path / "params.yaml", {"train_lm": {"device": "cpu", "loader": LOADER, "runs": {
        "toy-lm": _run("continuous", dropout=0.1, epochs=2, checkpoint_minutes=0, eval_every=6)}}})

    def cli(out, kill_at=None):
        return run_train_cli("toy-lm", tokens=toy["tokens"], store=toy["store"], prepared=toy["tokens"], out=out,
                             params=params, kill_at=kill_at, word_vectors=toy["wv"])

    ref = cli(tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr
    killed = cli(tmp_path / "res", kill_at=12)  # 24 steps: killed half-way
    assert killed.returncode == -9, killed.stderr
    resumed = cli(tmp_path / "res")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming toy-lm at step 12/24" in resumed.stderr
    a = torch.load(tmp_path / "ref" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "res" / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
