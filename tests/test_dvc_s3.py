"""The team workflow over a real S3 API (moto's server on 127.0.0.1, `tests/_s3.py`; DVC's dvc-s3 plugin): clone A
runs a pipeline whose stage outputs a teacher cache and pushes, a first push SIGKILLed mid-transfer and run again;
clone B pulls every byte of A's outputs; clone C runs the stage that reads the store, with params of its own,
with `dvc repro --pull --allow-missing`, which pulls the store and nothing that stage does not read. An object altered
on the S3 remote is refused: tests/test_dvc_remote_trust.py. The same over SSH/SFTP with the real pipeline:
tests/test_dvc_remote.py."""

import re
import shutil

import pytest
from _dvc import DVC, out, sh
from _remotes import STORE, connect, killed_push, small_store, store_repo, team_remote

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")


def _outputs(repo):
    return {p.relative_to(repo).as_posix(): p.read_bytes() for top in ("data", "models", "reports")
            for p in (repo / top).rglob("*") if p.is_file() and not p.name.endswith(".zarr.lock")}


@pytest.mark.slow  # ~20 s (make test-all). make test keeps S3 in tests/test_dvc_remote_trust.py: a push, pulls and an
# altered object refused; the real pipeline over S3 (push killed, partial pull, altered cache): tests/test_dvc_remote.py
def test_push_killed_and_rerun_full_pull_and_partial_pull_over_s3(tmp_path):
    a = store_repo(tmp_path / "A", small_store(tmp_path / "toy.zarr"), stages=("teacher_cache", "other"))
    with team_remote("s3", tmp_path) as remote:
        connect(a, remote)
        sh(a, "git", "add", ".dvc/config")
        sh(a, "git", "commit", "-qm", "team remote")
        pushed = killed_push(a, remote)
        rest = int(re.search(r"(\d+) files? pushed", out(sh(a, DVC, "push"))).group(1))
        assert pushed >= 3 and rest >= 1  # the second push sent what the killed one had not
        assert "Everything is up to date" in out(sh(a, DVC, "push"))
        keys = remote.server.client().list_objects_v2(Bucket=remote.server.bucket)["Contents"]
        objects = {p.relative_to(a / ".dvc" / "cache").as_posix() for p in (a / ".dvc" / "cache" / "files").rglob("*")
                   if p.is_file()}
        assert {k["Key"].removeprefix("distillpipe/") for k in keys} == objects  # every object, each once

        b = tmp_path / "B"
        sh(tmp_path, "git", "clone", "-q", str(a), str(b))
        connect(b, remote)
        sh(b, DVC, "pull", "teacher_cache", "other")
        assert _outputs(b) == _outputs(a)  # every byte, the killed push's objects included
        assert "up to date" in out(sh(b, DVC, "status", "teacher_cache", "other"))

        # C runs the stage that reads the store (with params of its own): only what that stage reads is pulled
        c = tmp_path / "C"
        sh(tmp_path, "git", "clone", "-q", str(a), str(c))
        connect(c, remote)
        (c / "params.yaml").write_text("check:\n  note: second\n")
        res = out(sh(c, DVC, "repro", "--pull", "--allow-missing", "check"))
        assert re.findall(r"Running stage '([^']+)'", res) == ["check"], res
        got = _outputs(c)
        assert {k for k in got if k.startswith(STORE)} == {k for k in _outputs(a) if k.startswith(STORE)}
        assert "models/other.bin" not in got  # not read by `check`: not pulled
        assert got["reports/check.txt"].startswith((a / STORE / "zarr.json").read_bytes())  # it read the pulled store
