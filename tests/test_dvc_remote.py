"""The team workflow with a real DVC remote (a local directory): clone A runs the pipeline and
pushes; clone B pulls and finds every stage, teacher_cache included, up to date: the teacher never
runs on B. Uses the real dvc.yaml and stage scripts on a tiny pipeline (polarity, tiny teacher)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _tiny import finetune_params, make_tiny_bert_dir

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _env():
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    env.pop("DVC_SITE_CACHE_DIR", None)
    return env


def sh(cwd, *cmd):
    res = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout + res.stderr


def tiny_params(teacher: Path) -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"]["datasets"] = {"polarity": params["prepare"]["datasets"]["polarity"]}
    params["tokenize"].update(tokenizer=str(teacher), max_seq_len=32, datasets={"polarity": {"kind": "classification"}})
    params["teacher_import"]["models"] = {"base": str(teacher)}
    params["teacher_finetune"].update(device="cpu", tasks={"polarity": finetune_params(epochs=1, checkpoint_every=100)})
    pol = params["teacher_cache"]["datasets"]["polarity"]
    params["teacher_cache"].update(device="cpu", shard_rows=64, datasets={"polarity": pol})
    # one tiny student on polarity, evaluated and reported; no QA, no augmentation
    run = params["finetune"]["runs"]["hybrid-polarity"]
    run = {k: v for k, v in run.items() if k != "init"} | {
        "model": {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 3, "d_vec": 8,
                  "init_std": 0.01, "dropout": 0.1},
        "optim": {**run["optim"], "epochs": 2, "batch_size": 32}}
    loader = {"block_rows": 64, "buffer_blocks": 2, "num_workers": 0}
    params["train"].update(device="cpu", loader=loader, runs={"tiny": run})
    params["train_aug"].update(device="cpu", loader=loader, runs={})
    params["finetune"].update(device="cpu", loader=loader, runs={})
    params["evaluate"].update(device="cpu", runs={"tiny": {"dataset": "polarity", "teacher": "polarity"}},
                              speed={"batch_size": 8, "seq_len": 16, "warmup": 0, "repeats": 1,
                                     "batches_per_repeat": 1})
    params["report"]["tables"] = []
    return params


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")
def test_two_clones_share_the_teacher_cache_through_a_remote(tmp_path):
    teacher = make_tiny_bert_dir(tmp_path / "tiny_teacher")
    a, b, remote = tmp_path / "A", tmp_path / "B", tmp_path / "remote"
    sh(tmp_path, "git", "clone", "-q", str(ROOT), str(a))
    (a / "params.yaml").write_text(yaml.safe_dump(tiny_params(teacher), sort_keys=False))
    dvc = str(BIN / "dvc")
    # `report` and everything upstream of it (qg_finetune/augment feed only augmented runs: none here)
    out = sh(a, dvc, "repro", "report")
    assert "Running stage 'teacher_cache@polarity'" in out and "Running stage 'evaluate@tiny'" in out
    assert "up to date" in sh(a, dvc, "repro", "report")  # a second repro is a no-op
    sh(a, dvc, "remote", "add", "-d", "shared", str(remote))
    sh(a, dvc, "push")
    sh(a, "git", "add", "params.yaml", "dvc.lock", ".dvc/config", "metrics", "plots", "reports")  # cache: false
    sh(a, "git", "commit", "-qm", "pipeline run")

    sh(tmp_path, "git", "clone", "-q", str(a), str(b))
    sh(b, dvc, "pull", "--with-deps", "report")  # what A ran (qg_finetune/augment were not)
    status = sh(b, dvc, "status", "--with-deps", "report")
    assert "up to date" in status, status
    out = sh(b, dvc, "repro", "report")
    assert "Running stage" not in out, out  # nothing ran on B: not the teacher, not the student, nothing
    assert (b / "models/students/tiny/model.pt").read_bytes() == (a / "models/students/tiny/model.pt").read_bytes()
    store_a = sorted(p.relative_to(a) for p in (a / "data/teacher/polarity.zarr").rglob("*") if p.is_file())
    store_b = sorted(p.relative_to(b) for p in (b / "data/teacher/polarity.zarr").rglob("*") if p.is_file())
    assert store_a == store_b and store_a
    assert all((a / p).read_bytes() == (b / p).read_bytes() for p in store_a)
    sh(b, str(BIN / "distillpipe"), "inspect", "data/teacher/polarity.zarr", "--verify")
