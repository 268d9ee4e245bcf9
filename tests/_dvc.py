"""Real DVC repositories in tmp_path for the pipeline tests: a copy of this working tree (so the tests see
the code under test, committed or not), git and dvc run as subprocesses, and a tiny params.yaml."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from _tiny import finetune_params

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DVC = str(BIN / "dvc")


def env(repo: Path | None = None) -> dict[str, str]:
    """Subprocess environment: this venv first, one thread, a git identity; with ``repo``, its ``src`` is
    imported instead of the installed package (so a test can edit the repo's code)."""
    out = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "DISTILLPIPE_LOG": "INFO"}
    out.pop("DVC_SITE_CACHE_DIR", None)
    if repo is not None:
        out["PYTHONPATH"] = str(repo / "src")
    return out


def sh(cwd: Path, *cmd, check: bool = True, repo: Path | None = None) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env(repo), capture_output=True, text=True)
    if check:
        assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{res.stdout}\n{res.stderr}"
    return res


def out(res: subprocess.CompletedProcess) -> str:
    return res.stdout + res.stderr


def working_tree_repo(dst: Path) -> Path:
    """A git repository at ``dst`` holding this working tree's tracked and untracked (not ignored) files,
    committed: the pipeline as it is now, not as of the last commit."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    sh(dst, "git", "init", "-q")
    sh(dst, "git", "add", "-A")
    sh(dst, "git", "commit", "-qm", "working tree")
    return dst


def tiny_params(teacher: Path) -> dict:
    """The real params.yaml cut down to one tiny task: polarity with a tiny teacher and a tiny student,
    evaluated, timed and reported; no QA, no augmentation."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"]["datasets"] = {"polarity": params["prepare"]["datasets"]["polarity"]}
    params["tokenize"].update(tokenizer=str(teacher), max_seq_len=32,
                              datasets={"polarity": {"kind": "classification", "max_seq_len": None}})
    params["teacher_import"]["models"] = {"base": str(teacher)}
    params["teacher_finetune"].update(device="cpu", tasks={"polarity": finetune_params(epochs=1)})
    pol = params["teacher_cache"]["datasets"]["polarity"]
    params["teacher_cache"].update(device="cpu", shard_rows=64, datasets={"polarity": pol})
    run = params["finetune"]["runs"]["hybrid-polarity"]
    run = {k: v for k, v in run.items() if k not in ("init", "student", "tune")} | {
        "model": {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 3, "d_vec": 8,
                  "init_std": 0.01, "embedding_init": "random", "dropout": 0.1},
        "optim": {**run["optim"], "epochs": 2, "batch_size": 32}, "mlm_views": "static"}
    loader = {"block_rows": 64, "buffer_blocks": 2, "streams": 1}
    params["train"].update(device="cpu", loader=loader, runs={"tiny": run})
    params["train_aug"].update(device="cpu", loader=loader, runs={})
    params["train_lm"].update(device="cpu", loader=loader, runs={})
    params["word_vectors"].update(tables={}, local={})
    params["finetune"].update(device="cpu", loader=loader, runs={})
    params["evaluate"].update(device="cpu", runs={"tiny": {"student": "cmow_hybrid", "dataset": "polarity",
                                                               "teacher": "polarity"}})
    params["speed"] = {"device": "cpu", "batch_size": 8, "seq_len": 16, "warmup": 0, "repeats": 1,
                       "batches_per_repeat": 1, "runs": {"tiny": {"student": "cmow_hybrid", "teacher": "polarity"}}}
    params["report"]["tables"] = []
    return params


def write_params(repo: Path, params: dict) -> None:
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
