"""WaLDORf through the same loop: QA tokens from the real tokenize stage, a cache with start/end logits,
4x-pooled hidden states and max-pooled attention scores, the slow-build schedule, SQuAD v2 dev metrics."""

import pytest
import torch
from _tiny import (
    TINY_WALDORF,
    live_files,
    make_qa_tokens,
    make_tiny_bert_dir,
    read_curve,
    run_train_cli,
    signals,
    write_params,
)

from distillpipe.config.base import build
from distillpipe.config.run import LoaderConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.students import load_student
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.train.loop import train_student


@pytest.fixture(scope="module")
def qa(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa")
    teacher = make_tiny_bert_dir(root / "teacher", qa=True, layers=2, heads=4)
    prepared, tokens = make_qa_tokens(root, teacher)
    cfg = build(TeacherCacheDatasetConfig, {"teacher": "t", "head": "qa", "split": "train", "max_rows": None,
                                            "signals": signals(logits=True, hidden_layers=[1, 2], attn_layers=[1, 2],
                                                               pool=4)}, "teacher_cache.datasets.toy_qa")
    build_teacher_cache("toy_qa", tokens, teacher, cfg, "cpu", 16, 32, root / "qa.zarr", cpu_threads=1)
    return {"prepared": prepared, "tokens": tokens, "store": root / "qa.zarr"}


def _run(schedule, weights):
    return build(TrainRunConfig, {
        "dataset": "toy_qa", "model": TINY_WALDORF, "encoding": "joint", "head": None,
        "teacher": "data/teacher/toy_qa.zarr", "mlm_views": "static",
        "objective": {"loss_weights": weights, "hidden_loss": "mse", "layer_map": [1, 2], "schedule": schedule},
        "optim": {"epochs": 4, "max_steps": 30, "batch_size": 4, "lr": 1e-3, "weight_decay": 0.0,
                  "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
        "note": "test"}, "train.runs.w")


def test_slow_build_switches_terms_on_in_order(qa, tmp_path):
    slow = {"kind": "slow_build", "phase_steps": 8, "build_fraction": None, "warmup_fraction": 0.0,
            "temperature": 3.0}
    run = _run(slow, {"hard": 1.0, "soft": 1.0, "hidden": 1.2, "attn": 1.4})
    s = train_student("w", model_cfg=run.model, run=run, loader_cfg=LoaderConfig(32, 2, 1), device="cpu",
                      tokens_dir=qa["tokens"], store_path=qa["store"], prepared_dir=qa["prepared"],
                      out_dir=tmp_path / "w", ckpt_dir=tmp_path / "ck", live_dir=tmp_path / "p")
    assert s.steps == 30 and s.metric == "f1"
    assert {"exact", "f1", "HasAns_exact", "NoAns_exact"} <= set(s.dev)
    # the dvclive curves, one per loss term: a term's curve has the steps it was on (steps count from 1)
    terms = {name: read_curve(tmp_path / "p", f"train/{name}") for name in ("hidden/0", "attn/0", "hidden/1", "attn/1",
                                                                             "soft", "hard")}
    on = [{name for name, curve in terms.items() if step in curve} for step in range(1, 31)]
    # no embedding loss -> block 0 from step 0, block 1 from step 8, the output losses from step 16 (eq. 9)
    assert on[0] == {"hidden/0", "attn/0"} and on[7] == {"hidden/0", "attn/0"}
    assert on[8] == {"hidden/0", "attn/0", "hidden/1", "attn/1"}
    assert on[16] >= {"soft", "hidden/1"} and all("soft" not in t for t in on[:16])
    lrs = list(read_curve(tmp_path / "p", "train/lr").values())
    assert lrs[0] == lrs[15] == 1e-3 and lrs[16] > lrs[20] > lrs[29] > 0  # constant, then linear decay
    temps = list(read_curve(tmp_path / "p", "train/temperature").values())
    assert temps[0] == temps[15] == 3.0 and temps[16] > temps[29] >= 1.0  # T0 while building, then towards 1
    hidden0 = list(terms["hidden/0"].values())
    assert hidden0[15] < hidden0[0], "block 0 learns its hidden-state target during the build-up"
    model, record = load_student(tmp_path / "w", torch.device("cpu"))
    assert record["kind"] == "qa" and type(model).__name__ == "WaLDORf"


def test_student_heads_must_match_teacher_heads_for_the_attention_loss(qa, tmp_path):
    run = _run({"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0, "temperature_decay": False},
               {"hard": 1.0, "attn": 1.0})
    run = build(TrainRunConfig, {**_asdict(run), "model": {**TINY_WALDORF, "n_heads": 2}}, "train.runs.w")
    with pytest.raises(Exception, match=r"as many student heads as teacher heads \(4\)"):
        train_student("w", model_cfg=run.model, run=run, loader_cfg=LoaderConfig(32, 2, 1), device="cpu",
                      tokens_dir=qa["tokens"], store_path=qa["store"], prepared_dir=qa["prepared"],
                      out_dir=tmp_path / "w", ckpt_dir=tmp_path / "ck", live_dir=tmp_path / "p")


def _asdict(run):
    import dataclasses

    return dataclasses.asdict(run)


@pytest.mark.slow  # ~40 s; tests/train/test_loop.py kills and resumes a run in the default suite
def test_sigkill_mid_slow_build_then_resume_gives_the_same_weights(qa, tmp_path):
    slow = {"kind": "slow_build", "phase_steps": 6, "build_fraction": None, "warmup_fraction": 0.0,
            "temperature": 3.0}
    run = _asdict(_run(slow, {"hard": 1.0, "soft": 1.0, "hidden": 1.2, "attn": 1.4}))
    run["model"]["dropout"] = 0.1  # the resumed run must continue the dropout RNG stream too
    run["optim"].update(max_steps=24, checkpoint_minutes=0)
    run["dataset"] = "toy_qa"
    params = write_params(tmp_path / "params.yaml", {"train": {
        "device": "cpu", "loader": {"block_rows": 32, "buffer_blocks": 2, "streams": 1}, "runs": {"w": run}}})

    def cli(out, kill_at=None):
        return run_train_cli("w", tokens=qa["tokens"], store=qa["store"], prepared=qa["prepared"], out=out,
                             params=params, kill_at=kill_at)

    ref = cli(tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr
    killed = cli(tmp_path / "res", kill_at=10)  # block 1's stage (steps 6-11): mid-schedule
    assert killed.returncode == -9, killed.stderr
    resumed = cli(tmp_path / "res")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming w at step 10/24" in resumed.stderr
    a = torch.load(tmp_path / "ref" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "res" / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert live_files(tmp_path / "ref.live") == live_files(tmp_path / "res.live")  # curves and summary too
