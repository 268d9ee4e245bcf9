"""kill -9 anywhere in `dvc repro`: the whole process group (DVC and the stage it runs) SIGKILLed at seeded random
moments, across stages and inside DVC's own bookkeeping (hashing, committing to the cache, writing dvc.lock,
holding its locks); `dvc repro` run again after each kill. The end state must equal an uninterrupted run's byte
for byte (every output and dvc.lock) and `dvc status` must be clean. Each stage's own resume is tested where it
lives (tests/store, tests/train); this is the whole pipeline as a user's `dvc repro` meets a power cut."""

import os
import random
import shutil
import signal
import subprocess
import time

import pytest
from _dvc import DVC, env, out, sh, tiny_params, working_tree_repo, write_params
from _tiny import make_tiny_bert_dir

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")
TARGET = "evaluate@tiny"  # everything up to the student's scores; `speed` and `report` hold timings, not bytes
KILLS, SEED = 5, 0


def _outputs(repo) -> dict[str, bytes]:
    """Every pipeline output and dvc.lock (not the stores' lock files: store/lock.py leaves them by design)."""
    files = {str(p.relative_to(repo)): p.read_bytes() for d in ("data", "models", "metrics", "predictions", "live")
             if (repo / d).is_dir() for p in (repo / d).rglob("*")
             if p.is_file() and not p.name.endswith(".zarr.lock")}
    files["dvc.lock"] = (repo / "dvc.lock").read_bytes()
    return files


@pytest.mark.slow  # ~4 min on 2 quiet cores: one clean run and KILLS killed ones of the tiny pipeline
def test_sigkill_at_random_moments_then_repro_equals_an_uninterrupted_run(tmp_path):
    teacher = make_tiny_bert_dir(tmp_path / "tiny_teacher")
    clean, victim = tmp_path / "clean", tmp_path / "victim"
    for repo in (clean, victim):
        working_tree_repo(repo)
        write_params(repo, tiny_params(teacher))
    t = time.monotonic()
    sh(clean, DVC, "repro", TARGET, repo=clean)  # each repo's stages import its own src/
    duration = time.monotonic() - t
    reference = _outputs(clean)

    rng = random.Random(SEED)
    finished = 0
    for k in range(KILLS):
        proc = subprocess.Popen([DVC, "repro", TARGET], cwd=victim, env=env(victim), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            proc.wait(timeout=rng.uniform(0.02, 1.0) * duration / (KILLS - k))  # early kills most: stages are short
            finished += 1
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert finished < KILLS, "every run finished before its kill: the test killed nothing"
    res = sh(victim, DVC, "repro", TARGET, check=False, repo=victim)
    assert res.returncode == 0, f"dvc repro after {KILLS} kills failed:\n{out(res)}"
    assert "Traceback" not in out(res), out(res)
    got = _outputs(victim)
    assert sorted(got) == sorted(reference)
    assert [k for k in reference if got[k] != reference[k]] == []
    assert "up to date" in out(sh(victim, DVC, "status", TARGET, repo=victim))
