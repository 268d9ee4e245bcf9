"""`dvc exp run -S` on one run's key changes that run only (params.yaml must not share values via YAML aliases)."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml
from _dvc import DVC, ROOT, sh, working_tree_repo

WALDORF_LR = "train.runs.waldorf-soft.optim.lr"


def test_exp_run_set_param_changes_exactly_that_run(tmp_path):
    text = (ROOT / "params.yaml").read_text()
    assert not [t for t in yaml.scan(text) if isinstance(t, (yaml.AliasToken, yaml.AnchorToken))]
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    # one stage that reads the key, as the real train@waldorf-soft does through its params list
    cmd = ("python -c \"import yaml; p = yaml.safe_load(open('params.yaml')); "
           "open('lr.txt', 'w').write(str(p['train']['runs']['waldorf-soft']['optim']['lr']))\"")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(
        {"stages": {"slow": {"cmd": cmd, "params": [WALDORF_LR], "outs": ["lr.txt"]}}}))
    sh(tmp_path, "git", "init", "-q")
    sh(tmp_path, DVC, "init", "-q")
    sh(tmp_path, DVC, "config", "core.analytics", "false")
    sh(tmp_path, "git", "add", "-A")
    sh(tmp_path, "git", "commit", "-qm", "init")
    sh(tmp_path, DVC, "exp", "run", "-q", "-S", f"{WALDORF_LR}=0.002")
    assert (tmp_path / "lr.txt").read_text() == "0.002"
    before = yaml.safe_load(text)
    after = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert after["train"]["runs"]["waldorf-soft"]["optim"]["lr"] == 0.002
    after["train"]["runs"]["waldorf-soft"]["optim"]["lr"] = before["train"]["runs"]["waldorf-soft"]["optim"]["lr"]
    assert after == before  # every other value (the other WaLDORf rows' lr included) untouched


STUB = '''"""A stage stand-in: every out's bytes are a digest of the stage's params values and data deps, as a real
stage's outputs are a function of them."""
import hashlib
import json
import pathlib
import sys

import yaml

args = sys.argv[1:]
i, j = args.index("--deps"), args.index("--params")
outs, deps, keys = args[:i], args[i + 1:j], args[j + 1:]
h = hashlib.sha256()
params = yaml.safe_load(open("params.yaml"))
for key in keys:
    value = params
    for part in key.split("."):
        value = value[part]
    h.update(json.dumps(value, sort_keys=True).encode())
for dep in deps:
    p = pathlib.Path(dep)
    for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
        if f.is_file():
            h.update(str(f).encode() + f.read_bytes())
for out in outs:
    p = pathlib.Path(out)
    if p.suffix in (".json", ".md", ".png", ".yaml"):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(h.hexdigest())
    else:
        p.mkdir(parents=True, exist_ok=True)
        (p / "stub").write_text(h.hexdigest())
'''


def _paths(entries) -> list[str]:
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries or []]


def stub_pipeline(real: dict) -> dict:
    """The real dvc.yaml with every command but the fingerprint stage's replaced by STUB over the same outs, deps and
    params: DVC decides what re-runs from exactly these, so the stand-in reproduces the real pipeline's re-run
    decisions. The fingerprint stage stays real (seconds): it reads the source and writes the fingerprint files that
    every other stage depends on."""
    stages = {}
    for name, stage in real["stages"].items():
        if name == "fingerprint":
            stages[name] = stage
            continue
        body = dict(stage.get("do", stage))
        outs = _paths(body.get("outs")) + _paths(body.get("metrics")) + _paths(body.get("plots"))
        deps = [d for d in body.get("deps", []) if not d.startswith(("src/", "stages/"))]
        keys = [k for p in body.get("params", []) for k in ([p] if isinstance(p, str) else p)]
        body["cmd"] = " ".join(["python stub.py", *outs, "--deps", *deps, "--params", *keys])
        body["deps"] = deps
        stages[name] = {**stage, "do": body} if "do" in stage else body
    return {"stages": stages}


@pytest.mark.slow
def test_exp_run_set_reruns_exactly_that_run_its_evaluation_and_the_report(tmp_path):
    """The whole real graph (dvc.yaml, params.yaml, the source the fingerprint stage reads) with stand-in commands:
    after a full repro, `dvc exp run -S` on one WaLDORf run's lr runs that run's train, evaluate and speed stages
    (waldorf-soft is the WaLDORf run speed.runs times) and the report, nothing else; so does switching the run to its
    live teacher and back, its dvc.lock deps following the switch."""
    repo = working_tree_repo(tmp_path / "repo")
    (repo / "stub.py").write_text(STUB)
    real = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    (repo / "dvc.yaml").write_text(yaml.safe_dump(stub_pipeline(real), sort_keys=False))
    sh(repo, DVC, "repro", "-q", repo=repo)
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "pipeline")
    res = sh(repo, DVC, "exp", "run", "-S", f"{WALDORF_LR}=0.002", repo=repo)
    ran = set(re.findall(r"Running stage '([^']+)'", res.stdout + res.stderr))
    assert ran == {"train@waldorf-soft", "evaluate@waldorf-soft", "speed@waldorf-soft", "report"}, ran
    # the run switched to its live teacher (docs/students.md): the same stages, now on the teacher folder, not the
    # store; and back to the cache, the same again
    for teacher in ("models/teacher/wiki_qa", "data/teacher/wiki_qa.zarr"):
        res = sh(repo, DVC, "exp", "run", "-S", f"train.runs.waldorf-soft.teacher={teacher}", repo=repo)
        ran = set(re.findall(r"Running stage '([^']+)'", res.stdout + res.stderr))
        assert ran == {"train@waldorf-soft", "evaluate@waldorf-soft", "speed@waldorf-soft", "report"}, (teacher, ran)
        stage = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["train@waldorf-soft"]
        deps = {d["path"] for d in stage["deps"]}
        assert teacher in deps and not {"models/teacher/wiki_qa", "data/teacher/wiki_qa.zarr"} - {teacher} & deps
