"""A teacher cache altered on the team's remote is refused after a teammate's pull, over every kind of remote a team
uses (a shared directory, SSH/SFTP, S3; `tests/_remotes.py`): one shard of the logits rewritten with the teacher's
verdicts flipped, every crc32c and the shard's completion marker recomputed to match (`tests/_forge.py`), so that the
store's own checks all pass. `distillpipe inspect --verify` ends with one `error:` line naming the array, the shard,
the remote and the fix; an untouched pull passes and says it is anchored; with DVC's `verify = true` the pull itself
refuses the objects, and our message says what DVC's 'Is your cache up to date?' means. Training on such a store is
refused too (tests/train/test_trust.py)."""

import shutil

import pytest
from _dvc import DVC, out, sh
from _forge import forged_shard
from _remotes import KINDS, STORE, connect, remote_key, small_store, store_repo, team_remote
from _tiny import invoke_cli

from distillpipe.store.reader import open_store

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")


def _clone(a, dst, remote, *, verify=None, pull=True):
    sh(dst.parent, "git", "clone", "-q", str(a), str(dst))
    connect(dst, remote, verify=verify)
    return sh(dst, DVC, "pull", "teacher_cache", check=False) if pull else None


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory):
    return small_store(tmp_path_factory.mktemp("store") / "toy.zarr")


# ~13 s each; SFTP in make test-all (tests/test_dvc_remote.py refuses such a store over SFTP on the real pipeline too)
@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k == "sftp" else k for k in KINDS])
def test_a_store_altered_on_the_remote_is_refused_and_an_untouched_one_passes(tmp_path, toy_store, kind):
    a = store_repo(tmp_path / "A", toy_store)
    with team_remote(kind, tmp_path) as remote:
        connect(a, remote)
        sh(a, "git", "add", ".dvc/config")
        sh(a, "git", "commit", "-qm", "team remote")
        sh(a, DVC, "push")

        # untouched: a teammate's pull is anchored
        assert _clone(a, tmp_path / "B", remote).returncode == 0
        res = invoke_cli(["inspect", tmp_path / "B" / STORE, "--verify"])  # in this process: no ~4 s of imports
        assert res.returncode == 0, out(res)
        assert "anchored: every file is the one the committed dvc.lock names (teacher_cache at" in res.stdout

        # someone who can write the remote rewrites logits shard 1 and its marker, every crc32c consistent
        forged = forged_shard(a / STORE, 1)
        for rel, data in forged.items():
            remote.write(remote_key(a, rel), data)
        c = tmp_path / "C"
        assert _clone(a, c, remote).returncode == 0  # DVC's default: no verification, the pull succeeds
        assert {rel: (c / STORE / rel).read_bytes() for rel in forged} == forged  # ...with the altered bytes
        open_store(c / STORE, verify=True)  # which pass every check of the store's own: only git can tell
        res = invoke_cli(["inspect", c / STORE, "--verify"])
        assert res.returncode == 2, out(res)
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
        line = errors[0]
        assert f"teacher cache {STORE}: logits shard 1 (logits/c/1/0; and 1 more: the completion marker of shard 1)" \
               " is not the file the committed dvc.lock names" in line
        assert f"it came from remote 'shared' ({remote.url})" in line and f"dvc pull --force {STORE}" in line
        assert "dvc repro -f teacher_cache" in line

        # with `verify = true` DVC refuses the altered objects at the pull; we say what its message means
        d = tmp_path / "D"
        res = _clone(a, d, remote, verify=True)
        assert res.returncode != 0 and "Is your cache up to date?" in out(res)
        res = invoke_cli(["inspect", d / STORE, "--verify"])
        assert res.returncode == 2 and res.stderr.count("error:") == 1, out(res)
        assert "this clone's DVC cache lacks logits shard 1 (logits/c/1/0" in res.stderr
        assert ("If `dvc pull` said 'Is your cache up to date?', DVC refused a copy from remote 'shared' "
                f"({remote.url})") in res.stderr
