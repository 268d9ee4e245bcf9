"""The dvclive folders (distillpipe.tracking): dvclive's layout, written from logs in one go, and nothing else
touched: no repository opened or initialised, nothing git-added, nothing posted to Studio whatever the token."""

import json
import subprocess

import pytest
from _tiny import live_files, read_curve

from distillpipe.tracking import evaluation_summary, teacher_summary, train_summary, write_live


def test_layout_order_and_values(tmp_path):
    live = write_live(tmp_path / "live", summary=train_summary("accuracy", {"accuracy": 0.75, "f1": 0.5}, 4),
                      params={"optim": {"lr": 1e-3, "layer_map": (3, 6)}, "head": None},
                      curves=[(1, {"train/loss": 2.0, "train/lr": 1e-3}), (2, {"train/loss": float("nan")}),
                              (2, {"dev/accuracy": 0.5, "dev/f1": 0.25}), (4, {"train/loss": 1.5})], step=4)
    assert sorted(live_files(live)) == ["metrics.json", "params.yaml", "plots/metrics/dev/accuracy.tsv",
                                        "plots/metrics/dev/f1.tsv", "plots/metrics/train/loss.tsv",
                                        "plots/metrics/train/lr.tsv"]
    text = (live / "metrics.json").read_text()
    assert list(json.loads(text).items()) == [("dev", 0.75), ("metric", "accuracy"), ("best_step", 4), ("step", 4)]
    assert (live / "plots/metrics/train/loss.tsv").read_text().splitlines() == ["step\tloss", "1\t2.0", "2\tnan",
                                                                                  "4\t1.5"]
    assert read_curve(live, "dev/f1") == {2: 0.25}
    assert (live / "params.yaml").read_text() == "optim:\n  lr: 0.001\n  layer_map:\n  - 3\n  - 6\nhead:\n"
    # written again from scratch (a re-run): the same bytes, no curve appended to the old one
    before = live_files(live)
    write_live(live, summary=train_summary("accuracy", {"accuracy": 0.75, "f1": 0.5}, 4),
               params={"optim": {"lr": 1e-3, "layer_map": (3, 6)}, "head": None},
               curves=[(1, {"train/loss": 2.0, "train/lr": 1e-3}), (2, {"train/loss": float("nan")}),
                       (2, {"dev/accuracy": 0.5, "dev/f1": 0.25}), (4, {"train/loss": 1.5})], step=4)
    assert live_files(live) == before
    with pytest.raises(ValueError, match="step order"):
        write_live(tmp_path / "bad", summary={}, curves=[(2, {"a": 1.0}), (1, {"a": 1.0})])


def test_schemas():
    assert teacher_summary("f1", {"f1": 80.0, "exact": 70.0}, {"f1": 78.0}) == {"dev": 80.0, "test": 78.0,
                                                                               "metric": "f1"}
    assert list(teacher_summary("accuracy", {"accuracy": 0.8}, None)) == ["dev", "metric"]
    assert train_summary("f1", None, 0) == {"metric": "f1", "best_step": 0}
    s = evaluation_summary("accuracy", {"dev": {"accuracy": 0.6}, "test": None},
                           {"dev": {"accuracy": 0.9}, "test": {"accuracy": 0.8}}, 1234)
    assert list(s.items()) == [("dev", 0.6), ("teacher_test", 0.8), ("teacher_dev", 0.9), ("metric", "accuracy"),
                               ("params", 1234)]


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def test_no_side_effects_in_a_repository_and_nothing_posted(tmp_path, monkeypatch):
    """In a git repository without DVC (dvclive's Live would `dvc init` it) and then under what `dvc exp run` sets
    (DVC_ROOT, DVC_EXP_BASELINE_REV: dvclive would git-add its folder), with a Studio token in the environment:
    only the folder is written, and no request leaves."""
    import dvclive.studio

    sent = []
    monkeypatch.setattr(dvclive.studio, "post_live_metrics", lambda *a, **k: sent.append((a, k)))
    monkeypatch.setenv("DVC_STUDIO_TOKEN", "secret")
    monkeypatch.setenv("DVC_STUDIO_REPO_URL", "https://example.com/repo.git")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "x.txt").write_text("x")
    _git(repo, "add", "x.txt")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "x")
    monkeypatch.chdir(repo)
    write_live("live/a", summary={"dev": 1.0}, curves=[(1, {"train/loss": 1.0})], step=1)
    assert not (repo / ".dvc").exists()
    monkeypatch.setenv("DVC_ROOT", str(repo))
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", _git(repo, "rev-parse", "HEAD").strip())
    write_live("live/b", summary={"dev": 1.0}, params={"lr": 0.1}, curves=[(1, {"train/loss": 1.0})], step=1)
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if ".git" not in p.parts) == [
        "live", "live/a", "live/a/metrics.json", "live/a/plots", "live/a/plots/metrics", "live/a/plots/metrics/train",
        "live/a/plots/metrics/train/loss.tsv", "live/b", "live/b/metrics.json", "live/b/params.yaml", "live/b/plots",
        "live/b/plots/metrics", "live/b/plots/metrics/train", "live/b/plots/metrics/train/loss.tsv", "x.txt"]
    assert _git(repo, "status", "--porcelain") == "?? live/\n"  # nothing staged
    assert sent == []
