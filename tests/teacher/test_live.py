"""The live teacher (:mod:`distillpipe.teacher.live`): a run that computes its targets on each batch gets the rows,
the batches and the targets a run reading the dataset's cache gets, for every signal kind and stored form; a
student trained a few steps either way ends with the same weights; and the command wiring refuses what does not fit.

The reference is the cache itself, built by the real build from the same ``teacher_cache`` entry: the two paths
share the capture, but not the batches (the build batches a shard's rows by length, a run by its shuffled blocks),
not the fit's process, and not the store's encoding, so what is compared is what a user relies on."""

import shutil

import numpy as np
import pytest
import torch
from _teacher_tiny import VOCAB, save_teacher_dir, tiny_model
from _tiny import (
    TINY_WALDORF,
    make_classification_tokens,
    make_mlm_tokens,
    make_qa_tokens,
    read_curve,
    signals,
    write_params,
)

from distillpipe.config.base import ConfigError, build
from distillpipe.config.run import LoaderConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.data.collate import collate
from distillpipe.data.schema import read_meta, write_meta
from distillpipe.store.reader import open_store
from distillpipe.store.schema import (
    EMBEDDINGS,
    INT8_ROWS,
    INT8_SCORES,
    LENGTH,
    MLM_POSITIONS,
    UINT8_STEPS,
    signal_arrays,
)
from distillpipe.students import load_student
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.teacher.live import LiveSettings, live_teacher
from distillpipe.train.data import Source, teacher_targets
from distillpipe.train.loop import train_student

BATCH, SHARD = 16, 16
INT8 = {"hidden": "int8", "attention": "int8", "mlm_topk": "uint8"}
SETS = {
    # name: (teacher head, tokens kind, signals, max_rows)
    "logits, dense hidden and pooled scores": (
        "classification", "cls", signals(logits=True, hidden_layers=[1, 2], attn_layers=[2], pool=2, embeddings=True),
        None),
    "logits, compact int8 hidden and scores": (
        "classification", "cls", signals(logits=True, hidden_layers=[1, 4], hidden_rank=8, attn_layers=[2, 4],
                                         attn_rank=2, pool=2, embeddings=True, precision=INT8), None),
    "MLM top-k uint8, compact hidden and probabilities, a row subset": (
        "mlm", "mlm", signals(mlm_topk=8, hidden_layers=[2], hidden_rank=8, attn_layers=[1, 3], attn_rank=2,
                              attn_probs=True, pool=1, embeddings=True, precision=INT8), 40),
    "dense probabilities (MiniALBERT's)": (
        "base", "mlm", signals(hidden_layers=[1, 2], attn_layers=[1, 2], attn_probs=True, pool=1), None),
    "QA logits, dense probabilities": (
        "qa", "qa", signals(logits=True, hidden_layers=[4], attn_layers=[4], attn_probs=True, pool=1,
                            embeddings=True), None),
}
DATASET = {"cls": "toy", "mlm": "toy_mlm", "qa": "toy_qa"}
MINIALBERT = {"student": "minialbert", "embedding_size": 16, "d_model": 32, "n_heads": 4, "d_ff": 64, "n_iterations": 2,
              "adapter_size": 8, "max_position_embeddings": 64, "dropout": 0.0, "init_std": 0.02,
              "embedding_init": "random"}


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """One tiny teacher per head (trained-range weights) and tokens of each kind, tokenized for them."""
    root = tmp_path_factory.mktemp("live")
    dirs = {head: save_teacher_dir(root / f"t_{head}", tiny_model(head, seed=i, **over))
            for i, (head, over) in enumerate((("base", {}), ("mlm", {}), ("classification", {"num_labels": 2}),
                                              ("qa", {})))}
    # every teacher has the same tokenizer files: tokens made for one are the others' tokens too
    tokens = {"cls": make_classification_tokens(root / "cls", dirs["base"], n_train=80, n_dev=16),
              "mlm": make_mlm_tokens(root / "mlm", dirs["base"], n_rows=72, n_dev=8),
              "qa": None}
    prepared, tokens["qa"] = make_qa_tokens(root, dirs["base"], n_train=40, n_dev=8)
    for folder in tokens.values():  # the helpers record the 65-token vocabulary of _tiny's teachers
        meta = read_meta(folder)
        meta["tokenizer"]["vocab_size"] = VOCAB
        write_meta(folder, meta)
    return {"root": root, "dirs": dirs, "tokens": tokens, "prepared": {"qa": prepared}}


def _entry(head, sig, max_rows, teacher="t"):
    return build(TeacherCacheDatasetConfig, {"teacher": teacher, "head": head, "split": "train",
                                             "max_rows": max_rows, "signals": sig}, "teacher_cache.datasets.x")


def _store(teachers, tmp_path, head, kind, cfg, device="cpu"):
    out = tmp_path / f"{kind}.zarr"
    build_teacher_cache(DATASET[kind], teachers["tokens"][kind], teachers["dirs"][head], cfg, device, BATCH, SHARD,
                        out, cpu_threads=1)
    return out


def _sources(teachers, tmp_path, head, kind, sig, max_rows, device="cpu"):
    cfg = _entry(head, sig, max_rows)
    name, tokens = DATASET[kind], teachers["tokens"][kind]
    store = _store(teachers, tmp_path, head, kind, cfg, device)
    live = live_teacher(LiveSettings(name, teachers["dirs"][head], cfg, BATCH, SHARD, 1), tokens, device)
    names = [n for n in signal_arrays(live.spec) if n != LENGTH]
    kw = {"batch_size": 8, "seed": 0, "block_rows": 16, "buffer_blocks": 3, "streams": 1}
    dev = torch.device(device)
    return Source(name, tokens, store, names, **kw).to(dev), Source(name, tokens, live, names, **kw).to(dev)


def _batches(source, epoch, device="cpu"):
    """The source's batches of ``epoch`` as a training step makes them (on ``device``), targets back on the CPU."""
    source.loader.set_epoch(epoch)
    for rows, arrays in source.batches():
        batch, targets = collate(rows, kind=source.info.kind, pad_id=source.pad_id, labeled=source.info.labeled,
                                 pairs=False)
        targets |= teacher_targets(arrays, batch["attention_mask"], source.info.signals.pool)
        batch = {k: v.to(device) for k, v in batch.items()}
        targets = {k: v.to(device) for k, v in targets.items()}
        source.complete(batch, targets)
        yield {k: v.cpu() for k, v in batch.items()}, {k: v.cpu() for k, v in targets.items()}


def _check_equal(name, cached, live, kind):
    """Live within what the store's own rounding allows of cached: float16 storage (a value rounded once more, as
    batches padded differently round the float32 values differently), an int8 step of the row's scale, a 1/16-nat
    step of the uint8 top-k logits."""
    assert cached.shape == live.shape, (name, cached.shape, live.shape)
    if not cached.is_floating_point():
        assert torch.equal(cached.long(), live.long()), name  # ids: the store keeps them uint16, capture int32
        return
    masked = torch.isneginf(cached)  # dense scores keep -inf where the model masks
    assert torch.equal(masked, torch.isneginf(live)), name
    c, v = cached.masked_fill(masked, 0), live.masked_fill(masked, 0)
    if kind in (INT8_ROWS, INT8_SCORES):
        step = v.abs().amax(dim=-1, keepdim=True) / 127  # the row vector's scale (last axis)
        tol = step + c.abs() * 2**-10 + 1e-6  # half a step of rounding, and up to half again where the two differ
    elif kind == UINT8_STEPS:
        tol = torch.full_like(c, 1 / 16)
    else:
        tol = c.abs() * 2**-9 + 2e-3  # two float16 ulps, or 2e-3 near 0 (the neighbours' padding changed the last bits)
    worst = float(((c - v).abs() / tol).max())
    assert worst <= 1, f"{name}: live differs from the cache by {worst:.2f}x the tolerance"


def _check_factors(name, cached, live, int8):
    """Low-rank factors are compared as what the losses use, their product ``left^T right`` per head: a factor pair
    is unique up to the signs (and, for near-equal singular values, a rotation) of its rank components, which the
    slightly different float32 scores of another batch can flip."""
    (cl, cr), (ll, lr) = cached, live
    assert cl.shape == ll.shape and cr.shape == lr.shape, name
    pc, pl = torch.einsum("bhrq,bhrk->bhqk", cl, cr), torch.einsum("bhrq,bhrk->bhqk", ll, lr)
    r = cl.shape[2]
    size = (ll.abs().amax(dim=(2, 3)) * lr.abs().amax(dim=(2, 3)))[..., None, None] * r  # (B, H, 1, 1)
    tol = size * (2 / 127 if int8 else 2**-8) + 2e-3  # a step (a float16 ulp) of each factor, times the other
    worst = float(((pc - pl).abs() / tol).max())
    assert worst <= 1, f"{name}: live left^T right differs from the cache's by {worst:.2f}x the tolerance"


@pytest.mark.parametrize("which", list(SETS))
def test_live_targets_equal_the_caches_on_the_same_batches(teachers, tmp_path, which):
    _equal_targets(teachers, tmp_path, which, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("which", list(SETS))
def test_live_targets_equal_the_caches_on_cuda(teachers, tmp_path, which):
    """On the GPU both sides compute under the build's bf16 autocast: a cache built there, and the teacher live there,
    agree within the same rounding (``make gpu-check`` runs this)."""
    _equal_targets(teachers, tmp_path, which, "cuda")


def _equal_targets(teachers, tmp_path, which, device):
    head, kind, sig, max_rows = SETS[which]
    cached, live = _sources(teachers, tmp_path, head, kind, sig, max_rows, device)
    assert live.live.rows.n_rows == cached.store.n_rows  # the same rows (max_rows: the same subset)
    encodings = open_store(cached.store.root).manifest.signals.encodings()
    if cached.constants is not None:  # fitted again on the same rows in the same batches with the same threads
        same = torch.equal if device == "cpu" else lambda x, y: torch.allclose(x, y, rtol=1e-4, atol=1e-6)
        for j, pair in cached.constants.subspaces.items():
            assert all(same(x, y) for x, y in zip(pair, live.constants.subspaces[j], strict=True)), j
        c, v = cached.constants.embeddings, live.constants.embeddings
        assert (c is None) == (v is None)
        if c is not None:
            assert all(torch.equal(x, y) for x, y in zip(c.buffers(), v.buffers(), strict=True))
    n = 0
    for epoch in (0, 1):  # the second epoch's order too (a new shuffle of blocks, the same for both)
        for (bc, tc), (bl, tl) in zip(_batches(cached, epoch, device), _batches(live, epoch, device), strict=True):
            assert torch.equal(bc["input_ids"], bl["input_ids"])  # the same rows in the same order
            assert set(tc) == set(tl), set(tc) ^ set(tl)
            for key in tc:
                c, v = tc[key], tl[key]
                if key.endswith("/right"):
                    continue
                if key.endswith("/left"):
                    pair = key.removesuffix("/left")
                    _check_factors(pair, (c, tc[f"{pair}/right"]), (v, tl[f"{pair}/right"]), key in encodings)
                    continue
                if key.startswith("mlm/"):
                    m = bc["mlm_positions"].shape[1]  # a cache pads slots to the store's M, a batch to its own
                    assert key != MLM_POSITIONS or (c[:, m:] == -1).all()
                    c, v = c[:, :m], v[:, :m]
                _check_equal(key, c, v, encodings[key].kind if key in encodings else None)
            n += 1
    assert n == 2 * len(cached.loader)
    assert EMBEDDINGS in tc or not sig["embeddings"]


TRAIN = {
    # name: (head, kind, signals, student, loss weights, layer_map)
    "QA logits, compact hidden and scores, embeddings (WaLDORf)": (
        "qa", "qa", signals(logits=True, hidden_layers=[2, 4], hidden_rank=8, attn_layers=[2, 4], attn_rank=2, pool=4,
                            embeddings=True),
        TINY_WALDORF, {"hard": 0.5, "soft": 0.5, "hidden": 1.0, "attn": 1.0, "embedding": 1.0}, [2, 4]),
    "MLM top-k, probabilities (MiniALBERT)": (
        "mlm", "mlm", signals(mlm_topk=8, hidden_layers=[2, 4], attn_layers=[2, 4], attn_rank=2, attn_probs=True,
                              pool=1),
        MINIALBERT, {"hard": 0.5, "mlm_kd": 0.5, "hidden": 1.0, "attn_kl": 1.0}, [2, 4]),
}


@pytest.mark.parametrize("which", list(TRAIN))
def test_a_student_trained_live_ends_where_one_trained_from_the_cache_does(teachers, tmp_path, which):
    """The same run, two epochs (at most 16 steps) from the cache and from the live teacher: the same weights, up to
    what float16 targets rounded differently (the build's batches are not the run's) make of them."""
    head, kind, sig, model, weights, layer_map = TRAIN[which]
    cfg = _entry(head, sig, None)
    name, tokens, teacher = DATASET[kind], teachers["tokens"][kind], teachers["dirs"][head]
    store = _store(teachers, tmp_path, head, kind, cfg)
    run = build(TrainRunConfig, {
        "dataset": name, "teacher": f"data/teacher/{name}.zarr", "model": model, "encoding": "joint", "head": None,
        "mlm_views": "static",
        "objective": {"loss_weights": weights, "hidden_loss": "mse", "layer_map": layer_map,
                      "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 2.0,
                                   "temperature_decay": False}},
        "optim": {"epochs": 2, "max_steps": 16, "batch_size": 8, "lr": 3e-3, "weight_decay": 0.0,
                  "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
        "note": "live vs cached"}, "train.runs.r")
    out, curves, steps = {}, {}, {}
    for way, source in (("cached", store), ("live", LiveSettings(name, teacher, cfg, BATCH, SHARD, 1))):
        s = train_student(way, model_cfg=run.model, run=run, loader_cfg=LoaderConfig(16, 3, 1), device="cpu",
                          tokens_dir=tokens, store_path=source, prepared_dir=teachers["prepared"].get(kind),
                          out_dir=tmp_path / way,
                          ckpt_dir=tmp_path / f"{way}.ck", live_dir=tmp_path / f"{way}.p")
        steps[way] = s.steps
        out[way] = load_student(tmp_path / way, torch.device("cpu"))[0].state_dict()
        curves[way] = read_curve(tmp_path / f"{way}.p", "train/loss")
    assert steps["cached"] == steps["live"] >= 8
    assert set(curves["cached"]) == set(curves["live"]) == set(range(1, steps["live"] + 1))
    np.testing.assert_allclose(list(curves["live"].values()), list(curves["cached"].values()), rtol=1e-3)
    worst = max(float((out["cached"][k] - out["live"][k]).abs().max()) for k in out["cached"])
    assert worst < 1e-3, worst


def test_the_command_runs_a_teacher_folder_live_and_refuses_what_does_not_fit(teachers, tmp_path):
    """``--teacher models/teacher/<name>`` with the run's ``teacher`` param: the teacher of the dataset's
    ``teacher_cache`` entry, run live (no store anywhere); a folder the entry does not name, a store where the param
    says live, and a param of neither form are refused before anything loads."""
    from _tiny import invoke_cli

    head, kind, sig, _ = SETS["logits, dense hidden and pooled scores"]
    folder = tmp_path / "models" / "teacher" / "clf"
    folder.parent.mkdir(parents=True)
    folder.symlink_to(teachers["dirs"][head], target_is_directory=True)
    run = {"dataset": "toy", "teacher": "models/teacher/clf", "mlm_views": "static",
           "model": {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 4, "d_vec": 16,
                     "init_std": 0.01, "embedding_init": "random", "dropout": 0.0},
           "encoding": "joint", "head": {"type": "mlp", "hidden_size": 16, "dropout": 0.0},
           "objective": {"loss_weights": {"hard": 0.5, "soft": 0.5, "hidden": 1.0}, "hidden_loss": "cosine",
                         "layer_map": [2], "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0,
                                                        "temperature": 1.0, "temperature_decay": False}},
           "optim": {"epochs": 1, "max_steps": 4, "batch_size": 8, "lr": 3e-3, "weight_decay": 0.0,
                     "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
           "note": "live"}
    entry = {"teacher": "clf", "head": head, "split": "train", "max_rows": None, "signals": sig}

    def params(run_over=None, entry_over=None):
        return write_params(tmp_path / "params.yaml", {
            "train": {"device": "cpu", "loader": {"block_rows": 16, "buffer_blocks": 3, "streams": 1},
                      "runs": {"r": {**run, **(run_over or {})}}},
            "teacher_cache": {"device": "cpu", "batch_size": BATCH, "cpu_threads": 1, "shard_rows": SHARD,
                              "datasets": {"toy": {**entry, **(entry_over or {})}}}})

    def train(teacher, p):
        return invoke_cli(["train", "--run", "r", "--tokens", str(teachers["tokens"]["cls"]), "--teacher",
                           str(teacher), "--prepared", str(teachers["tokens"]["cls"]), "--out",
                           str(tmp_path / "s"), "--checkpoints", str(tmp_path / "s.ck"), "--live",
                           str(tmp_path / "s.p"), "--params", str(p)])

    res = train(folder, params())
    assert res.returncode == 0, res.stderr
    assert load_student(tmp_path / "s", torch.device("cpu"))[1]["steps"] == 4
    res = train(folder, params(entry_over={"teacher": "other"}))
    assert res.returncode != 0 and "set train.runs.r.teacher to models/teacher/other" in res.stderr
    res = train(tmp_path / "toy.zarr", params())
    assert res.returncode != 0 and "a teacher folder to run live was expected" in res.stderr
    with pytest.raises(ConfigError, match="cache .data/teacher/toy.zarr. or from a teacher folder"):
        build(TrainRunConfig, {**run, "teacher": "teachers/clf"}, "train.runs.r")


def test_a_live_run_refuses_tokens_of_another_tokenizer(teachers, tmp_path):
    head, kind, sig, _ = SETS["logits, dense hidden and pooled scores"]
    other = save_teacher_dir(tmp_path / "other", tiny_model(head, seed=9))
    (other / "vocab.txt").write_text((other / "vocab.txt").read_text() + "extra\n")
    with pytest.raises(Exception, match="another tokenizer"):
        live_teacher(LiveSettings("toy", other, _entry(head, sig, None), BATCH, SHARD, 1), teachers["tokens"]["cls"],
                     "cpu")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for a DVC repository")
def test_a_live_teacher_altered_after_the_committed_dvc_lock_is_refused(teachers, tmp_path):
    """The teacher folder a live run loads is proved against git's dvc.lock as a cache is (store/anchor.py): its
    weights decide every target. A weight file rewritten in the workspace is refused before anything loads."""
    from _dvc import DVC, sh

    from distillpipe.store.anchor import StoreAltered

    repo = tmp_path / "repo"
    shutil.copytree(teachers["dirs"]["classification"], repo / "seed")
    (repo / "dvc.yaml").write_text("stages:\n  teacher:\n    cmd: cp -r seed models/teacher/clf\n    deps: [seed]\n"
                                   "    outs: [models/teacher/clf]\n")
    (repo / "models" / "teacher").mkdir(parents=True)
    for args in (("git", "init", "-q"), (DVC, "init", "-q"), (DVC, "config", "core.analytics", "false"),
                 (DVC, "repro", "-q"), ("git", "add", "-A"), ("git", "commit", "-qm", "teacher")):
        sh(repo, *args)
    head, kind, sig, _ = SETS["logits, dense hidden and pooled scores"]
    folder = repo / "models" / "teacher" / "clf"
    settings = LiveSettings("toy", folder, _entry(head, sig, None), BATCH, SHARD, 1)
    run = build(TrainRunConfig, {
        "dataset": "toy", "teacher": "models/teacher/clf", "mlm_views": "static",
        "model": {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 4, "d_vec": 16,
                  "init_std": 0.01, "embedding_init": "random", "dropout": 0.0},
        "encoding": "joint", "head": {"type": "mlp", "hidden_size": 16, "dropout": 0.0},
        "objective": {"loss_weights": {"hard": 0.5, "soft": 0.5}, "hidden_loss": "cosine", "layer_map": [-1],
                      "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                   "temperature_decay": False}},
        "optim": {"epochs": 1, "max_steps": 2, "batch_size": 8, "lr": 3e-3, "weight_decay": 0.0, "max_grad_norm": 1.0,
                  "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
        "note": "anchored"}, "train.runs.r")

    def train(name):
        return train_student(name, model_cfg=run.model, run=run, loader_cfg=LoaderConfig(16, 3, 1), device="cpu",
                             tokens_dir=teachers["tokens"]["cls"], store_path=settings, prepared_dir=None,
                             out_dir=tmp_path / name, ckpt_dir=tmp_path / f"{name}.ck", live_dir=tmp_path / f"{name}.p")

    assert train("ok").steps == 2  # proved: every file is the one dvc.lock names
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.unlink()  # (the workspace copy may share the DVC cache's inode)
    weights.write_bytes(bytes(data))
    with pytest.raises(StoreAltered, match=r"^teacher models/teacher/clf: model\.safetensors .*is not the file the "
                                           r"committed dvc\.lock names.*changed in the workspace after checkout"):
        train("altered")
