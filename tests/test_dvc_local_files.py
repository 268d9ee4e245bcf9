"""A user's local input files, as DVC's own resolver reads this repository's dvc.yaml: a `prepare.local` dataset's
folder is a dependency of its prepare_local stage, and the stages downstream of that folder are exactly that
dataset's chain (seconds; tests/test_dvc_trust.py, slow, changes one byte and runs `dvc repro`)."""

import shutil
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LOCAL = {"format": "glue", "task": "sst2", "path": "data/raw/tiny_sst2",
         "files": {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, "encoding": "utf-8",
         "on_bad_rows": "error", "carve": None}


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def test_a_local_folder_is_a_dependency_of_exactly_its_datasets_chain(tmp_path):
    from dvc.repo import Repo

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"]["local"] = {"tiny_sst2": LOCAL}
    params["tokenize"]["datasets"]["tiny_sst2"] = {"kind": "classification", "max_seq_len": None}
    Repo.init(str(tmp_path), no_scm=True).close()
    shutil.copy2(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    with Repo(str(tmp_path)) as repo:
        stages = {s.name: ({str(d.def_path) for d in s.deps}, {str(o.def_path) for o in s.outs})
                  for s in repo.index.stages}
    assert LOCAL["path"] in stages["prepare_local@tiny_sst2"][0]
    # what a changed byte in the folder makes stale: the stages reading it, then those reading their outputs
    stale, changed = set(), {LOCAL["path"]}
    while True:
        reached = {name for name, (deps, _) in stages.items()
                   if any(_under(d, c) or _under(c, d) for d in deps for c in changed)} - stale
        if not reached:
            break
        stale |= reached
        changed |= {o for name in reached for o in stages[name][1]}
    assert stale == {"prepare_local@tiny_sst2", "tokenize@tiny_sst2"}
    assert {"prepare@polarity", "tokenize@polarity"} <= stages.keys()  # the other datasets' chains, not reached
