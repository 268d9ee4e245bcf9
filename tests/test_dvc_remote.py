"""The team workflow with a real DVC remote over SSH/SFTP and S3 (the protocols teams use; a server of the test's own on
127.0.0.1, `tests/_sftp.py`, `tests/_s3.py`): clone A runs the pipeline and pushes (a first push killed mid-transfer,
then run again); clone B pulls and finds every stage, teacher_cache included, up to date: the teacher never runs on B,
and B has A's bytes. A params change in B re-runs only its student's stages. Clone C trains one student after pulling
only what that student needs. Then someone who can write the remote alters the teacher cache (a logits shard and its
marker, every crc32c consistent): clone D's `dvc repro --pull` of the same student refuses it before its first step,
with one line. Uses the real dvc.yaml and stage scripts on a tiny pipeline (polarity, tiny teacher)."""

import re
import shutil

import pytest
import yaml
from _dvc import BIN, DVC, out, sh, tiny_params, working_tree_repo, write_params
from _forge import forged_shard
from _remotes import connect, killed_push, remote_key, team_remote
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


@pytest.mark.slow  # ~3 min each: the tiny pipeline to the report, a server, four clones and a dozen DVC commands. Its
# parts, fast: byte-identical reruns (the SIGKILL/resume tests of teacher_cache, train and augment), the stage graph
# (tests/test_dvc_deps.py, tests/test_dvc_local_files.py), the remotes on a small stage (tests/test_dvc_s3.py,
# tests/test_dvc_remote_trust.py); the real pipeline over a remote only here (make test-all)
@pytest.mark.parametrize("kind", ["sftp", "s3"])
def test_clones_share_the_pipeline_through_a_remote(tmp_path, kind):
    teacher = make_tiny_bert_dir(tmp_path / "tiny_teacher")
    a, b, c, d = tmp_path / "A", tmp_path / "B", tmp_path / "C", tmp_path / "D"
    working_tree_repo(a)
    write_params(a, tiny_params(teacher))
    # `report` and everything upstream of it (qg_finetune/augment feed only augmented runs: none here)
    res = out(sh(a, DVC, "repro", "report"))
    assert {"teacher_cache@polarity", "train@tiny", "evaluate@tiny"} <= _ran(res)
    assert "up to date" in out(sh(a, DVC, "repro", "report"))  # a second repro is a no-op
    # cache: false outputs, and the .gitignore files DVC writes beside cached ones (predictions/ is a dep of report)
    sh(a, "git", "add", "params.yaml", "dvc.lock", "metrics", "live", "reports", "predictions")
    sh(a, "git", "commit", "-qm", "pipeline run")

    with team_remote(kind, tmp_path) as remote:
        connect(a, remote)
        sh(a, "git", "add", ".dvc/config")
        sh(a, "git", "commit", "-qm", "team remote")
        pushed = killed_push(a, remote)
        rest = int(re.search(r"(\d+) files? pushed", out(sh(a, DVC, "push"))).group(1))
        assert pushed >= 3 and rest >= 1  # the second push sent what the killed one had not
        assert "Everything is up to date" in out(sh(a, DVC, "push"))

        sh(tmp_path, "git", "clone", "-q", str(a), str(b))
        connect(b, remote)
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
        connect(c, remote)
        write_params(c, params)
        res = out(sh(c, DVC, "repro", "--pull", "--allow-missing", "train@tiny"))
        assert _ran(res) == {"train@tiny"}, res
        got = _files(c)
        assert any(k.startswith("data/teacher/polarity.zarr") for k in got)  # what train@tiny reads, pulled
        not_read = [k for k in got if k.startswith(("predictions/", "models/teacher/"))
                    and k != "predictions/.gitignore"]
        assert not_read == [], not_read  # what it does not read: not pulled (predictions/.gitignore is git's)
        assert got["models/students/tiny/model.pt"] == _files(b)["models/students/tiny/model.pt"]

        # Someone who can write the remote flips the teacher's verdicts in shard 0 of the store, crc32c values and
        # marker made to match; D (DVC's default: no verification) pulls what the student needs: its stage refuses
        store = "data/teacher/polarity.zarr"
        for rel, data in forged_shard(a / store, 0).items():
            remote.write(remote_key(a, rel, store), data)
        sh(tmp_path, "git", "clone", "-q", str(a), str(d))
        connect(d, remote)
        write_params(d, params)
        res = sh(d, DVC, "repro", "--pull", "--allow-missing", "train@tiny", check=False)
        assert res.returncode != 0, out(res)
        errors = [line for line in out(res).splitlines() if line.startswith("error:")]
        assert len(errors) == 1, out(res)
        assert errors[0].startswith(f"error: teacher cache {store}: logits shard 0 (logits/c/0/0; and 1 more: the "
                                    "completion marker of shard 0) is not the file the committed dvc.lock names")
        assert f"it came from remote 'shared' ({remote.url})" in errors[0]
        assert not (d / "models" / "students" / "tiny" / "model.pt").exists()
