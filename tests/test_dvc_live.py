"""dvclive in the pipeline: every training, teacher and evaluation stage writes its dvclive folder where dvc.yaml
declares it (metrics, plots drawn against step, params), and a small sweep runs as DVC queued experiments."""

import json
import shutil
import time

import pytest
import yaml
from _dvc import DVC, ROOT, out, sh, tiny_params, working_tree_repo, write_params
from _tiny import make_tiny_bert_dir

LIVE = {"teacher_finetune": "teacher", "train": "train", "train_aug": "train", "train_lm": "train",
        "finetune": "train", "evaluate": "evaluate"}


def _paths(entries) -> dict:
    return {next(iter(e)) if isinstance(e, dict) else e: (next(iter(e.values())) if isinstance(e, dict) else {})
            for e in entries or []}


def test_dvc_yaml_declares_each_live_folder_the_stage_writes():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, kind in LIVE.items():
        body = stages[name]["do"]
        folder = f"live/{kind}/${{key}}"
        assert f"--live {folder}" in " ".join(body["cmd"].split()), name
        assert _paths(body["metrics"]) == {f"{folder}/metrics.json": {"cache": False}}, name
        assert _paths(body["outs"])[f"{folder}/params.yaml"] == {"cache": False}, name
        if kind != "evaluate":  # the curves, drawn against their step
            assert _paths(body["plots"]) == {f"{folder}/plots/metrics": {"cache": False, "x": "step"}}, name
    declared = [p for s in stages.values() for p in _paths(s.get("do", s).get("metrics"))]
    assert [p for p in declared if not p.startswith("live/")] == ["metrics/qg_finetune.json"]  # nothing else


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")
def test_live_outputs_and_a_queued_lr_sweep(tmp_path):
    """The tiny real pipeline: dvclive folders as declared, `dvc plots show` draws the curves against step, and
    `dvc exp run --queue -S ...` twice + `dvc queue start` runs two experiments that differ in exactly that lr."""
    teacher = make_tiny_bert_dir(tmp_path / "tiny_teacher")
    repo = working_tree_repo(tmp_path / "repo")
    write_params(repo, tiny_params(teacher))
    sh(repo, DVC, "config", "core.analytics", "false")
    sh(repo, DVC, "repro", "report")
    metrics = {k: json.loads((repo / f"live/{k}/metrics.json").read_text())
               for k in ("teacher/polarity", "train/tiny", "evaluate/tiny")}
    assert [list(m) for m in metrics.values()] == [["dev", "test", "metric", "step"],
                                                    ["dev", "metric", "best_step", "step"],
                                                    ["test", "dev", "teacher_test", "teacher_dev", "metric", "params"]]
    plots = json.loads(sh(repo, DVC, "plots", "show", "--json").stdout)
    drawn = {k: v[0]["content"] for k, v in plots["data"].items() if k.startswith("live/train/tiny/")}
    assert {"live/train/tiny/plots/metrics/train/loss.tsv", "live/train/tiny/plots/metrics/train/lr.tsv",
            "live/train/tiny/plots/metrics/dev/accuracy.tsv"} <= set(drawn)
    assert all(c["encoding"]["x"]["field"] == "step" for c in drawn.values())

    # commit what a team commits (dvc.lock and the cache:false outputs), then sweep
    sh(repo, "git", "add", "params.yaml", "dvc.lock", "metrics", "live", "reports", "predictions")
    sh(repo, "git", "commit", "-qm", "pipeline run")
    for lr in ("0.002", "0.005"):
        sh(repo, DVC, "exp", "run", "--queue", "-S", f"train.runs.tiny.optim.lr={lr}", "report")
    sh(repo, DVC, "queue", "start")
    deadline = time.time() + 900
    while time.time() < deadline and any(s in out(sh(repo, DVC, "queue", "status")) for s in ("Queued", "Running")):
        time.sleep(5)
    status = out(sh(repo, DVC, "queue", "status"))
    assert status.count("Success") == 2, status
    table = out(sh(repo, DVC, "exp", "show", "--only-changed", "--csv", "--drop",
                   "^(data|models|metrics|predictions|src|stages)(/|$)"))
    header, *rows = [line.split(",") for line in table.splitlines()]
    exps = [dict(zip(header, r)) for r in rows if r[header.index("typ")] != "baseline"]
    assert sorted(e["train.runs.tiny.optim.lr"] for e in exps) == ["0.002", "0.005"]
    # the readable view: the swept param and the live metrics that changed, nothing of the untouched stages
    assert "train.runs.tiny.optim.lr" in header and not any(h.startswith("live/teacher/") for h in header), header
    assert len(header) < 20, header
