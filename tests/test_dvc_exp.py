"""`dvc exp run -S` on one run's key changes that run only (params.yaml must not share values via YAML aliases)."""

from __future__ import annotations

import shutil

import yaml
from _dvc import DVC, ROOT, sh

SLOW_LR = "train.runs.waldorf-slow.optim.lr"


def test_exp_run_set_param_changes_exactly_that_run(tmp_path):
    text = (ROOT / "params.yaml").read_text()
    assert not [t for t in yaml.scan(text) if isinstance(t, (yaml.AliasToken, yaml.AnchorToken))]
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    # one stage that reads the key, as the real train@waldorf-slow does through its params list
    cmd = ("python -c \"import yaml; p = yaml.safe_load(open('params.yaml')); "
           "open('lr.txt', 'w').write(str(p['train']['runs']['waldorf-slow']['optim']['lr']))\"")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(
        {"stages": {"slow": {"cmd": cmd, "params": [SLOW_LR], "outs": ["lr.txt"]}}}))
    sh(tmp_path, "git", "init", "-q")
    sh(tmp_path, DVC, "init", "-q")
    sh(tmp_path, DVC, "config", "core.analytics", "false")
    sh(tmp_path, "git", "add", "-A")
    sh(tmp_path, "git", "commit", "-qm", "init")
    sh(tmp_path, DVC, "exp", "run", "-q", "-S", f"{SLOW_LR}=0.002")
    assert (tmp_path / "lr.txt").read_text() == "0.002"
    before = yaml.safe_load(text)
    after = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert after["train"]["runs"]["waldorf-slow"]["optim"]["lr"] == 0.002
    after["train"]["runs"]["waldorf-slow"]["optim"]["lr"] = before["train"]["runs"]["waldorf-slow"]["optim"]["lr"]
    assert after == before  # every other value (the other WaLDORf rows' lr included) untouched
