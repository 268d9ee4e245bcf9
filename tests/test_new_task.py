"""Adding your own task is one step: `distillpipe new-task` on a tiny local GLUE file, then `dvc repro report` runs
it from prepare_local to the report in a real DVC repository; the rest of params.yaml is left byte for byte."""

import json
import random
import shutil

import pytest
import yaml
from _dvc import BIN, DVC, out, sh, tiny_params, working_tree_repo, write_params
from _tiny import WORDS, make_tiny_bert_dir

from distillpipe.config.base import ConfigError
from distillpipe.scaffold import add_task

ROOT_PARAMS = __import__("pathlib").Path(__file__).resolve().parents[1] / "params.yaml"


def tsv(path, n, seed):
    rng = random.Random(seed)
    lines = ["sentence\tlabel"]
    for _ in range(n):
        words = rng.sample(WORDS, 6)
        lines.append(f"{' '.join(words)}\t{int('w7' in words or 'w8' in words)}")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow  # ~1 min: a real DVC pipeline from prepare to report (make test-all runs it)
@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")
def test_new_task_runs_from_prepare_to_report(tmp_path):
    teacher = make_tiny_bert_dir(tmp_path / "tiny_teacher")
    repo = working_tree_repo(tmp_path / "repo")
    params = tiny_params(teacher)
    params["report"]["tables"] = [{"title": "Tiny student (polarity)", "caption": "c", "runs": ["teacher:polarity",
                                   "tiny"], "paper": None, "metric": None, "compare": []}]
    write_params(repo, params)
    raw = repo / "data" / "raw" / "mine"
    raw.mkdir(parents=True)
    tsv(raw / "train.tsv", 120, 0)
    tsv(raw / "dev.tsv", 40, 1)  # the official dev: our reported test
    before = (repo / "params.yaml").read_text()
    res = sh(repo, BIN / "distillpipe", "new-task", "mine", "--like", "polarity", "--path", "data/raw/mine",
             "--task", "sst2", "--train", "train.tsv", "--test", "dev.tsv", "--carve-dev", "0.2", repo=repo)
    assert "prepare.local.mine" in res.stdout and "train.runs.tiny-mine" in res.stdout, res.stdout
    after = (repo / "params.yaml").read_text()
    # only insertions: every line of the old file is still there, in order
    it = iter(after.splitlines())
    assert all(line in it for line in before.splitlines() if line.strip() not in ("local: {}",))

    log = out(sh(repo, DVC, "repro", "report"))
    for stage in ("prepare_local@mine", "tokenize@mine", "teacher_finetune@mine", "teacher_cache@mine",
                  "train@tiny-mine", "evaluate@tiny-mine", "report"):
        assert f"Running stage '{stage}'" in log, stage
    metrics = json.loads((repo / "metrics" / "students" / "tiny-mine.json").read_text())
    assert set(metrics["test"]) >= {"accuracy"} and metrics["dataset"] == "mine"
    prepared = json.loads((repo / "data" / "prepared" / "mine" / "meta.json").read_text())
    assert prepared["summary"]["rows"]["test"] == 40 and prepared["summary"]["rows"]["dev"] > 0
    report = (repo / "reports" / "results.md").read_text()
    assert "Tiny student (mine)" in report and "tiny-mine" in report
    assert "up to date" in out(sh(repo, DVC, "status", "report"))


def test_new_task_refusals(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text(ROOT_PARAMS.read_text())
    local = {"format": "glue", "task": "sst2", "path": "data/raw/x", "files": {"train": "train.tsv"},
             "encoding": "utf-8", "on_bad_rows": "error", "carve": {"dev": 0.1, "test": 0.1, "seed": 0}}
    with pytest.raises(ConfigError, match="already in"):
        add_task(p, "polarity", "wiki_pairs", local)
    with pytest.raises(ConfigError, match="--like wiki_qa is a qa dataset but format 'glue'"):
        add_task(p, "x", "wiki_qa", local)
    with pytest.raises(ConfigError, match="no dataset 'nope'"):
        add_task(p, "x", "nope", local)
    with pytest.raises(ConfigError, match="carve"):  # built with the config classes before writing
        add_task(p, "x", "polarity", {**local, "carve": {"dev": 0.6, "test": 0.6, "seed": 0}})
    assert p.read_text() == ROOT_PARAMS.read_text()  # nothing written
    added = add_task(p, "stsb", "wiki_pairs", {**local, "task": "stsb"})
    new = yaml.safe_load(p.read_text())
    assert new["teacher_finetune"]["tasks"]["stsb"]["regression_bin_width"] == 0.2  # CMOW sec. IV-A bins
    assert {"finetune.runs.hybrid-stsb", "finetune.runs.hybrid-stsb-joint"} <= set(added)
    assert new["finetune"]["runs"]["hybrid-stsb-joint"]["encoding"] == "joint"


def test_new_task_lengths(tmp_path):
    """--max-seq-len (and for QA --doc-stride, --max-query-len) set the new dataset's tokenize entry; the --like
    dataset's entry is left as it was, and a length its kind does not have, or one that leaves no room, is refused."""
    p = tmp_path / "params.yaml"
    p.write_text(ROOT_PARAMS.read_text())
    squad = {"format": "squad", "path": "data/raw/squad", "files": {"train": "train-sample.json"},
             "encoding": "utf-8", "carve": {"dev": 0.2, "test": 0.2, "seed": 0}}
    with pytest.raises(ConfigError, match="doc_stride"):  # 330 >= 384 - 64 - 3: windows could not advance
        add_task(p, "my_qa", "wiki_qa", squad, lengths={"max_seq_len": 384, "doc_stride": 330, "max_query_len": 64})
    sst2 = {"format": "glue", "task": "sst2", "path": "data/raw/SST-2", "files": {"train": "train.tsv", "test":
            "dev.tsv"}, "encoding": "utf-8", "on_bad_rows": "error", "carve": {"dev": 0.1, "test": 0.0, "seed": 0}}
    with pytest.raises(ConfigError, match="--doc-stride: a classification dataset has no tokenize key"):
        add_task(p, "my_cls", "polarity", sst2, lengths={"max_seq_len": 64, "doc_stride": 128})
    assert p.read_text() == ROOT_PARAMS.read_text()  # nothing written
    add_task(p, "my_qa", "wiki_qa", squad, lengths={"max_seq_len": 384, "doc_stride": 128, "max_query_len": 64})
    add_task(p, "my_cls", "polarity", sst2, lengths={"max_seq_len": 64})
    tok = yaml.safe_load(p.read_text())["tokenize"]["datasets"]
    assert tok["my_qa"] == {"kind": "qa", "doc_stride": 128, "max_query_len": 64, "max_seq_len": 384}
    assert tok["my_cls"] == {"kind": "classification", "max_seq_len": 64}
    assert tok["wiki_qa"] == yaml.safe_load(ROOT_PARAMS.read_text())["tokenize"]["datasets"]["wiki_qa"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed to ask what it ignores")
def test_raw_data_pointers_are_committable(tmp_path):
    """README: your files go under data/raw/<name>/, `dvc add data/raw/<name>`, commit the .dvc file. The rest of
    data/ is pipeline output and stays ignored (the files themselves are DVC's)."""
    shutil.copy(ROOT_PARAMS.parent / ".gitignore", tmp_path / ".gitignore")
    sh(tmp_path, "git", "init", "-q")
    sh(tmp_path, DVC, "init", "-q")
    raw = tmp_path / "data" / "raw" / "SST-2"
    raw.mkdir(parents=True)
    tsv(raw / "train.tsv", 10, 0)
    sh(tmp_path, DVC, "add", "data/raw/SST-2")  # refused while data/ was ignored whole: "bad DVC file name ..."
    sh(tmp_path, "git", "add", "data/raw/SST-2.dvc")
    ignored = sh(tmp_path, "git", "check-ignore", "--no-index", "data/raw/SST-2/train.tsv", "data/prepared/x/meta.json",
                 "data/tokens/x", "data/teacher/x.zarr", "data/x.dvc", check=False).stdout.split()
    assert ignored == ["data/raw/SST-2/train.tsv", "data/prepared/x/meta.json", "data/tokens/x", "data/teacher/x.zarr",
                       "data/x.dvc"]
