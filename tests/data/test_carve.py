"""Carving dev/test out of train by groups, on the real-format GLUE and SQuAD samples: no carved row shares its
group (sentence, article) with a train row, checked against naive set intersections; seeded; and the configs in
which one set of rows would both select the model and be reported are refused."""

import json

import pytest

from distillpipe.config.base import ConfigError, build
from distillpipe.config.prepare import LocalGlueConfig, LocalSquadConfig
from distillpipe.data.prepare import prepare_dataset
from distillpipe.data.sources import PrepareError, build_source

CARVE = {"dev": 0.1, "test": 0.0, "seed": 0}


def glue(task, folder, files, carve=CARVE):
    return build(LocalGlueConfig, {"format": "glue", "task": task, "path": str(folder), "files": files,
                                   "encoding": "utf-8", "on_bad_rows": "error", "carve": carve}, "prepare.local.x")


def norm(text):
    return " ".join(text.split()).lower()


def test_sst2_dev_carved_from_train_official_dev_as_test(shared_data):
    folder = shared_data / "glue" / "SST-2"
    whole = build_source("sst2", glue("sst2", folder, {"train": "train.tsv"}, carve=None)).splits["train"]
    p = build_source("sst2", glue("sst2", folder, {"train": "train.tsv", "test": "dev.tsv"}))
    assert list(p.splits) == ["train", "dev", "test"]
    train, dev = p.splits["train"], p.splits["dev"]
    assert len(train) + len(dev) == len(whole) and 0.08 * len(whole) < len(dev) < 0.12 * len(whole)
    assert not {norm(t) for t in dev["text_a"]} & {norm(t) for t in train["text_a"]}
    assert sorted(list(train["id"]) + list(dev["id"])) == sorted(whole["id"])  # nothing lost, nothing doubled
    assert len(p.splits["test"]) == 500  # the official dev file, untouched
    again = build_source("sst2", glue("sst2", folder, {"train": "train.tsv", "test": "dev.tsv"}))
    assert list(again.splits["dev"]["id"]) == list(dev["id"])  # seeded
    other = build_source("sst2", glue("sst2", folder, {"train": "train.tsv", "test": "dev.tsv"},
                                      carve={**CARVE, "seed": 1}))
    assert list(other.splits["dev"]["id"]) != list(dev["id"])


def test_mrpc_pairs_sharing_a_sentence_stay_together(shared_data):
    folder = shared_data / "glue" / "MRPC"
    p = build_source("mrpc", glue("mrpc", folder, {"train": "train.tsv"}, carve={"dev": 0.15, "test": 0.15,
                                                                                   "seed": 3}))
    sides = {s: {norm(t) for t in d["text_a"]} | {norm(t) for t in d["text_b"]} for s, d in p.splits.items()}
    assert all(len(p.splits[s]) > 100 for s in ("train", "dev", "test"))
    assert not sides["train"] & sides["dev"] and not sides["train"] & sides["test"] and not sides["dev"] & sides["test"]


def test_squad_carved_by_article(shared_data):
    src = shared_data / "squad_v2" / "train-sample.json"
    titles = [a["title"] for a in json.loads(src.read_text())["data"]]
    cfg = build(LocalSquadConfig, {"format": "squad", "path": str(src.parent), "files": {"train": src.name},
                                   "encoding": "utf-8", "carve": {"dev": 0.2, "test": 0.2, "seed": 0}},
                "prepare.local.sq")
    p = build_source("sq", cfg)
    seen = {s: set(d["title"]) for s, d in p.splits.items()}
    assert seen["dev"] and seen["test"] and not (seen["train"] & seen["dev"] or seen["train"] & seen["test"]
                                                 or seen["dev"] & seen["test"])
    assert set().union(*seen.values()) == set(titles)


def test_refused_configs(shared_data, tmp_path):
    folder = shared_data / "glue" / "SST-2"
    with pytest.raises(ConfigError, match="dev is given .* and carved from train"):
        glue("sst2", folder, {"train": "train.tsv", "dev": "dev.tsv"})
    with pytest.raises(ConfigError, match="splits 'dev' and 'test' both read 'dev.tsv'"):
        glue("sst2", folder, {"train": "train.tsv", "dev": "dev.tsv", "test": "dev.tsv"}, carve=None)
    # the README's old recipe: the official dev would both select the model and be the reported score
    with pytest.raises(PrepareError, match="has a dev split but no test split.*carve"):
        prepare_dataset("sst2", glue("sst2", folder, {"train": "train.tsv", "dev": "dev.tsv"}, carve=None),
                        tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(PrepareError, match="too few to carve"):
        tiny = tmp_path / "tiny"
        tiny.mkdir()
        (tiny / "train.tsv").write_text("sentence\tlabel\nthe same words\t1\nThe  same words\t0\n")
        build_source("t", glue("sst2", tiny, {"train": "train.tsv"}))
