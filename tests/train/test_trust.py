"""What a training run trusts: it resumes only a checkpoint of the same identity (params, the content of its
tokens, teacher cache and init weights, its code), and it never trains on a damaged teacher cache: a
deleted, truncated or altered shard file stops it with exit 2 and a message naming the shard and the fix; nor on a
cache that is not what the committed dvc.lock names, however consistent its checksums (store/anchor.py)."""

import json
import shutil

import pytest
import torch
from _forge import forged_shard
from _remotes import STORE, listing_of, store_repo
from _tiny import invoke_train_cli, make_classification_store, run_train_cli, write_params

from distillpipe.config.base import build
from distillpipe.config.run import LoaderConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.store.reader import open_store
from distillpipe.store.shards import read_marker
from distillpipe.train.loop import train_student

LOADER = {"block_rows": 32, "buffer_blocks": 2, "streams": 1}
MODEL = {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 4, "d_vec": 16,
         "init_std": 0.01, "embedding_init": "random", "dropout": 0.1}
OBJECTIVE = {"loss_weights": {"hard": 0.5, "soft": 0.5}, "hidden_loss": "cosine", "layer_map": [-1],
             "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                          "temperature_decay": False}}


def _optim(**over):
    return {"epochs": 2, "max_steps": None, "batch_size": 8, "lr": 3e-3, "weight_decay": 0.0, "max_grad_norm": 1.0,
            "eval_every": 0, "patience": None, "checkpoint_minutes": 0, "seed": 0, **over}


def _run(**over):
    """A train run (``mlm_views`` is a train run's key); ``_finetune_run`` gives a finetune run."""
    return {"dataset": "toy", "encoding": "joint", "head": {"type": "mlp", "hidden_size": 16, "dropout": 0.0},
            "teacher": "data/teacher/toy.zarr", "mlm_views": "static",
            "objective": OBJECTIVE, "optim": _optim(), "note": "test", **over}


def _finetune_run(**over):
    return {k: v for k, v in _run(**over).items() if k != "mlm_views"}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_classification_store(tmp_path_factory.mktemp("trust"))


def _init_student(toy, folder, seed):
    """A 'general-distilled' student to fine-tune from: the seeded initialisation (epochs 0) of run `gen`."""
    run = build(TrainRunConfig, _run(model=MODEL, optim=_optim(epochs=0, seed=seed)), "train.runs.gen")
    shutil.rmtree(folder, ignore_errors=True)
    train_student("gen", model_cfg=run.model, run=run, loader_cfg=build(LoaderConfig, LOADER, "loader"),
                  device="cpu", tokens_dir=toy["tokens"], store_path=toy["store"], prepared_dir=None, out_dir=folder,
                  ckpt_dir=folder.with_suffix(".ckpt"), live_dir=folder.with_suffix(".plots"))
    return folder


def _weights(folder):
    return torch.load(folder / "model.pt", weights_only=True)


@pytest.mark.slow  # ~35 s; tests/test_identity.py and test_checkpoints.py check the identity and restart, fast
def test_changed_init_weights_start_over_instead_of_resuming(toy, tmp_path):
    """A finetune killed at step 12 whose init student then changes must not resume from the old-init
    checkpoint (it did: the resume identity held the init path, not its content)."""
    init = _init_student(toy, tmp_path / "gen", seed=0)
    ft = _finetune_run(init="gen", student="cmow_hybrid", tune="full")
    params = write_params(tmp_path / "params.yaml",
                          {"finetune": {"device": "cpu", "loader": LOADER, "runs": {"ft": ft}}})

    def finetune(out, kill_at=None):
        return run_train_cli("ft", tokens=toy["tokens"], store=toy["store"], prepared=toy["tokens"], out=out,
                             params=params, kill_at=kill_at, init=init)

    killed = finetune(tmp_path / "ft", kill_at=12)
    assert killed.returncode == -9, killed.stderr
    _init_student(toy, init, seed=1)  # same run name and shapes, other weights
    resumed = finetune(tmp_path / "ft")
    assert resumed.returncode == 0, resumed.stderr
    assert "was made with other init weights: starting over" in resumed.stderr
    assert "resuming ft at step" not in resumed.stderr
    assert finetune(tmp_path / "ref").returncode == 0  # uninterrupted, from the new init
    a, b = _weights(tmp_path / "ft"), _weights(tmp_path / "ref")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_same_identity_still_resumes(toy, tmp_path):
    run = _run(model=MODEL)
    params = write_params(tmp_path / "params.yaml", {"train": {"device": "cpu", "loader": LOADER,
                                                               "runs": {"r": run}}})

    assert run_train_cli("r", tokens=toy["tokens"], store=toy["store"], prepared=toy["tokens"], out=tmp_path / "r",
                         params=params, kill_at=8).returncode == -9
    resumed = invoke_train_cli("r", tokens=toy["tokens"], store=toy["store"], prepared=toy["tokens"],
                               out=tmp_path / "r", params=params)  # in this process: no ~5 s of imports
    assert resumed.returncode == 0 and "resuming r at step 8/24" in resumed.stderr, resumed.stderr
    assert f"teacher cache {toy['store']} is unanchored (not inside a DVC repository)" in resumed.stderr


def _shard_file(store, i=1):
    """A data file of shard ``i`` (the logits array's), as its completion marker records it."""
    return store / next(k for k, rec in read_marker(store, i)["files"].items() if k.startswith("logits") and rec)


def _flip(path, n=5):
    data = bytearray(path.read_bytes())
    for k in range(n):  # spread over the file: chunk payloads, their checksums, the shard index
        data[(k * 7919) % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flipped", pytest.param("truncated", marks=pytest.mark.slow),
                                    pytest.param("deleted", marks=pytest.mark.slow)])  # tests/store: all three, fast
def test_training_refuses_a_damaged_cache_with_exit_2(toy, tmp_path, damage):
    store = tmp_path / "cls.zarr"
    shutil.copytree(toy["store"], store)
    f = _shard_file(store)
    if damage == "flipped":  # same size: only a checksum can tell
        _flip(f)
    elif damage == "truncated":
        f.write_bytes(f.read_bytes()[:-9])
    else:
        f.unlink()
    params = write_params(tmp_path / "params.yaml", {"train": {"device": "cpu", "loader": LOADER,
                                                               "runs": {"r": _run(model=MODEL)}}})
    res = invoke_train_cli("r", tokens=toy["tokens"], store=store, prepared=toy["tokens"], out=tmp_path / "r",
                           params=params)  # the real command, in this process
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "zarr" not in res.stderr.lower().replace(".zarr", "")
    assert f"teacher cache {store} is damaged" in res.stderr and "shard 1:" in res.stderr
    assert f"dvc checkout --force {store}" in res.stderr and "dvc repro teacher_cache" in res.stderr
    assert not (tmp_path / "r" / "model.pt").exists()  # nothing was trained on it
    expected = {"flipped": "unreadable", "truncated": "truncated or rewritten", "deleted": "missing"}[damage]
    assert expected in res.stderr


def test_resuming_run_verifies_every_checksum(toy, tmp_path):
    """A flip in a shard the resumed part would read late (or never again) is found before it continues."""
    store = tmp_path / "cls.zarr"
    shutil.copytree(toy["store"], store)
    params = write_params(tmp_path / "params.yaml", {"train": {"device": "cpu", "loader": LOADER,
                                                               "runs": {"r": _run(model=MODEL)}}})

    assert run_train_cli("r", tokens=toy["tokens"], store=store, prepared=toy["tokens"], out=tmp_path / "r",
                         params=params, kill_at=8).returncode == -9
    marker = read_marker(store, 2)
    target = store / next(k for k, rec in marker["files"].items() if rec)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    res = invoke_train_cli("r", tokens=toy["tokens"], store=store, prepared=toy["tokens"], out=tmp_path / "r",
                           params=params)  # resumed in this process: no ~5 s of imports
    assert res.returncode == 2 and "shard 2:" in res.stderr and "fails its crc32c" in res.stderr, res.stderr
    assert json.loads((store / "zarr.json").read_text())  # the store itself is left as it was


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")
def test_training_refuses_a_cache_that_is_not_what_the_committed_dvc_lock_names(toy, tmp_path):
    """What a pull without verification leaves of a shard altered on the remote, crc32c values and marker made to
    match: the DVC cache and the workspace hold the forged bytes. The run stops before its first step, with one line
    (tests/test_dvc_remote_trust.py pulls such a store from real remotes)."""
    a = store_repo(tmp_path / "A", toy["store"])
    listing = listing_of(a)
    for rel, data in forged_shard(a / STORE, 1).items():
        for path in (a / ".dvc/cache/files/md5" / listing[rel][:2] / listing[rel][2:], a / STORE / rel):
            path.chmod(0o644)
            path.write_bytes(data)
    open_store(a / STORE, verify=True)  # every check of the store's own passes
    params = write_params(tmp_path / "params.yaml", {"train": {"device": "cpu", "loader": LOADER,
                                                               "runs": {"r": _run(model=MODEL)}}})
    res = invoke_train_cli("r", tokens=toy["tokens"], store=a / STORE, prepared=toy["tokens"], out=tmp_path / "r",
                           params=params)
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert errors[0].startswith(f"error: teacher cache {STORE}: logits shard 1 (logits/c/1/0; and 1 more: the "
                                "completion marker of shard 1) is not the file the committed dvc.lock names")
    assert "dvc repro -f teacher_cache" in errors[0]
    assert not (tmp_path / "r" / "model.pt").exists()
