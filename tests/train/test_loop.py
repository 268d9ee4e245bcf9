"""The student training loop end to end on tiny teachers and caches: it learns, it initialises from a
general-distilled student, it early-stops, and a SIGKILLed run resumes to the same weights."""

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from _tiny import (
    invoke_train_cli,
    live_files,
    make_classification_tokens,
    make_mlm_tokens,
    make_tiny_bert_dir,
    read_curve,
    run_train_cli,
    signals,
    write_params,
)

from distillpipe.config.base import build
from distillpipe.config.finetune import FinetuneRunConfig
from distillpipe.config.run import LoaderConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.data.collate import IGNORE, TrainDataError, collate
from distillpipe.students import load_student
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.train.data import teacher_targets
from distillpipe.train.loop import train_student
from distillpipe.train.objective import ObjectiveError

SHARD = 32
LOADER = {"block_rows": 32, "buffer_blocks": 2, "streams": 1}
MODEL = {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 4, "d_vec": 16,
         "init_std": 0.01, "embedding_init": "random", "dropout": 0.0}
ALL_AT_ONCE = {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0, "temperature_decay": False}


def _optim(**over):
    o = {"epochs": 3, "max_steps": None, "batch_size": 8, "lr": 3e-3, "weight_decay": 0.0, "max_grad_norm": 1.0,
         "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0}
    o.update(over)
    return o


def _objective(weights, layer_map=(-1,)):
    return {"loss_weights": weights, "hidden_loss": "cosine", "layer_map": list(layer_map), "schedule": ALL_AT_ONCE}


def _cls_run(**over):
    r = {"dataset": "toy", "teacher": "data/teacher/toy.zarr", "model": MODEL, "encoding": "joint",
         "mlm_views": "static",
         "head": {"type": "mlp", "hidden_size": 16, "dropout": 0.0},
         "objective": _objective({"hard": 0.5, "soft": 0.5}), "optim": _optim(), "note": "test"}
    r.update(over)
    return r


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("students")
    base = make_tiny_bert_dir(root / "base")
    clf = make_tiny_bert_dir(root / "clf", num_labels=2, seed=1)
    cls_tokens = make_classification_tokens(root / "cls", clf, n_train=96, n_dev=32)
    mlm_tokens = make_mlm_tokens(root / "mlm", base, n_rows=64, n_dev=16)

    def cfg(head, **sig):
        return build(TeacherCacheDatasetConfig, {"teacher": "t", "head": head, "split": "train", "max_rows": None,
                                                 "signals": signals(**sig)}, "teacher_cache.datasets.toy")

    build_teacher_cache("cls", cls_tokens, clf, cfg("classification", logits=True, hidden_layers=[], attn_layers=[],
                                                    pool=1), "cpu", 16, SHARD, root / "cls.zarr", cpu_threads=1)
    build_teacher_cache("mlm", mlm_tokens, base, cfg("base", hidden_layers=[2], attn_layers=[], pool=2), "cpu", 16,
                        SHARD, root / "mlm.zarr", cpu_threads=1)
    return {"root": root, "cls": cls_tokens, "mlm": mlm_tokens, "cls_store": root / "cls.zarr",
            "mlm_store": root / "mlm.zarr"}


def _train(toy, tmp_path, run: dict, *, kind="cls", name="run", init=None, finetune=False):
    rcfg = build(FinetuneRunConfig if finetune else TrainRunConfig, run, f"runs.{name}")
    model_cfg = load_student(init, torch.device("cpu"))[1]["model"] if finetune else rcfg.model
    return train_student(name, model_cfg=model_cfg, run=rcfg, loader_cfg=build(LoaderConfig, LOADER, "loader"),
                         device="cpu", tokens_dir=toy[kind], store_path=toy[f"{kind}_store"], prepared_dir=None,
                         out_dir=tmp_path / name, ckpt_dir=tmp_path / f"{name}.ckpt",
                         live_dir=tmp_path / f"{name}.live", init_dir=init)


def test_task_distillation_learns_and_saves(toy, tmp_path):
    s = _train(toy, tmp_path, _cls_run(optim=_optim(epochs=12)))
    assert s.steps == 12 * 96 // 8
    assert s.dev["accuracy"] >= 0.9, s  # 'contains token 7' is easy for a bag of words
    _, record = load_student(tmp_path / "run", torch.device("cpu"))
    assert record["dev"] == s.dev and record["steps"] == s.steps
    from distillpipe.identity import code_identity, stage_code
    from distillpipe.train.build import CODE_STAGES

    assert record["code"] == code_identity(stage_code(*CODE_STAGES, student="cmow_hybrid"))  # as its checkpoints'
    # dvclive: the training schema, headline first; one value per step for the loss, its terms and the lr
    metrics = json.loads((tmp_path / "run.live" / "metrics.json").read_text())
    assert metrics == {"dev": s.dev["accuracy"], "metric": "accuracy", "best_step": s.best_step, "step": s.steps}
    assert list(metrics) == ["dev", "metric", "best_step", "step"]
    for name in ("train/loss", "train/lr", "train/temperature", "train/hard", "train/soft"):
        assert list(read_curve(tmp_path / "run.live", name)) == list(range(1, s.steps + 1)), name
    lr = read_curve(tmp_path / "run.live", "train/lr")  # no warmup, linear decay to 0 over the run
    assert lr == pytest.approx({k: 3e-3 * (1 - (k - 1) / s.steps) for k in range(1, s.steps + 1)}, rel=1e-12)
    assert read_curve(tmp_path / "run.live", "train/temperature") == dict.fromkeys(lr, 1.0)
    dev = read_curve(tmp_path / "run.live", "dev/accuracy")  # eval_every 0: at each epoch's end
    assert list(dev) == list(range(12, s.steps + 1, 12)) and dev[s.best_step] == max(dev.values()) == s.dev["accuracy"]
    params = yaml.safe_load((tmp_path / "run.live" / "params.yaml").read_text())
    assert params == _cls_run(optim=_optim(epochs=12))  # the run's params as given
    assert not any((tmp_path / "run.ckpt").glob("*.pt")), "checkpoints are cleared once the student is saved"


def test_general_distillation_then_finetune_copies_the_encoder(toy, tmp_path):
    general = {**_cls_run(), "dataset": "toy_mlm", "teacher": "data/teacher/toy_mlm.zarr", "head": None,
               "mlm_views": "static",
               "objective": _objective({"hard": 0.5, "hidden": 0.5}, layer_map=[2]), "optim": _optim(epochs=2)}
    s = _train(toy, tmp_path, general, kind="mlm", name="general")
    first = s.steps
    hidden = list(read_curve(tmp_path / "general.live", "train/hidden/0").values())
    assert len(hidden) == first
    assert np.mean(hidden[-4:]) < np.mean(hidden[:4]), "the hidden-state loss falls"
    assert "mlm_accuracy" in s.dev and first == 2 * 64 // 8

    ft = {k: v for k, v in _cls_run().items() if k not in ("model", "mlm_views")}
    ft |= {"init": "general", "student": "cmow_hybrid", "tune": "full", "optim": _optim(epochs=0)}
    _train(toy, tmp_path, ft, name="ft", init=tmp_path / "general", finetune=True)
    g, _ = load_student(tmp_path / "general", torch.device("cpu"))
    f, _ = load_student(tmp_path / "ft", torch.device("cpu"))
    gs, fs = g.state_dict(), f.state_dict()
    encoder = [k for k in gs if not k.startswith(("head.", "mlm_head."))]
    assert encoder and all(torch.equal(gs[k], fs[k]) for k in encoder)
    assert any(k.startswith("head.") for k in fs) and not any(k.startswith("mlm_head.") for k in fs)


def test_tune_head_trains_only_the_head(toy, tmp_path):
    """``tune: head`` (frozen features): after real optimizer steps the encoder is bit-identical to the init, the
    head has moved, and the metrics count only the head as trainable; ``tune: adapters`` on a student without
    adapters is refused."""
    _train(toy, tmp_path, _cls_run(optim=_optim(epochs=1)), name="init")
    ft = {k: v for k, v in _cls_run().items() if k not in ("model", "mlm_views")}
    ft |= {"init": "init", "student": "cmow_hybrid", "tune": "head", "optim": _optim(epochs=2, lr=1e-2)}
    s = _train(toy, tmp_path, ft, name="ft", init=tmp_path / "init", finetune=True)
    assert s.steps == 2 * 96 // 8
    g, _ = load_student(tmp_path / "init", torch.device("cpu"))
    f, _ = load_student(tmp_path / "ft", torch.device("cpu"))
    gs, fs = g.state_dict(), f.state_dict()
    encoder = [k for k in gs if not k.startswith("head.")]
    assert encoder and all(torch.equal(gs[k], fs[k]) for k in encoder)
    record = load_student(tmp_path / "ft", torch.device("cpu"))[1]
    head = sum(p.numel() for n, p in f.named_parameters() if n.startswith("head."))
    assert record["trainable_params"] == head < sum(p.numel() for p in f.parameters())
    _train(toy, tmp_path, {**ft, "optim": _optim(epochs=0)}, name="ft0", init=tmp_path / "init", finetune=True)
    h0 = load_student(tmp_path / "ft0", torch.device("cpu"))[0].state_dict()  # the same seeded head, untrained
    assert any(not torch.equal(h0[k], fs[k]) for k in fs if k.startswith("head.")), "the head trained"
    with pytest.raises(Exception, match="has no adapters"):
        _train(toy, tmp_path, {**ft, "tune": "adapters"}, name="ad", init=tmp_path / "init", finetune=True)


def test_early_stopping_keeps_the_best_weights(toy, tmp_path):
    # lr so small that the dev score never improves after the first evaluation
    run = _cls_run(optim=_optim(epochs=50, lr=1e-12, eval_every=2, patience=3))
    s = _train(toy, tmp_path, run)
    assert s.stopped_early and s.steps == 2 * 4 and s.best_step == 2
    assert list(read_curve(tmp_path / "run.live", "dev/accuracy")) == [2, 4, 6, 8]
    assert json.loads((tmp_path / "run.live" / "metrics.json").read_text())["best_step"] == 2


def test_missing_teacher_signal_is_a_clear_error(toy, tmp_path):
    run = _cls_run(objective=_objective({"hard": 0.5, "hidden": 0.5}, layer_map=[2]))
    with pytest.raises(Exception, match=r"hidden/L2.*add the signals to teacher_cache"):
        _train(toy, tmp_path, run)
    bad = {**_cls_run(), "dataset": "toy_mlm", "teacher": "data/teacher/toy_mlm.zarr", "head": None,
           "mlm_views": "static",
           "objective": _objective({"hard": 0.5, "hidden": 0.5}, layer_map=[2, 2])}
    with pytest.raises(ObjectiveError, match="layer_map has 2 entries but the student exposes 1"):
        _train(toy, tmp_path, bad, kind="mlm")


def test_rows_without_ground_truth_get_no_hard_labels():
    rows = {"input_ids": [[2, 9, 3], [2, 7, 8, 3]], "token_type_ids": [[0] * 3, [0] * 4], "label": [1, 0],
            "labeled": [True, False]}
    _, t = collate(rows, kind="classification", pad_id=0, labeled=True, pairs=False)
    assert t["labels"].tolist() == [1, IGNORE]
    _, t = collate(rows, kind="classification", pad_id=0, labeled=False, pairs=False)
    assert t["labels"].tolist() == [IGNORE, IGNORE]


def _cli(toy, params, out, kill_at=None):
    """`distillpipe train` in a process of its own (to SIGKILL it after step ``kill_at``)."""
    return run_train_cli("toy-run", tokens=toy["cls"], store=toy["cls_store"], prepared=toy["cls"], out=out,
                         params=params, kill_at=kill_at)


def _cli_here(toy, params, out):
    """The same command in this process: the uninterrupted reference and the resumed run (no ~5 s of imports)."""
    return invoke_train_cli("toy-run", tokens=toy["cls"], store=toy["cls_store"], prepared=toy["cls"], out=out,
                            params=params)


def test_sigkill_then_resume_gives_the_same_weights(toy, tmp_path):
    # dropout on: the resumed run must also continue the RNG stream exactly
    run = _cls_run(model={**MODEL, "dropout": 0.1}, optim=_optim(epochs=2, checkpoint_minutes=0, eval_every=6))
    params = write_params(tmp_path / "params.yaml", {"train": {"device": "cpu", "loader": LOADER,
                                                               "runs": {"toy-run": run}}})
    ref = _cli_here(toy, params, tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr
    killed = _cli(toy, params, tmp_path / "res", kill_at=12)  # 24 steps: killed half-way, mid-epoch 1
    assert killed.returncode == -9, killed.stderr
    resumed = _cli_here(toy, params, tmp_path / "res")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming toy-run at step 12/24" in resumed.stderr
    a = torch.load(tmp_path / "ref" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "res" / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the dvclive folder is written from the checkpointed logs: the same bytes as the straight run's, no
    # step repeated (the killed run's steps 13.. were never written)
    ref_live, res_live = live_files(tmp_path / "ref.live"), live_files(tmp_path / "res.live")
    assert ref_live == res_live
    assert list(read_curve(tmp_path / "res.live", "train/loss")) == list(range(1, 25))
    assert list(read_curve(tmp_path / "res.live", "dev/accuracy")) == [6, 12, 18, 24]
    assert {"metrics.json", "params.yaml", "plots/metrics/train/soft.tsv"} <= set(res_live)


FULL_DISK_DRIVER = """
import os, sys
sys.path.insert(0, os.environ["TESTS_DIR"])
from _fulldisk import FullDisk
from distillpipe import checkpoints
full_at = int(os.environ["FULL_AT_STEP"])
orig = checkpoints.save_checkpoint
def save(folder, step, state, keep=2):
    if step != full_at:
        return orig(folder, step, state, keep)
    with FullDisk(folder, 4096):  # the disk fills up during this checkpoint
        return orig(folder, step, state, keep)
checkpoints.save_checkpoint = save
from distillpipe.cli import app
app(sys.argv[1:], prog_name="distillpipe")
"""


@pytest.mark.slow  # ~30 s: three training runs (tests/test_checkpoints.py checks the message and files in 2 s)
def test_full_disk_at_a_checkpoint_stops_with_exit_2_and_resumes_to_the_same_weights(toy, tmp_path):
    import os
    import subprocess
    import sys

    run = _cls_run(model={**MODEL, "dropout": 0.1}, optim=_optim(epochs=2, checkpoint_minutes=0, eval_every=6))
    params = write_params(tmp_path / "params.yaml", {"train": {"device": "cpu", "loader": LOADER,
                                                               "runs": {"toy-run": run}}})
    ref = _cli(toy, params, tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "res"
    full = subprocess.run([sys.executable, "-c", FULL_DISK_DRIVER, "train", "--run", "toy-run", "--tokens",
                           str(toy["cls"]), "--teacher", str(toy["cls_store"]), "--prepared", str(toy["cls"]),
                           "--out", str(out), "--checkpoints", f"{out}.ckpt", "--live", f"{out}.live", "--params",
                           str(params)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "FULL_AT_STEP": "12",
                               "TESTS_DIR": str(Path(__file__).parents[1])})
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-3000:]
    errors = [line for line in full.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, full.stderr[-3000:]
    assert f"no space left on device writing checkpoint {out}.ckpt/step-000000012.pt: it needs ~" in errors[0]
    assert "resumes from step-000000011.pt" in errors[0]  # checkpoint_minutes 0: one after every step
    assert sorted(p.name for p in Path(f"{out}.ckpt").iterdir()) == ["step-000000010.pt", "step-000000011.pt"]
    resumed = _cli(toy, params, out)  # the space is back
    assert resumed.returncode == 0 and "resuming toy-run at step 11/24" in resumed.stderr, resumed.stderr
    a = torch.load(tmp_path / "ref" / "model.pt", weights_only=True)
    b = torch.load(out / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert live_files(tmp_path / "ref.live") == live_files(tmp_path / "res.live")


def test_full_disk_writing_the_student_stops_with_exit_2_and_leaves_no_student(toy, tmp_path, monkeypatch, caplog):
    """The disk fills up while the final model.pt is written: one `error:` line with the space its weights need and
    the space free, exit 2, no folder that looks like a student; the checkpoints stay, and once there is room the
    same command resumes from the last one and writes the student."""
    from _fulldisk import FullDisk
    from typer.testing import CliRunner

    from distillpipe.cli import app

    params = write_params(tmp_path / "params.yaml", {"train": {"device": "cpu", "loader": LOADER, "runs": {
        "toy-run": _cls_run(optim=_optim(epochs=1, checkpoint_minutes=0))}}})
    out = tmp_path / "res"
    args = ["train", "--run", "toy-run", "--tokens", str(toy["cls"]), "--teacher", str(toy["cls_store"]),
            "--prepared", str(toy["cls"]), "--out", str(out), "--checkpoints", f"{out}.ckpt", "--live", f"{out}.live",
            "--params", str(params)]
    with monkeypatch.context() as m:
        disk = FullDisk(tmp_path / "res.partial", 4096).install(m)  # only the student's folder is short of space
        res = CliRunner().invoke(app, args)
    assert disk.failed == [str(out.with_name("res.partial") / "model.pt")]
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    assert errors[0].startswith(f"error: no space left on device writing the student {out / 'model.pt'}: its weights "
                                "need ~") and " MB is free on " in errors[0], errors[0]
    need = float(re.search(r"need ~([\d.,]+) MB", errors[0]).group(1).replace(",", ""))
    assert not out.exists() and not out.with_name("res.partial").exists()  # nothing that looks like a student
    assert [p.name for p in Path(f"{out}.ckpt").iterdir()] != []  # the resume point is kept
    with caplog.at_level(logging.INFO):
        res = CliRunner().invoke(app, args)  # the space is back
    assert res.exit_code == 0, res.output
    assert "resuming toy-run at step 11/12" in caplog.text  # none at the end: the student is written right after
    load_student(out, torch.device("cpu"))
    assert need == pytest.approx((out / "model.pt").stat().st_size / 1e6, rel=0.1, abs=0.05)
    assert not Path(f"{out}.ckpt").exists() or not list(Path(f"{out}.ckpt").iterdir())


def _unlabeled_copy(toy, root):
    """The toy classification tokens as an augmented set: same rows, meta says no ground truth."""
    import shutil

    aug = root / "aug_tokens"
    if not aug.exists():
        shutil.copytree(toy["cls"], aug)
        meta = json.loads((aug / "meta.json").read_text())
        (aug / "meta.json").write_text(json.dumps({**meta, "name": "toy_aug", "labeled": False}))
        cfg = build(TeacherCacheDatasetConfig, {"teacher": "t", "head": "classification", "split": "train",
                                                "max_rows": None,
                                                "signals": signals(logits=True, hidden_layers=[], attn_layers=[],
                                                                   pool=1)}, "teacher_cache.datasets.toy_aug")
        build_teacher_cache("toy_aug", aug, toy["root"] / "clf", cfg, "cpu", 16, SHARD, root / "aug.zarr",
                            cpu_threads=1)
    return aug, root / "aug.zarr"


def test_augmented_rows_are_mixed_in_with_teacher_losses_only(toy, tmp_path):
    from distillpipe.config.train_aug import TrainAugRunConfig

    aug_tokens, aug_store = _unlabeled_copy(toy, toy["root"])
    run = {k: v for k, v in _cls_run(optim=_optim(epochs=1)).items() if k not in ("teacher", "mlm_views")}
    rcfg = build(TrainAugRunConfig, {**run, "augment": "toy_aug"}, "runs.aug")
    s = train_student("aug", model_cfg=rcfg.model, run=rcfg, loader_cfg=build(LoaderConfig, LOADER, "loader"),
                      device="cpu", tokens_dir=toy["cls"], store_path=toy["cls_store"], prepared_dir=None,
                      out_dir=tmp_path / "aug", ckpt_dir=tmp_path / "ck", live_dir=tmp_path / "p",
                      augment=("toy_aug", aug_tokens, aug_store))
    assert s.steps == 96 // 8 + 96 // 8  # one epoch of each source, interleaved
    hard, soft = read_curve(tmp_path / "p", "train/hard"), read_curve(tmp_path / "p", "train/soft")
    assert list(soft) == list(range(1, 25)) and len(hard) == 12, "augmented batches have no ground-truth term"
    unlabeled = [step for step in soft if step not in hard]
    assert unlabeled not in (list(range(1, 13)), list(range(13, 25))), "the sources are interleaved, not concatenated"


def test_mixture_resumes_mid_epoch_with_the_same_batches(toy):
    from distillpipe.train.data import Mixture, Source

    aug_tokens, aug_store = _unlabeled_copy(toy, toy["root"])

    def mixture():
        kw = {"batch_size": 8, "seed": 3, "block_rows": 32, "buffer_blocks": 2, "streams": 1}
        return Mixture([Source("toy", toy["cls"], toy["cls_store"], ["logits"], **kw),
                        Source("toy_aug", aug_tokens, aug_store, ["logits"], **kw)], seed=3)

    def key(item):
        src, rows, _ = item
        return src.info.name, tuple(map(tuple, rows["input_ids"]))

    full = [key(b) for b in mixture()]
    assert len(full) == 24 and {n for n, _ in full} == {"toy", "toy_aug"}
    first = mixture()
    it = iter(first)
    head = [key(next(it)) for _ in range(10)]
    state = first.state_dict()
    resumed = mixture()
    resumed.load_state_dict(state)
    assert head + [key(b) for b in resumed] == full


def test_teacher_targets_crop_attention_probabilities_on_positions_not_heads():
    """attn_probs are (B, H, L, L): a batch of T tokens keeps every head and the first T x T positions."""
    rows = {"input_ids": [[2, 9, 9, 3], [2, 9, 3]], "token_type_ids": [[0] * 4, [0] * 3], "label": [0, 1]}
    probs = np.random.default_rng(0).random((2, 3, 8, 8)).astype(np.float16)
    batch, _ = collate(rows, kind="classification", pad_id=0, labeled=True, pairs=False)
    got = teacher_targets({"attn_probs/L2": probs}, batch["attention_mask"], pool=1)["attn_probs/L2"]
    assert got.shape == (2, 3, 4, 4)
    assert torch.equal(got, torch.from_numpy(probs[:, :, :4, :4]).float())


def test_teacher_targets_crop_pooled_arrays_to_the_groups_of_the_batch_and_check_lengths():
    """A batch of T = 5 tokens pooled by p = 2 has ceil(5/2) = 3 groups: hidden (N, L/p, d) keeps 3 positions and
    attention scores (N, H, L/p, L/p) 3 x 3, the per-token QA logits keep 5; the cache's lengths must be the rows'."""
    rows = {"input_ids": [[2, 9, 9, 9, 3], [2, 9, 3]], "token_type_ids": [[0] * 5, [0] * 3],
            "start_positions": [1, 0], "end_positions": [2, 0]}
    rng = np.random.default_rng(0)
    arrays = {"hidden/L1": rng.random((2, 4, 6)).astype(np.float16),
              "attn_scores/L1": rng.random((2, 2, 4, 4)).astype(np.float16),
              "start_logits": rng.random((2, 8)).astype(np.float16), "length": np.array([5, 3], dtype=np.int32)}
    batch, _ = collate(rows, kind="qa", pad_id=0, labeled=True, pairs=False)
    got = teacher_targets(arrays, batch["attention_mask"], pool=2)
    assert set(got) == {"hidden/L1", "attn_scores/L1", "start_logits"}
    assert torch.equal(got["hidden/L1"], torch.from_numpy(arrays["hidden/L1"][:, :3]).float())
    assert torch.equal(got["attn_scores/L1"], torch.from_numpy(arrays["attn_scores/L1"][:, :, :3, :3]).float())
    assert torch.equal(got["start_logits"], torch.from_numpy(arrays["start_logits"][:, :5]).float())
    with pytest.raises(TrainDataError, match="lengths differ.*re-run teacher_cache"):
        teacher_targets({**arrays, "length": np.array([5, 4], dtype=np.int32)}, batch["attention_mask"], pool=2)


def test_early_stopping_survives_a_kill_after_its_checkpoint(toy, tmp_path):
    """Killed right after the checkpoint of the evaluation that stopped the run, the resumed run must stop too
    (it kept training: stopped_early was not in the checkpoint)."""
    run = _cls_run(optim=_optim(epochs=12, eval_every=4, patience=1, checkpoint_minutes=0))
    params = write_params(tmp_path / "params.yaml", {"train": {"device": "cpu", "loader": LOADER,
                                                               "runs": {"toy-run": run}}})
    ref = _cli_here(toy, params, tmp_path / "ref")
    assert ref.returncode == 0 and "stopped early" in ref.stdout, ref.stderr
    stop = json.loads((tmp_path / "ref.live" / "metrics.json").read_text())["step"]
    assert stop < 12 * 12  # it did stop early
    killed = _cli(toy, params, tmp_path / "res", kill_at=stop)
    assert killed.returncode == -9, killed.stderr
    resumed = _cli_here(toy, params, tmp_path / "res")
    assert resumed.returncode == 0 and f"resuming toy-run at step {stop}/" in resumed.stderr, resumed.stderr
    assert json.loads((tmp_path / "res.live" / "metrics.json").read_text())["step"] == stop
    assert live_files(tmp_path / "res.live") == live_files(tmp_path / "ref.live")
    a = torch.load(tmp_path / "ref" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "res" / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoints_by_the_clock_and_at_improving_evaluations_none_at_the_end(toy, tmp_path, monkeypatch):
    """A fake clock that moves one minute a step and a 3.5-minute interval: a checkpoint at step 4, at the
    evaluation of step 6 (the first: it improves; lr so small that no later one does), then 4 minutes after each
    (10, 14, 18, 22); none at the last step (24): the student is written right after."""
    from distillpipe import checkpoints
    from distillpipe.train import loop

    now = [0.0]
    written = []
    original_step, original_save = loop.train_step, checkpoints.save_checkpoint

    def step(*args):
        now[0] += 60.0
        return original_step(*args)

    def save(folder, step, state, keep=2):
        written.append(step)
        return original_save(folder, step, state, keep)

    monkeypatch.setattr(loop, "train_step", step)
    monkeypatch.setattr(loop, "Checkpointer", lambda *a, **k: checkpoints.Checkpointer(*a, **k, clock=lambda: now[0]))
    monkeypatch.setattr(checkpoints, "save_checkpoint", save)
    run = _cls_run(optim=_optim(epochs=2, lr=1e-12, eval_every=6, checkpoint_minutes=3.5))
    s = _train(toy, tmp_path, run)
    assert s.steps == 24 and s.best_step == 6
    assert written == [4, 6, 10, 14, 18, 22]
    assert not list((tmp_path / "run.ckpt").glob("*.pt"))  # cleared once the student is saved
