"""distillpipe plan: its rows, spec, bytes and files equal those of stores really built from the same params; its
row estimates from prepared data come close to what tokenize then gives; forward_flops and the parameter count
equal torch's own counts; the command prints a table, JSON, or one error line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from _tiny import make_classification_tokens, make_mlm_tokens, make_qa_tokens, make_tiny_bert_dir, signals, write_params
from typer.testing import CliRunner

from distillpipe.cli import app
from distillpipe.config.base import load_section
from distillpipe.config.teacher_cache import TeacherCacheConfig
from distillpipe.config.tokenize import TokenizeConfig
from distillpipe.data.masking import n_to_mask
from distillpipe.data.schema import write_meta
from distillpipe.data.tokenize import tokenize_dataset
from distillpipe.store.reader import open_store
from distillpipe.teacher import plan as plan_mod
from distillpipe.teacher import rows as rows_mod
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.teacher.plan import (
    COMPRESSED_TOLERANCE,
    WEIGHT_BYTES,
    forward_flops,
    plan_caches,
    teacher_params,
)

SHARD = 32
MLM_VIEW = {"kind": "mlm", "mask_views": 2, "mask_prob": 0.15, "mask_token_fraction": 0.8,
            "random_token_fraction": 0.1, "seed": 0, "max_seq_len": None,
            "max_eval_blocks": None}
BENCH = {"date": "2026-11-25T15:00:00Z", "device": "cpu", "device_name": "CPU, 2 cores", "cores": 2,
         "forward": {"flops_per_s": 2.1e11, "measured_on": "MiniLM-L6, L 128, fp32, batch 64"},
         "gpu": {"name": "H100 bf16 (assumed)", "flops_per_s": 9.9e14, "projection_cores": 16},
         "disk": {"write_bytes_per_s": 1.2e9, "read_bytes_per_s": 2.5e9},
         "host": {"cpu_s_per_byte": 1.3e-9}}


def _item(teacher, head, max_rows, **sig):
    return {"teacher": teacher, "head": head, "split": "train", "max_rows": max_rows, "signals": signals(**sig)}


def _params(path: Path, datasets: dict, tokenize: dict) -> Path:
    return write_params(path, {
        "teacher_cache": {"device": "cpu", "batch_size": 16, "cpu_threads": 1, "shard_rows": SHARD,
                          "datasets": datasets},
        "tokenize": {"tokenizer": "unused", "max_seq_len": 32, "datasets": tokenize}})


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A repository layout (data/tokens, models/teacher) with four stores built as `dvc repro` would: MLM top-k with
    hidden states and pooled scores (70 of 100 rows: shards of 32, 32, 6), attention probabilities with embeddings
    (40 rows), classification logits (40 rows: 32 + 8), and MLM top-k, hidden states, scores and embeddings stored
    compressed (40 rows)."""
    from transformers import BertConfig, BertForMaskedLM

    root = tmp_path_factory.mktemp("repo")
    mlm_teacher = make_tiny_bert_dir(root / "models" / "teacher" / "mlm")
    torch.manual_seed(3)
    model = BertForMaskedLM(BertConfig.from_pretrained(mlm_teacher))  # with its MLM head
    with torch.no_grad():  # a trained teacher's O(1) scores (a peaked softmax), not random init's O(1e-2)
        for layer in model.bert.encoder.layer:
            layer.attention.self.query.weight.normal_(0, 0.3)
            layer.attention.self.key.weight.normal_(0, 0.3)
        model.cls.predictions.bias.normal_(0, 2.0)
    model.save_pretrained(mlm_teacher)
    clf = make_tiny_bert_dir(root / "models" / "teacher" / "clf", num_labels=3, seed=1)
    make_mlm_tokens(root / "data" / "tokens" / "toy_mlm", mlm_teacher, n_rows=100)
    make_mlm_tokens(root / "data" / "tokens" / "toy_probs", mlm_teacher, n_rows=40, seed=2)
    make_mlm_tokens(root / "data" / "tokens" / "toy_int8", mlm_teacher, n_rows=40, seed=3)
    make_mlm_tokens(root / "data" / "tokens" / "toy_compact", mlm_teacher, n_rows=40, seed=4)
    make_classification_tokens(root / "data" / "tokens" / "toy_cls", clf, n_train=40, n_dev=8)
    datasets = {
        "toy_mlm": _item("mlm", "mlm", 70, mlm_topk=8, hidden_layers=[0, 2], attn_layers=[1, 2], pool=2),
        "toy_probs": _item("mlm", "base", None, hidden_layers=[2], attn_layers=[1], pool=1, attn_probs=True,
                           embeddings=True),
        "toy_cls": _item("clf", "classification", None, logits=True, hidden_layers=[], attn_layers=[], pool=1),
        "toy_int8": _item("mlm", "mlm", None, mlm_topk=8, hidden_layers=[0, 2], attn_layers=[1, 2], pool=2,
                          embeddings=True, precision={"hidden": "int8", "attention": "int8", "mlm_topk": "uint8"}),
        "toy_compact": _item("mlm", "mlm", None, mlm_topk=8, hidden_layers=[0, 2], hidden_rank=6, attn_layers=[1, 2],
                             attn_rank=2, pool=2, embeddings=True,
                             precision={"hidden": "int8", "attention": "int8", "mlm_topk": "uint8"}),
    }
    params = _params(root / "params.yaml", datasets,
                     {"toy_mlm": MLM_VIEW, "toy_probs": MLM_VIEW, "toy_int8": MLM_VIEW, "toy_compact": MLM_VIEW,
                      "toy_cls": {"kind": "classification", "max_seq_len": None}})
    cfg = load_section(params, "teacher_cache", TeacherCacheConfig)
    for name, dcfg in cfg.datasets.items():
        build_teacher_cache(name, root / "data" / "tokens" / name, root / "models" / "teacher" / dcfg.teacher, dcfg,
                            "cpu", cfg.batch_size, cfg.shard_rows, root / "data" / "teacher" / f"{name}.zarr",
                            cpu_threads=1)
    return {"root": root, "params": params, "plan": plan_caches(params, root, root / "no_bench.json")}


def _metadata_bytes(store: Path) -> int:
    """Uncompressed bytes of every array, read from the store's own zarr.json files (shape x itemsize)."""
    total = 0
    for meta in store.rglob("zarr.json"):
        m = json.loads(meta.read_text())
        if m["node_type"] == "array":
            total += math.prod(m["shape"]) * np.dtype(m["data_type"]).itemsize
    return total


def _data_files(store: Path) -> list[Path]:
    return [p for p in store.rglob("*") if p.is_file() and "c" in p.relative_to(store).parts]


@pytest.mark.parametrize("name", ["toy_mlm", "toy_probs", "toy_cls", "toy_int8", "toy_compact"])
def test_plan_equals_the_built_store(repo, name):
    item = next(i for i in repo["plan"].items if i.name == name)
    store = repo["root"] / "data" / "teacher" / f"{name}.zarr"
    manifest = open_store(store).manifest
    assert item.rows.how == "tokens" and item.rows.n == manifest.n_rows and item.n_shards == manifest.n_shards
    assert item.spec == manifest.signals  # the very spec the build made (M counted in the tokens)
    assert item.nbytes == _metadata_bytes(store)
    files = [p for p in store.rglob("*") if p.is_file()]
    assert item.files["total"] == len(files)
    assert item.files["data"] == len(_data_files(store))
    assert item.files["markers"] == len(list((store / "shards_done").glob("*.json"))) + 1  # + constants.json


def test_on_disk_estimate_within_the_documented_tolerance(repo):
    """Data files on disk / the estimate, for the stores with activations (the logits store is a few hundred bytes,
    where Blosc's and the shard index's fixed costs dominate)."""
    ratios = {}
    for item in repo["plan"].items:
        store = repo["root"] / "data" / "teacher" / f"{item.name}.zarr"
        ratios[item.name] = sum(p.stat().st_size for p in _data_files(store)) / item.est_bytes
    lo, hi = COMPRESSED_TOLERANCE
    assert lo <= ratios["toy_mlm"] <= hi and lo <= ratios["toy_probs"] <= hi, ratios
    assert lo <= ratios["toy_int8"] <= hi, ratios  # int8 values and float16 scales: the stored layout's bytes
    assert lo <= ratios["toy_compact"] <= hi, ratios  # coordinates, factors and the constants
    # and far better than the uncompressed size for padded rows (mean length ~19 of 32)
    item = next(i for i in repo["plan"].items if i.name == "toy_probs")
    assert item.est_bytes < 0.75 * item.nbytes


def test_memory_is_two_shards_plus_the_teachers_fp32_weights(repo):
    from transformers import AutoModelForMaskedLM

    item = next(i for i in repo["plan"].items if i.name == "toy_mlm")
    n_params = sum(p.numel() for p in AutoModelForMaskedLM.from_pretrained(repo["root"] / "models/teacher/mlm")
                   .parameters())
    assert item.memory_bytes == 2 * SHARD * item.row_bytes + WEIGHT_BYTES * n_params


def _corpus(path: Path, n_docs: int, seed: int) -> Path:
    """A prepared MLM corpus of words w10..w59: 4 characters a token, spaces included."""
    from datasets import Dataset, DatasetDict

    rng = np.random.default_rng(seed)
    rows = {"doc_id": [], "text": []}
    for d in range(n_docs):
        for _ in range(int(rng.integers(1, 4))):
            rows["doc_id"].append(f"d{d}")
            rows["text"].append(" ".join(f"w{int(w)}" for w in rng.integers(10, 60, size=int(rng.integers(5, 80)))))
    DatasetDict({"train": Dataset.from_dict(rows)}).save_to_disk(str(path))
    write_meta(path, {"name": "corpus", "task_type": "corpus"})
    return path


def test_rows_estimated_from_prepared_data_and_a_missing_teacher(tmp_path, monkeypatch):
    """No tokens yet: rows and M come from the prepared data and the tokenize params, then tokenize gives about
    that many rows. The teacher was never imported: the plan says so instead of failing."""
    teacher = make_tiny_bert_dir(tmp_path / "models" / "teacher" / "t")
    prepared = _corpus(tmp_path / "data" / "prepared" / "corpus", 60, 0)
    make_qa_tokens(tmp_path / "qa", teacher)
    (tmp_path / "data" / "prepared" / "toy_qa").symlink_to(tmp_path / "qa" / "qa_prepared")
    params = _params(tmp_path / "params.yaml",
                     {"corpus": _item("t", "base", None), "toy_qa": _item("t", "base", None),
                      "gone": _item("never_imported", "base", None)},
                     {"corpus": MLM_VIEW, "gone": MLM_VIEW,
                      "toy_qa": {"kind": "qa", "doc_stride": 8, "max_query_len": 8, "max_seq_len": None}})
    monkeypatch.setattr(rows_mod, "CHARS_PER_TOKEN", 4.0)  # this vocabulary's ratio (English prose: ~4.7)
    p = plan_caches(params, tmp_path, tmp_path / "no_bench.json")
    items = {i.name: i for i in p.items}
    corpus, qa, gone = items["corpus"], items["toy_qa"], items["gone"]

    tok = load_section(params, "tokenize", TokenizeConfig)
    tokenize_dataset("corpus", prepared, TokenizeConfig(str(teacher), 32, {"corpus": tok.datasets["corpus"]}),
                     tmp_path / "tokens")
    from datasets import load_from_disk

    real = load_from_disk(str(tmp_path / "tokens"))["train"]
    assert corpus.rows.how == "estimated" and "estimated" in corpus.rows.note
    assert abs(corpus.rows.n - len(real)) <= 0.05 * len(real), (corpus.rows.n, len(real))
    assert corpus.rows.max_masked == n_to_mask(30, 0.15) >= max(len(m) for m in real["masked_positions"])
    real_qa = len(load_from_disk(str(tmp_path / "qa" / "qa_tokens"))["train"])
    assert qa.rows.how == "estimated", qa.rows.note
    assert abs(qa.rows.n - real_qa) <= 0.1 * real_qa, (qa.rows.n, real_qa)
    assert corpus.spec is not None and corpus.nbytes == corpus.rows.n * corpus.row_bytes

    assert gone.rows.how == "unknown" and "run prepare/tokenize first" in gone.rows.note
    assert gone.spec is None and any("config.json not found" in n for n in gone.notes)
    assert p.total("nbytes") is None  # one item unknown: no total pretends to be one


def _tiny_config(**over):
    from transformers import BertConfig

    kw = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
              max_position_embeddings=64, attn_implementation="eager")
    kw.update(over)
    return BertConfig(**kw)


@pytest.mark.parametrize("head", ["base", "mlm", "classification", "qa"])
def test_forward_flops_and_parameters_equal_torchs_counts(head):
    """FlopCounterMode counts every matmul torch runs (eager attention); the MLM head runs at all L positions in
    transformers, so it is compared with masked = L. Parameters: the loaded model's own count (tied decoder once)."""
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    cls = {"base": transformers.BertModel, "mlm": transformers.BertForMaskedLM,
           "classification": transformers.BertForSequenceClassification,
           "qa": transformers.BertForQuestionAnswering}[head]
    labels = 2 if head == "qa" else 3  # a QA head has num_labels 2 (start, end)
    cfg = _tiny_config(num_labels=labels)
    as_json = json.loads(cfg.to_json_string())
    L = 24
    for layers in (2, 1):
        model = cls(_tiny_config(num_hidden_layers=layers, num_labels=labels)).eval()
        if head == "base":
            model.pooler = None  # the capture does not use it; BertModel skips a None pooler
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(input_ids=torch.randint(5, 97, (1, L)))
        expected = forward_flops(as_json, L, head, masked=L if head == "mlm" else 0, layers=layers)
        assert counter.get_total_flops() == expected, (head, layers)
    model = cls(cfg)
    assert teacher_params(as_json, head) == sum(p.numel() for p in model.parameters())


runner = CliRunner()


def test_cli_table_json_and_errors(repo, tmp_path, monkeypatch):
    monkeypatch.chdir(repo["root"])
    bench = tmp_path / "at_scale.json"
    bench.write_text(json.dumps(BENCH))
    res = runner.invoke(app, ["plan", "--params", str(repo["params"]), "--bench", str(bench)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split()[:2] == ["item", "rows"] and any(line.startswith("total") for line in lines)
    assert all(any(line.startswith(n) for line in lines) for n in ("toy_mlm", "toy_probs", "toy_cls"))
    assert "2026-11-25T15:00:00Z" in res.output and "H100 bf16 (assumed)" in res.output

    res = runner.invoke(app, ["plan", "--params", str(repo["params"]), "--bench", str(bench), "--json"])
    assert res.exit_code == 0
    out = json.loads(res.output)
    items = {i["name"]: i for i in out["items"]}
    built = repo["plan"]
    assert out["totals"]["bytes"] == built.total("nbytes") and out["totals"]["files"] == sum(
        i.files["total"] for i in built.items)
    mlm = items["toy_mlm"]
    disk = BENCH["disk"]["write_bytes_per_s"] / mlm["est_row_bytes"]
    host = BENCH["cores"] / (BENCH["host"]["cpu_s_per_byte"] * mlm["row_bytes"])
    compute = BENCH["forward"]["flops_per_s"] / mlm["flops_per_row"]
    assert mlm["rates"]["here"]["rows_per_s"] == pytest.approx(min(disk, host, compute))
    assert mlm["rates"]["here"]["seconds"] == pytest.approx(70 / min(disk, host, compute))

    res = runner.invoke(app, ["plan", "--params", str(repo["params"]), "--bench", str(tmp_path / "none.json")])
    assert res.exit_code == 0 and "python benchmarks/at_scale.py" in res.output

    # a checkout with the inputs but no stores yet, on a disk with 1 kB free
    fresh = tmp_path / "fresh"
    (fresh / "data").mkdir(parents=True)
    (fresh / "data" / "tokens").symlink_to(repo["root"] / "data" / "tokens")
    (fresh / "models").symlink_to(repo["root"] / "models")
    monkeypatch.chdir(fresh)
    monkeypatch.setattr(plan_mod.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 1000})())
    res = runner.invoke(app, ["plan", "--params", str(repo["params"]), "--bench", str(tmp_path / "none.json")])
    assert res.exit_code == 0 and "WARNING: the stores need" in res.output and "will not fit" in res.output
    assert "1.0 kB free on data" in res.output  # data/teacher does not exist: its nearest existing parent
    monkeypatch.chdir(repo["root"])

    bad = tmp_path / "bad.yaml"
    bad.write_text(repo["params"].read_text().replace(f"shard_rows: {SHARD}", "shard_rows: big"))
    res = runner.invoke(app, ["plan", "--params", str(bad)])
    assert res.exit_code == 2 and "teacher_cache.shard_rows: expected an integer" in res.output
    assert len(res.output.strip().splitlines()) == 1

    broken = dict(BENCH, forward={"measured_on": "x"})
    bench.write_text(json.dumps(broken))
    res = runner.invoke(app, ["plan", "--params", str(repo["params"]), "--bench", str(bench)])
    assert res.exit_code == 2 and "forward.flops_per_s" in res.output


def test_plan_says_when_the_live_teacher_beats_reading_the_cache(repo, tmp_path, monkeypatch):
    """On the GPU box a student reads a cache at min(disk read / bytes a row, cores left / loader CPU a row); the
    live teacher makes gpu FLOP/s / FLOPs a row. Where live wins, one line says so with both rates."""
    monkeypatch.chdir(repo["root"])
    bench = tmp_path / "at_scale.json"
    for read, slow in ((1e15, False), (2e3, True)):
        bench.write_text(json.dumps({**BENCH, "disk": {**BENCH["disk"], "read_bytes_per_s": read},
                                     "loader": {"cpu_s_per_byte": 1e-12}}))
        res = runner.invoke(app, ["plan", "--params", str(repo["params"]), "--bench", str(bench), "--json"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        for item in out["items"]:
            if item["flops_per_row"] is None:
                continue
            cached = min(read / item["est_row_bytes"], 14 / (1e-12 * item["est_row_bytes"]))
            live = BENCH["gpu"]["flops_per_s"] / item["flops_per_row"]
            assert item["reading"]["cached_rows_per_s"] == pytest.approx(cached)
            assert item["reading"]["live_rows_per_s"] == pytest.approx(live)
            said = [w for w in out["warnings"] if w.startswith(f"{item['name']}: on the GPU box the live teacher")]
            assert len(said) == (live > cached) == slow, (item["name"], said)
            if said:
                assert f"({live:,.0f} rows/s)" in said[0] and f"({cached:,.0f} rows/s, disk-bound)" in said[0]
    res = runner.invoke(app, ["plan", "--params", str(repo["params"]), "--bench", str(bench)])
    assert "WARNING: toy_mlm: on the GPU box the live teacher" in res.output


def test_plan_gives_each_run_its_faster_source_and_the_command_to_switch(repo, tmp_path, monkeypatch):
    """Per train/finetune run: the teacher's share of a step from the cache and run live, here (the benchmark's
    FLOP/s and cores) and on the GPU box, by the same formula as the items' reading; where the other source is
    faster on the GPU box, the warning gives the one `dvc exp run -S` that switches the run."""
    import yaml

    monkeypatch.chdir(repo["root"])
    params = yaml.safe_load(repo["params"].read_text())
    params["train"] = {"runs": {
        "a": {"dataset": "toy_mlm", "teacher": "data/teacher/toy_mlm.zarr", "optim": {"batch_size": 32}},
        "b": {"dataset": "toy_mlm", "teacher": "data/teacher/toy_mlm.zarr", "optim": {"batch_size": 8}}}}
    params["finetune"] = {"runs": {
        "c": {"dataset": "toy_cls", "teacher": "models/teacher/clf", "optim": {"batch_size": 16}},
        "gone": {"dataset": "no_such_cache", "teacher": "data/teacher/no_such_cache.zarr", "optim": {"batch_size": 4}}}}
    path = write_params(tmp_path / "params.yaml", params)
    bench = tmp_path / "at_scale.json"
    bench.write_text(json.dumps({**BENCH, "disk": {**BENCH["disk"], "read_bytes_per_s": 2e4},
                                 "loader": {"cpu_s_per_byte": 1e-12}}))
    res = runner.invoke(app, ["plan", "--params", str(path), "--bench", str(bench), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    items = {i["name"]: i for i in out["items"]}
    runs = {r["name"]: r for r in out["runs"]}
    assert list(runs) == ["a", "b", "c"]  # a run of a dataset without a cache entry has nothing to plan
    for r in runs.values():
        item = items[r["dataset"]]
        for where, flops, cores in (("here", BENCH["forward"]["flops_per_s"], BENCH["cores"]),
                                    ("gpu", BENCH["gpu"]["flops_per_s"], BENCH["gpu"]["projection_cores"])):
            live = flops / item["flops_per_row"]
            cached = min(2e4 / item["est_row_bytes"], max(1, cores - 2) / (1e-12 * item["est_row_bytes"]))
            assert r["rates"][where]["live_rows_per_s"] == pytest.approx(live)
            assert r["rates"][where]["cached_rows_per_s"] == pytest.approx(cached)
            assert r["step_seconds"][where] == pytest.approx({"cache": r["batch_size"] / cached,
                                                              "live": r["batch_size"] / live})
            assert r["faster"][where] == ("live" if live > cached else "cache")
    assert runs["a"]["faster"]["gpu"] == "live" and not runs["a"]["live"]  # 20 kB/s of disk: reading loses
    said = [w for w in out["warnings"] if w.startswith("toy_mlm: on the GPU box the live teacher")]
    assert said and said[0].endswith("switch the runs that read it with dvc exp run -S "
                                      "'train.runs.a.teacher=models/teacher/mlm' -S "
                                      "'train.runs.b.teacher=models/teacher/mlm'")
    # the classification cache (a few bytes a row) reads faster than any forward: the live run is told to switch back
    fast = tmp_path / "fast.json"
    fast.write_text(json.dumps({**BENCH, "disk": {**BENCH["disk"], "read_bytes_per_s": 1e15},
                                "loader": {"cpu_s_per_byte": 1e-12}}))
    res = runner.invoke(app, ["plan", "--params", str(path), "--bench", str(fast)])
    assert res.exit_code == 0, res.output
    assert ("WARNING: finetune.runs.c: runs its teacher live, but on the GPU box reading toy_cls's cache is faster"
            in res.output and "dvc exp run -S 'finetune.runs.c.teacher=data/teacher/toy_cls.zarr'" in res.output)
    assert "finetune.c" in res.output and "student runs:" in res.output
