"""Students under torchrun (DDP, gloo on CPU, 2 processes), through the real command: the same global
batches give the weights of one process (float tolerance); a rank SIGKILLed mid-run fails the job cleanly
and the next run resumes every rank to the very weights of an uninterrupted 2-process run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from _tiny import invoke_cli, live_files, make_classification_store, read_curve, write_params

# Imported by every Python process that has its folder on PYTHONPATH: in torchrun's rank 1, SIGKILL the process
# at the first checkpoint after the one of step $KILL_AT_STEP is on disk (rank 0 writes it in the background; every
# rank gathers the RNG states at each checkpoint): a worker lost mid-training, while rank 0 may be writing the next
# checkpoint, and the job runs through the real `distillpipe train`.
KILL_HOOK = """
import os, signal
if os.environ.get("RANK") == "1" and os.environ.get("KILL_AT_STEP"):
    import torch.distributed as dist
    target = os.path.join(os.environ["CKPT_DIR"], "step-%09d.pt" % int(os.environ["KILL_AT_STEP"]))
    original = dist.all_gather_object
    def all_gather_object(*args, **kwargs):
        original(*args, **kwargs)
        if os.path.exists(target):
            os.kill(os.getpid(), signal.SIGKILL)
    dist.all_gather_object = all_gather_object
"""
LOADER = {"block_rows": 32, "buffer_blocks": 1, "streams": 2}
OBJECTIVE = {"loss_weights": {"hard": 0.5, "soft": 0.5}, "hidden_loss": "cosine", "layer_map": [-1],
             "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                          "temperature_decay": False}}


PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"


def test_the_embedded_params_fit_1_2_4_and_8_processes():
    """Every student run of the embedded params.yaml (loader streams: 1) can be read by 1, 2, 4 and 8 training
    processes: each process a slice of the one stream's batches (tests/store/test_store_loader.py checks that the
    slices give the one-process batches)."""
    from distillpipe.config.base import load_section
    from distillpipe.config.finetune import FinetuneConfig
    from distillpipe.config.train import TrainConfig
    from distillpipe.config.train_aug import TrainAugConfig
    from distillpipe.config.train_lm import TrainLMConfig
    from distillpipe.store.loader import check_processes

    runs = 0
    for section, cls in (("train", TrainConfig), ("train_aug", TrainAugConfig), ("train_lm", TrainLMConfig),
                         ("finetune", FinetuneConfig)):
        cfg = load_section(PARAMS, section, cls)
        for run in cfg.runs.values():
            for world in (1, 2, 4, 8):
                check_processes(cfg.loader.streams, world, run.optim.batch_size)
            runs += 1
    raw = yaml.safe_load(PARAMS.read_text())
    assert runs == sum(len(raw[s]["runs"]) for s in ("train", "train_aug", "train_lm", "finetune")) >= 10  # all read


def test_a_process_count_that_does_not_fit_is_one_message_naming_the_value_to_set(toy, tmp_path, monkeypatch):
    """Refused before torchrun starts (one message, not one per worker), naming the params key and the values."""
    from typer.testing import CliRunner

    from distillpipe.cli import app

    params = write_params(tmp_path / "params.yaml", {"train": {"device": "cpu", "loader": {**LOADER, "streams": 3},
                                                               "runs": {"r": {**_run(0.0)}}}})
    monkeypatch.setenv("DISTILLPIPE_MACHINE", str(toy["root"] / "machine.yaml"))
    monkeypatch.setenv("DISTILLPIPE_NPROC", "2")
    res = CliRunner().invoke(app, ["train", "--run", "r", "--tokens", str(toy["tokens"]), "--teacher",
                                   str(toy["store"]), "--prepared", str(toy["tokens"]), "--out", str(tmp_path / "o"),
                                   "--checkpoints", str(tmp_path / "c"), "--live", str(tmp_path / "l"), "--params",
                                   str(params)])
    assert res.exit_code == 2 and not (tmp_path / "c").exists(), res.output
    assert res.stderr.splitlines() == [
        f"error: {params}: train.loader.streams=3 does not fit 2 training processes: the streams must be a multiple "
        "of the process count (each process reads its own streams) or divide it (the processes of a stream share "
        "it). Set train.loader.streams to 1 or 2 in params.yaml (the batches follow the streams), or run a number of "
        "processes that 3 is a multiple or a divisor of (DISTILLPIPE_NPROC, or machine.yaml "
        "students.nproc_per_node, is 2)"]


def _run(dropout):
    return {"dataset": "toy", "encoding": "joint", "head": {"type": "mlp", "hidden_size": 16, "dropout": dropout},
            "teacher": "data/teacher/toy.zarr", "mlm_views": "static",
            "model": {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 4, "d_vec": 16,
                      "init_std": 0.01, "embedding_init": "random", "dropout": dropout},
            "objective": OBJECTIVE, "note": "ddp",
            "optim": {"epochs": 2, "max_steps": None, "batch_size": 8, "lr": 3e-3, "weight_decay": 0.0,
                      "max_grad_norm": 1.0, "eval_every": 6, "patience": None, "checkpoint_minutes": 0, "seed": 0}}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    toy = make_classification_store(tmp_path_factory.mktemp("ddp"))
    (toy["root"] / "machine.yaml").write_text("")
    return toy


def _train(toy, tmp_path, out, *, nproc, dropout, kill_at=None, loader=LOADER, here=False):
    """`distillpipe train` with DISTILLPIPE_NPROC=``nproc`` in a process of its own; ``here``: in this process (one
    training process, no torchrun: the reference, without ~5 s of imports)."""
    params = write_params(tmp_path / "params.yaml", {"train": {"device": "cpu", "loader": loader,
                                                               "runs": {"r": _run(dropout)}}})
    args = ["train", "--run", "r", "--tokens", str(toy["tokens"]), "--teacher", str(toy["store"]),
            "--prepared", str(toy["tokens"]), "--out", str(out), "--checkpoints", f"{out}.ckpt",
            "--live", f"{out}.live", "--params", str(params)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTILLPIPE_MACHINE": str(toy["root"] / "machine.yaml"),
           "DISTILLPIPE_NPROC": str(nproc)}
    if kill_at is not None:
        hook = tmp_path / "hook"
        hook.mkdir(exist_ok=True)
        (hook / "sitecustomize.py").write_text(KILL_HOOK)
        path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))  # the hook, then the caller's
        env.update(KILL_AT_STEP=str(kill_at), CKPT_DIR=f"{out}.ckpt", PYTHONPATH=path)
    if here:
        assert nproc == 1 and kill_at is None
        return invoke_cli(args, env={k: env[k] for k in ("DISTILLPIPE_MACHINE", "DISTILLPIPE_NPROC")})
    cmd = [sys.executable, "-m", "distillpipe.cli", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _weights(folder):
    return torch.load(folder / "model.pt", weights_only=True)


def test_two_processes_give_the_weights_of_one(toy, tmp_path):
    one = _train(toy, tmp_path, tmp_path / "one", nproc=1, dropout=0.0, here=True)
    assert one.returncode == 0, one.stderr
    two = _train(toy, tmp_path, tmp_path / "two", nproc=2, dropout=0.0)
    assert two.returncode == 0, two.stderr
    assert "under torchrun with 2 processes" in two.stderr
    # 96 rows in 3 windows, 2 streams: 64 and 32 rows, 4 rows each per batch: 8 batches an epoch
    assert one.stdout.count("student r: 16 steps") == two.stdout.count("student r: 16 steps") == 1  # rank 0 prints
    a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    loss_one = read_curve(tmp_path / "one.live", "train/loss")
    loss_two = read_curve(tmp_path / "two.live", "train/loss")
    assert list(loss_one) == list(loss_two) == list(range(1, 17))
    # the logged loss is the global batch's (averaged over ranks)
    assert list(loss_one.values()) == pytest.approx(list(loss_two.values()), rel=1e-4)


@pytest.mark.slow  # ~30 s: two torchrun jobs
def test_one_stream_shared_by_2_and_4_processes_gives_the_weights_of_one(toy, tmp_path):
    """The embedded params' loader (streams: 1) under DISTILLPIPE_NPROC=2 and 4: the processes share the stream,
    each training on its slice of every batch; 96 rows in batches of 8 leave no short batch, so the weights equal
    one process's (float tolerance)."""
    loader = {**LOADER, "streams": 1}
    one = _train(toy, tmp_path, tmp_path / "one", nproc=1, dropout=0.0, loader=loader, here=True)
    assert one.returncode == 0, one.stderr
    a = _weights(tmp_path / "one")
    for nproc in (2, 4):
        many = _train(toy, tmp_path, tmp_path / f"n{nproc}", nproc=nproc, dropout=0.0, loader=loader)
        assert many.returncode == 0, many.stderr[-3000:]
        assert f"under torchrun with {nproc} processes" in many.stderr and "each read all its blocks" in many.stderr
        assert one.stdout.count("student r: 24 steps") == many.stdout.count("student r: 24 steps") == 1
        b = _weights(tmp_path / f"n{nproc}")
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow  # ~50 s: torchrun twice; test_two_processes_give_the_weights_of_one stays in the default suite
def test_killed_rank_fails_cleanly_and_the_rerun_resumes_every_rank_exactly(toy, tmp_path):
    ref = _train(toy, tmp_path, tmp_path / "ref", nproc=2, dropout=0.1)  # dropout on: RNG states must resume
    assert ref.returncode == 0, ref.stderr
    killed = _train(toy, tmp_path, tmp_path / "run", nproc=2, dropout=0.1, kill_at=8)
    assert killed.returncode == 2, killed.stderr[-3000:]  # one message, the job stopped
    assert "error: training process rank 1 of 2 was killed by SIGKILL and torchrun stopped the others" in killed.stderr
    kept = sorted(int(p.name[5:14]) for p in (tmp_path / "run.ckpt").glob("step-*.pt"))
    assert kept and kept[-1] >= 8 and not (tmp_path / "run" / "model.pt").exists()
    resumed = _train(toy, tmp_path, tmp_path / "run", nproc=2, dropout=0.1)
    assert resumed.returncode == 0, resumed.stderr
    # step 8's, or a later one if rank 0 finished it before torchrun stopped it (never two writes in flight)
    assert f"resuming r at step {kept[-1]}/16" in resumed.stderr and kept[-1] <= 10
    a, b = _weights(tmp_path / "ref"), _weights(tmp_path / "run")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert live_files(tmp_path / "ref.live") == live_files(tmp_path / "run.live")  # rank 0 writes them from the logs


def test_ddp_searches_for_unused_parameters_only_where_a_step_can_leave_some_out():
    """find_unused_parameters costs a traversal of the autograd graph every step (and warns when it finds none):
    only for a student with a parameter its forward leaves out, or a schedule that turns terms off for a while. The
    probe leaves the RNG where it was and no gradient behind."""
    from torch import nn

    from distillpipe.students.base import StudentOutput
    from distillpipe.train.build import Trainable, has_unused_parameters

    class Student(nn.Module):
        def __init__(self, spare: bool):
            super().__init__()
            self.emb, self.out, self.drop = nn.Embedding(10, 4), nn.Linear(4, 2), nn.Dropout(0.5)
            self.spare = nn.Linear(4, 4) if spare else None  # never called by forward

        def forward(self, batch, return_hidden=False):
            return StudentOutput(logits=self.out(self.drop(self.emb(batch["input_ids"]).mean(1))))

    class Objective(nn.Module):
        needs_hidden = False

    batch = {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 6]])}
    used = Trainable(Student(spare=False), Objective())
    torch.manual_seed(0)
    ahead = torch.rand(3)
    torch.manual_seed(0)
    assert not has_unused_parameters(used, batch, "all_at_once")
    assert torch.equal(torch.rand(3), ahead)  # the probe's dropout draws were put back
    assert all(p.grad is None for p in used.parameters())
    assert has_unused_parameters(Trainable(Student(spare=True), Objective()), batch, "all_at_once")
    assert has_unused_parameters(used, batch, "slow_build")
