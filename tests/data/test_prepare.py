"""prepare_dataset: the on-disk contract (DatasetDict + meta.json), atomic replacement,
byte-identical reruns and the one-line summary; plus the embedded defaults of params.yaml."""

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest
from datasets import load_from_disk

from distillpipe.config.base import build, load_section
from distillpipe.config.prepare import EmbeddedPolarityConfig, LocalGlueConfig, PrepareConfig
from distillpipe.data import schema
from distillpipe.data.features import FEATURES
from distillpipe.data.prepare import PrepareError, PrepareSummary, prepare_dataset

REPO = Path(__file__).resolve().parents[2]


def polarity_cfg(seed=0):
    return build(EmbeddedPolarityConfig, dict(source="embedded", asset="polarity", encoding="cp1252",
                                              splits=dict(dev=0.2, test=0.1), seed=seed), "prepare.datasets.polarity")


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_one_line():
    s = PrepareSummary("wiki", {"train": 3500, "dev": 412}, {"short paragraphs": 41}, 1.94)
    assert s.one_line() == "prepare wiki: 3,912 rows (train 3,500 / dev 412), skipped 41 short paragraphs, 1.9 s"
    s = PrepareSummary("p", {"train": 2}, {}, 0.04)
    assert s.one_line() == "prepare p: 2 rows (train 2), skipped nothing, 0.0 s"


def test_writes_dataset_dict_and_meta(tmp_path):
    cfg = polarity_cfg()
    out = tmp_path / "prepared" / "polarity"
    summary = prepare_dataset("polarity", cfg, out)
    assert summary.rows == {"train": 140, "dev": 40, "test": 20} and summary.skipped == {}
    assert re.fullmatch(r"prepare polarity: 200 rows \(train 140 / dev 40 / test 20\), skipped nothing, \d+\.\d s",
                        summary.one_line())
    dd = load_from_disk(str(out))
    assert list(dd) == ["train", "dev", "test"]
    assert dd["train"].features == FEATURES["classification_single"]
    meta = schema.read_meta(out)
    assert meta == {
        "name": "polarity",
        "task_type": "classification",
        "num_labels": 2,
        "label_names": ["neg", "pos"],
        "text_fields": ["text_a"],
        "source": json.loads(json.dumps(dataclasses.asdict(cfg))),
        "summary": {"rows": {"train": 140, "dev": 40, "test": 20}, "skipped": {}},
        "leakage": {"words": r"\w+|[^\w\s]", "ngram": 8, "ngram_fraction": 0.5, "warn_fraction": 0.01, "pairs": [
            {"splits": [a, b], "rows": n, "exact": 0, "inside": 0, "ngram": 0, "example": None}
            for a, b, n in (("train", "dev", 40), ("train", "test", 20), ("dev", "test", 20))]},
    }
    assert sorted(p.name for p in out.parent.iterdir()) == ["polarity"]  # no partial/old folders left


def test_rerun_is_byte_identical_and_replaces_previous_output(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    prepare_dataset("polarity", polarity_cfg(), a)
    prepare_dataset("polarity", polarity_cfg(), b)
    assert tree_digest(a) == tree_digest(b)
    (a / "stale.txt").write_text("from an older run")
    (tmp_path / ".a.partial").mkdir()  # what a killed run leaves
    prepare_dataset("polarity", polarity_cfg(seed=1), a)
    assert not (a / "stale.txt").exists() and not (tmp_path / ".a.partial").exists()
    assert tree_digest(a) != tree_digest(b)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_failed_build_leaves_previous_output_untouched(tmp_path):
    out = tmp_path / "rte"
    prepare_dataset("rte", polarity_cfg(), out)
    before = tree_digest(out)
    bad = tmp_path / "bad.tsv"
    bad.write_text("index\tsentence1\tsentence2\tlabel\n0\tonly two\tcolumns\n", encoding="utf-8")
    cfg = build(LocalGlueConfig, dict(format="glue", task="rte", path=str(tmp_path), files={"train": "bad.tsv"},
                                      encoding="utf-8", on_bad_rows="error", carve=None), "prepare.local.rte")
    with pytest.raises(PrepareError, match=r"bad\.tsv:2:"):
        prepare_dataset("rte", cfg, out)
    assert tree_digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tsv", "rte"]


def test_params_yaml_embedded_datasets(tmp_path):
    """Every dataset of the default params.yaml prepares offline and meets the schema."""
    cfg = load_section(REPO / "params.yaml", "prepare", PrepareConfig)
    expected = {"wiki": ("corpus", ["train", "dev", "test"]),
                "polarity": ("classification", ["train", "dev", "test"]),
                "wiki_pairs": ("classification", ["train", "dev", "test"]), "wiki_qa": ("qa", ["train", "dev", "test"]),
                "wiki_mini": ("corpus", ["train", "dev", "test"])}
    assert set(cfg.datasets) == set(expected)
    for name, ds_cfg in cfg.datasets.items():
        summary = prepare_dataset(name, ds_cfg, tmp_path / name, cfg.wiki_articles)
        meta = schema.read_meta(tmp_path / name)
        task_type, splits = expected[name]
        assert meta["task_type"] == task_type and list(summary.rows) == splits
        assert all(n > 0 for n in summary.rows.values())
        dd = load_from_disk(str(tmp_path / name))
        assert {s: len(d) for s, d in dd.items()} == summary.rows
        for field in meta["text_fields"]:
            assert field in dd["train"].column_names
    _no_dev_or_test_text_is_trained_on(tmp_path, cfg)


def _no_dev_or_test_text_is_trained_on(prepared, cfg):
    """No transductive leak across the embedded datasets: no paragraph or sentence of any dev/test split is in
    a text any student, teacher or the QG model trains on (every train split; the paragraphs augment writes
    questions for), and no dev/test article of a task is an article of a training corpus."""
    from distillpipe.config.augment import AugmentConfig
    from distillpipe.qg.paragraphs import select_paragraphs

    fields = {"wiki": ["text"], "polarity": ["text_a"], "wiki_pairs": ["text_a", "text_b"], "wiki_qa": ["context"]}
    trained, held_out = set(), set()
    trained_titles, held_out_titles = set(), set()
    for name, columns in fields.items():
        dd = load_from_disk(str(prepared / name))
        for split, ds in dd.items():
            texts = {t.strip() for c in columns for t in ds[c]}
            (trained if split == "train" else held_out).update(texts)
            titles = set(ds["doc_id"] if "doc_id" in ds.column_names else ds["title"] if "title" in ds.column_names
                         else [])
            (trained_titles if split == "train" else held_out_titles).update(titles)
    augment = load_section(REPO / "params.yaml", "augment", AugmentConfig)
    paragraphs, _ = select_paragraphs(prepared / "wiki", prepared / "wiki_qa", augment)
    trained |= {p.text.strip() for p in paragraphs}
    trained_titles |= {p.doc_id for p in paragraphs}
    assert len(held_out) > 500 and len(trained) > 2000
    assert not trained & held_out, sorted(trained & held_out)[:3]
    assert not trained_titles & held_out_titles, sorted(trained_titles & held_out_titles)[:5]
