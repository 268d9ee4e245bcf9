"""The team workflow with a real DVC remote over SSH/SFTP (the protocol a team uses; a server of the test's own on
127.0.0.1, `tests/_sftp.py`): clone A runs the pipeline and pushes (a first push killed mid-transfer, then run
again); clone B pulls and finds every stage, teacher_cache included, up to date: the teacher never runs on B, and B
has A's bytes. A params change in B re-runs only its student's stages. Clone C trains one student after pulling
only what that student needs. Uses the real dvc.yaml and stage scripts on a tiny pipeline (polarity, tiny teacher)."""

import os
import re
import shutil
import signal
import subprocess
import time

import pytest
import yaml
from _dvc import BIN, DVC, env, out, sh, tiny_params, working_tree_repo, write_params
from _sftp import SFTPServer
from _tiny import make_tiny_bert_dir

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")


def _files(root):
    """{relative path: bytes} of the workspace's pipeline outputs (not the stores' lock files, which a build leaves
    beside its store: store/lock.py)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not p.name.endswith(".zarr.lock")
            and p.relative_to(root).parts[0] in ("data", "models", "metrics", "predictions", "reports", "live")}


def _ran(log: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", log))


def _add_remote(repo, server, remote):
    sh(repo, DVC, "remote", "add", "-f", "-d", "shared", server.url(remote))
    for k, v in server.remote_options().items():  # --local: the key is this machine's, not committed
        sh(repo, DVC, "remote", "modify", "--local", "shared", k, v)


def _killed_push(repo, server) -> int:
    """Start `dvc push` with the server slowed down, SIGKILL its process group once a few files have arrived:
    files in flight are cut off. Returns the count of files the server had received whole."""
    server.throttle_s, server.files_closed = 0.05, 0
    proc = subprocess.Popen([DVC, "push"], cwd=repo, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while server.files_closed < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    server.throttle_s = 0.0
    return server.files_closed


@pytest.mark.slow  # ~3 min: the tiny pipeline to the report, an SFTP server, three clones and ten DVC commands. Its
# parts, fast: byte-identical reruns (the SIGKILL/resume tests of teacher_cache, train and augment), the stage graph
# (tests/test_dvc_deps.py, tests/test_dvc_local_files.py); the remote itself only here (make test-all)
def test_two_clones_share_the_pipeline_through_an_ssh_remote(tmp_path):
    teacher = make_tiny_bert_dir(tmp_path / "tiny_teacher")
    a, b, c, remote = tmp_path / "A", tmp_path / "B", tmp_path / "C", tmp_path / "remote"
    working_tree_repo(a)
    write_params(a, tiny_params(teacher))
    # `report` and everything upstream of it (qg_finetune/augment feed only augmented runs: none here)
    res = out(sh(a, DVC, "repro", "report"))
    assert {"teacher_cache@polarity", "train@tiny", "evaluate@tiny"} <= _ran(res)
    assert "up to date" in out(sh(a, DVC, "repro", "report"))  # a second repro is a no-op
    # cache: false outputs, and the .gitignore files DVC writes beside cached ones (predictions/ is a dep of report)
    sh(a, "git", "add", "params.yaml", "dvc.lock", "metrics", "live", "reports", "predictions")
    sh(a, "git", "commit", "-qm", "pipeline run")

    with SFTPServer(tmp_path / "sftp") as server:
        _add_remote(a, server, remote)
        sh(a, "git", "add", ".dvc/config")
        sh(a, "git", "commit", "-qm", "team remote")
        pushed = _killed_push(a, server)
        rest = int(re.search(r"(\d+) files? pushed", out(sh(a, DVC, "push"))).group(1))
        assert pushed >= 3 and rest >= 1  # the second push sent what the killed one had not
        assert "Everything is up to date" in out(sh(a, DVC, "push"))

        sh(tmp_path, "git", "clone", "-q", str(a), str(b))
        _add_remote(b, server, remote)
        sh(b, DVC, "pull", "--with-deps", "report")  # what A ran (qg_finetune/augment were not)
        assert "up to date" in out(sh(b, DVC, "status", "--with-deps", "report"))
        res = out(sh(b, DVC, "repro", "report"))
        assert not _ran(res), res  # nothing ran on B: not the teacher, not the student, nothing
        mine, theirs = _files(a), _files(b)
        assert mine.keys() == theirs.keys() and any(k.startswith("data/teacher/polarity.zarr") for k in mine)
        assert [k for k in mine if mine[k] != theirs[k]] == []  # B has A's bytes, the killed push's files included
        sh(b, BIN / "distillpipe", "inspect", "data/teacher/polarity.zarr", "--verify")

        # A student's params change in B: only that student's stages run, the teacher's are reused.
        params = yaml.safe_load((b / "params.yaml").read_text())
        params["train"]["runs"]["tiny"]["optim"]["lr"] *= 2
        write_params(b, params)
        res = out(sh(b, DVC, "repro", "report"))
        assert {"train@tiny", "evaluate@tiny", "report"} <= _ran(res), res
        assert not {s for s in _ran(res) if s.split("@")[0] in ("prepare", "tokenize", "teacher_import",
                                                                 "teacher_finetune", "teacher_cache")}, res

        # C trains the same student with new params, pulling only what it needs (partial pull: docs/sharing.md).
        sh(tmp_path, "git", "clone", "-q", str(a), str(c))
        _add_remote(c, server, remote)
        write_params(c, params)
        res = out(sh(c, DVC, "repro", "--pull", "--allow-missing", "train@tiny"))
        assert _ran(res) == {"train@tiny"}, res
        got = _files(c)
        assert any(k.startswith("data/teacher/polarity.zarr") for k in got)  # what train@tiny reads, pulled
        not_read = [k for k in got if k.startswith(("predictions/", "models/teacher/"))
                    and k != "predictions/.gitignore"]
        assert not_read == [], not_read  # what it does not read: not pulled (predictions/.gitignore is git's)
        assert got["models/students/tiny/model.pt"] == _files(b)["models/students/tiny/model.pt"]
