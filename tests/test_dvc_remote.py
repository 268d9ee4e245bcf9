"""The team workflow with a real DVC remote (a local directory): clone A runs the pipeline and
pushes; clone B pulls and finds every stage, teacher_cache included, up to date: the teacher never
runs on B. Uses the real dvc.yaml and stage scripts on a tiny pipeline (polarity, tiny teacher)."""

import shutil

import pytest
from _dvc import BIN, DVC, out, sh, tiny_params, working_tree_repo, write_params
from _tiny import make_tiny_bert_dir


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")
def test_two_clones_share_the_teacher_cache_through_a_remote(tmp_path):
    teacher = make_tiny_bert_dir(tmp_path / "tiny_teacher")
    a, b, remote = tmp_path / "A", tmp_path / "B", tmp_path / "remote"
    working_tree_repo(a)
    write_params(a, tiny_params(teacher))
    # `report` and everything upstream of it (qg_finetune/augment feed only augmented runs: none here)
    res = out(sh(a, DVC, "repro", "report"))
    assert "Running stage 'teacher_cache@polarity'" in res and "Running stage 'evaluate@tiny'" in res
    assert "up to date" in out(sh(a, DVC, "repro", "report"))  # a second repro is a no-op
    sh(a, DVC, "remote", "add", "-d", "shared", str(remote))
    sh(a, DVC, "push")
    # cache: false outputs, and the .gitignore files DVC writes beside cached ones (predictions/ is a dep of report)
    sh(a, "git", "add", "params.yaml", "dvc.lock", ".dvc/config", "metrics", "live", "reports", "predictions")
    sh(a, "git", "commit", "-qm", "pipeline run")

    sh(tmp_path, "git", "clone", "-q", str(a), str(b))
    sh(b, DVC, "pull", "--with-deps", "report")  # what A ran (qg_finetune/augment were not)
    status = out(sh(b, DVC, "status", "--with-deps", "report"))
    assert "up to date" in status, status
    res = out(sh(b, DVC, "repro", "report"))
    assert "Running stage" not in res, res  # nothing ran on B: not the teacher, not the student, nothing
    assert (b / "models/students/tiny/model.pt").read_bytes() == (a / "models/students/tiny/model.pt").read_bytes()
    store_a = sorted(p.relative_to(a) for p in (a / "data/teacher/polarity.zarr").rglob("*") if p.is_file())
    store_b = sorted(p.relative_to(b) for p in (b / "data/teacher/polarity.zarr").rglob("*") if p.is_file())
    assert store_a == store_b and store_a
    assert all((a / p).read_bytes() == (b / p).read_bytes() for p in store_a)
    sh(b, BIN / "distillpipe", "inspect", "data/teacher/polarity.zarr", "--verify")
