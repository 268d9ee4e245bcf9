"""Where and how wide the work runs is a machine setting: switching it leaves `dvc status` clean, and a store
rebuilt on a 2-worker dask cluster is the very output DVC recorded for the in-process build."""

import shutil

import pytest
from _dvc import DVC, out, sh, tiny_params, working_tree_repo, write_params
from _tiny import make_tiny_bert_dir

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")


@pytest.mark.slow  # ~60 s: several real `dvc repro`s; tests/test_dvc_deps.py checks the params deps, fast
def test_cluster_settings_change_no_output(tmp_path, monkeypatch):
    teacher = make_tiny_bert_dir(tmp_path / "teacher")
    repo = working_tree_repo(tmp_path / "repo")
    params = tiny_params(teacher)
    params["teacher_cache"]["shard_rows"] = 32  # 140 rows: 5 shards for the workers to share
    write_params(repo, params)
    sh(repo, DVC, "repro", "teacher_cache@polarity")
    lock = (repo / "dvc.lock").read_text()

    (repo / "machine.yaml").write_text("cluster: {kind: local, n_workers: 2, threads_per_worker: 1}\n"
                                       "students: {nproc_per_node: 2}\n")
    monkeypatch.setenv("DISTILLPIPE_WORKERS", "2")
    assert "up to date" in out(sh(repo, DVC, "status", "--with-deps", "teacher_cache@polarity"))
    shutil.rmtree(repo / "data" / "teacher" / "polarity.zarr")  # rebuild it on the cluster
    res = out(sh(repo, DVC, "repro", "teacher_cache@polarity"))
    assert "dask cluster local: 2 workers" in res, res
    # same bytes: DVC's recorded hash matches
    assert "up to date" in out(sh(repo, DVC, "status", "--with-deps", "teacher_cache@polarity"))
    assert (repo / "dvc.lock").read_text() == lock
