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
    """docs/your-data.md: your files go under data/raw/<name>/, `dvc add data/raw/<name>`, commit the .dvc file.
    The rest of data/ is pipeline output and stays ignored (the files themselves are DVC's)."""
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


def test_only_runs_that_read_the_new_data_and_captions_of_the_new_task():
    """--like polarity copies the Hybrid runs, not the ELMo heads (they need the word-vector and biLM stages) unless
    asked; copied report tables describe the new task, not the embedded data."""
    from distillpipe.scaffold import plan_task

    params = yaml.safe_load(ROOT_PARAMS.read_text())
    local = {"format": "glue", "task": "sst2", "path": "data/raw/SST-2", "files": {"train": "train.tsv"},
             "encoding": "utf-8", "on_bad_rows": "error", "carve": {"dev": 0.1, "test": 0.1, "seed": 0}}
    runs = {key for where, key, _ in plan_task(params, "sst2", "polarity", local) if where == "finetune.runs"}
    assert runs == {"hybrid-sst2", "hybrid-sst2-hard"}
    plan = plan_task(params, "sst2", "polarity", local, elmo=True)
    assert {key for where, key, _ in plan if where == "finetune.runs"} == runs | {"elmo-c-sst2"}
    tables = [value for where, _, value in plan if where == "report.tables"]
    embedded = {t["caption"] for t in params["report"]["tables"]}
    assert len(tables) == 1 and not {t["caption"] for t in tables} & embedded  # KD vs hard labels
    assert all("sst2 (glue files in data/raw/SST-2)" in t["caption"] for t in tables)


def test_sizing_arithmetic():
    """A copied schedule that fits is left alone; one that does not gets the most steps that fit beside EVALS dev
    passes, evaluations spread over them and patience at the copied share; the teacher loses epochs before rows."""
    from distillpipe.train.sizing import EVALS, Rates, size_student, size_teacher

    rates = Rates(batch_size=16, seq_len=12, step_s=0.25, forward_s=0.1)  # 160 rows/s forward
    optim = {"epochs": 20, "max_steps": None, "batch_size": 16, "eval_every": 0, "patience": 5}
    small = size_student(optim, 140, 40, rates, budget_s=1800)
    assert small.changes == {} and small.seconds == pytest.approx(20 * 9 * 0.25 + 20 * 40 / 160)
    big = size_student(optim, 60_000, 6_000, rates, budget_s=1800)
    fit = big.changes["max_steps"]
    assert fit * 0.25 + EVALS * 6_000 / 160 <= 1800 < (fit + 1) * 0.25 + EVALS * 6_000 / 160
    assert big.changes == {"epochs": -(-fit // 3750), "max_steps": fit, "eval_every": fit // EVALS, "patience": 2}
    assert big.copied_seconds == pytest.approx(20 * 3750 * 0.25 + 20 * 6_000 / 160)
    with pytest.raises(ValueError, match="no room"):
        size_student(optim, 60_000, 6_000, rates, budget_s=60)

    task = {"epochs": 5, "max_train_rows": None, "batch_size": 16}
    teacher = Rates(batch_size=16, seq_len=12, step_s=1.0, forward_s=0.1)  # 16 rows/s training
    assert size_teacher(task, 10_000, 100, teacher, 1800).changes == {"epochs": 2}  # all rows, fewer epochs
    cut = size_teacher(task, 60_000, 100, teacher, 1800)
    assert cut.changes == {"epochs": 1, "max_train_rows": int((1800 - 100 / 160) * 16)}
    assert size_teacher(task, 100, 10, teacher, 1800).changes == {}
    grid = {**task, "lr_grid": [3e-5, 2e-5]}  # three fine-tunings share the budget
    three = size_teacher(grid, 10_000, 100, teacher, 1800)
    assert three.changes == {"epochs": 1, "max_train_rows": int((600 - 100 / 160) * 16)}
    assert three.seconds == pytest.approx(3 * (three.changes["max_train_rows"] / 16 + 100 / 160))


def test_new_task_sized_to_budget(tmp_path, monkeypatch):
    """With --budget the copied schedule is sized from rates measured here on the real (tiny) teacher and student:
    a run that cannot finish gets max_steps, evaluations spread over them and the cache only the rows it reads."""
    teacher = make_tiny_bert_dir(tmp_path / "tiny_teacher")
    params = tiny_params(teacher)
    params["train"]["runs"]["tiny"]["optim"].update(epochs=200, patience=50)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    raw = tmp_path / "data" / "raw" / "mine"
    raw.mkdir(parents=True)
    tsv(raw / "train.tsv", 3000, 0)
    monkeypatch.chdir(tmp_path)
    local = {"format": "glue", "task": "sst2", "path": "data/raw/mine", "files": {"train": "train.tsv"},
             "encoding": "utf-8", "on_bad_rows": "error", "carve": {"dev": 0.1, "test": 0.1, "seed": 0}}
    lines: list[str] = []
    add_task(tmp_path / "params.yaml", "mine", "polarity", local, budget_minutes=0.1, report=lines)
    new = yaml.safe_load((tmp_path / "params.yaml").read_text())
    optim = new["train"]["runs"]["tiny-mine"]["optim"]
    assert optim["max_steps"] and optim["max_steps"] < 200 * 3000 / 32
    assert optim["eval_every"] == optim["max_steps"] // 10 and optim["patience"] == 2  # 50 of 200 evaluations -> 2
    rows = int(lines[1].split("train ")[1].split(" ")[0].replace(",", ""))
    cache = new["teacher_cache"]["datasets"]["mine"]["max_rows"]
    assert cache == (None if optim["max_steps"] * 32 >= rows else optim["max_steps"] * 32)
    assert new["train"]["runs"]["tiny"]["optim"]["epochs"] == 200  # the --like run is left as it was
    text = "\n".join(lines)
    assert "train.runs.tiny-mine: recipe" in text and "chose epochs" in text and "expected: ~" in text
    assert "measured now on" in text
    assert "    checkpoint_minutes 10: a checkpoint of " in text  # tiny models: the copied interval costs far under 2%


def test_new_task_fits_the_papers_recipes_both_ways(tmp_path, monkeypatch):
    """The copied teacher is the embedded CPU toy (40 rows, 1 epoch): new-task grows it to its recipe (every row, BERT's
    3 epochs, the copied learning rate) when the budget allows, or shrinks it (epochs, then rows) when it does not,
    saying what the budget keeps short. Rates are a fixed table here, so the arithmetic is checked, not this
    machine."""
    import distillpipe.scaffold as scaffold
    from distillpipe.train.sizing import Rates

    teacher = make_tiny_bert_dir(tmp_path / "tiny_teacher")
    params = tiny_params(teacher)
    params["teacher_finetune"]["tasks"]["polarity"].update(epochs=1, max_train_rows=40, lr=1e-3)
    raw = tmp_path / "data" / "raw" / "mine"
    raw.mkdir(parents=True)
    tsv(raw / "train.tsv", 3000, 0)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(scaffold, "measure_teacher", lambda base, kind, n, bs, L, dev: Rates(bs, L, 0.5, 0.05))
    monkeypatch.setattr(scaffold, "measure_student", lambda m, t, tune, bs, L, dev: Rates(bs, L, 0.001, 0.0001))
    local = {"format": "glue", "task": "sst2", "path": "data/raw/mine", "files": {"train": "train.tsv"},
             "encoding": "utf-8", "on_bad_rows": "error", "carve": {"dev": 0.1, "test": 0.1, "seed": 0}}

    def new_task(budget):
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        lines: list[str] = []
        add_task(tmp_path / "params.yaml", "mine", "polarity", local, budget_minutes=budget, report=lines)
        rows = dict(part.split() for part in lines[1].split("data: ")[1].split(" rows")[0].split(" / "))
        task = yaml.safe_load((tmp_path / "params.yaml").read_text())["teacher_finetune"]["tasks"]["mine"]
        return task, {k: int(v.replace(",", "")) for k, v in rows.items()}, "\n".join(lines)

    task, rows, text = new_task(60)  # 3 epochs of ~2,400 rows at 16 rows/s: ~8 min, inside
    assert {k: task[k] for k in ("epochs", "max_train_rows", "lr", "lr_grid", "batch_size")} == {
        "epochs": 3, "max_train_rows": None, "lr": 1e-3, "lr_grid": [5e-5, 3e-5, 2e-5], "batch_size": 8}
    assert f"recipe 3 epochs of all {rows['train']:,} rows" in text and "chose the whole recipe" in text
    assert "at the copied lr 0.001 and BERT's 5e-05, 3e-05, 2e-05, the best on dev kept" in text
    assert "at each of 4 learning rates" in text
    assert "keeps the teacher short" not in text

    task, rows, text = new_task(0.5)  # 30 s for 4 rates: one epoch, and only the rows that fit beside a dev pass
    dev_s = rows["dev"] / (8 / 0.05)
    assert task["epochs"] == 1 and task["max_train_rows"] == int((30 / 4 - dev_s) * 8 / 0.5) < rows["train"]
    assert "the budget keeps the teacher short of its recipe" in text and "would fit the recipe" in text


def test_copied_runs_get_their_papers_schedules():
    """Each copied student run gets its architecture's paper schedule (train/recipes.py), not the embedded CPU cap."""
    from distillpipe.scaffold import plan_task

    params = yaml.safe_load(ROOT_PARAMS.read_text())

    def optims(like, local):
        return {key: value["optim"] for where, key, value in plan_task(params, "new", like, local)
                if where in ("train.runs", "finetune.runs")}

    glue = {"format": "glue", "task": "mrpc", "path": "p", "files": {"train": "t"}, "carve": None}
    pairs = optims("wiki_pairs", glue)
    assert {k: pairs["hybrid-new"][k] for k in ("epochs", "patience", "max_steps")} == {
        "epochs": 20, "patience": 5, "max_steps": None}
    assert pairs["hybrid-new"]["lr"] == params["finetune"]["runs"]["hybrid-wiki_pairs"]["optim"]["lr"]  # grid-searched
    assert (pairs["minialbert-new"]["epochs"], pairs["minialbert-new"]["lr"]) == (10, 5e-5)
    qa = optims("wiki_qa", {"format": "squad", "path": "p", "files": {"train": "t"}, "carve": None})
    assert params["train"]["runs"]["waldorf-soft"]["optim"]["max_steps"] is not None  # the embedded cap...
    assert {k: qa["waldorf-soft-new"][k] for k in ("epochs", "lr", "batch_size", "max_steps")} == {
        "epochs": 35, "lr": 2e-4, "batch_size": 24, "max_steps": None}  # ...gone: WaLDORf's Table 5
    teacher = next(v for w, k, v in plan_task(params, "new", "wiki_qa", {"format": "squad", "path": "p",
                                                                           "files": {"train": "t"}, "carve": None})
                   if w == "teacher_finetune.tasks")
    copied = params["teacher_finetune"]["tasks"]["wiki_qa"]
    assert copied["max_train_rows"] is not None  # the embedded CPU cap, dropped: every row, at least 2 epochs
    assert (teacher["epochs"], teacher["max_train_rows"], teacher["lr"]) == (max(2, copied["epochs"]), None,
                                                                           copied["lr"])


def test_checkpoint_interval_keeps_checkpointing_under_2_percent():
    """A BERT-Large fine-tuning checkpoint (fp32 weights + AdamW: 335 M x 12 bytes) on a 0.3 GB/s disk: a write of
    ~13 s and a staging copy of ~2 s need 13 minutes for 2%; the embedded MiniLM's (~270 MB) fits the copied 10."""
    from distillpipe.train.sizing import Rates, size_checkpoints

    large = 335_000_000 * 12
    keys = {"checkpoint_minutes": 10.0}
    line = size_checkpoints(keys, Rates(32, 128, 0.25, 0.08, large), 3600, 0.3e9)
    cost = large / 2e9 + large / 0.3e9
    assert keys["checkpoint_minutes"] == 13 and cost / (13 * 60) <= 0.02 < cost / (12 * 60)
    assert line.startswith("    checkpoint_minutes 13: a checkpoint of 4,020.0 MB costs ~15.4 s")
    assert ", 4 in the run" in line
    assert "one every ~3,120 steps" in line  # 13 min of 0.25 s steps
    small = {"checkpoint_minutes": 10.0}
    size_checkpoints(small, Rates(32, 128, 0.5, 0.05, 272_000_000), 360, 0.3e9)
    assert small["checkpoint_minutes"] == 10
