"""Carving dev/test out of train by groups, on the real-format GLUE and SQuAD samples and on phrase-structured
fixtures: no carved row's text equals, or sits inside, a text of another split, checked by brute force (every pair
of rows, whole words); seeded; and the configs in which one set of rows would both select the model and be reported
are refused."""

import json
import random
import re

import pytest
from datasets import Dataset

from distillpipe.config.base import ConfigError, build
from distillpipe.config.prepare import CarveConfig, LocalGlueConfig, LocalSquadConfig
from distillpipe.data import schema
from distillpipe.data.prepare import prepare_dataset
from distillpipe.data.sources import PrepareError, build_source
from distillpipe.data.sources.base import Prepared
from distillpipe.data.sources.carve import carve_splits

CARVE = {"dev": 0.1, "test": 0.0, "seed": 0}


def glue(task, folder, files, carve=CARVE):
    return build(LocalGlueConfig, {"format": "glue", "task": task, "path": str(folder), "files": files,
                                   "encoding": "utf-8", "on_bad_rows": "error", "carve": carve}, "prepare.local.x")


def norm(text):
    return " ".join(text.split()).lower()


def padded(text):
    """Whole-word form for substring tests: ' a good film . ' (punctuation split off, lowercased)."""
    return " " + " ".join(re.sub(r"([^\w\s])", r" \1 ", text.lower()).split()) + " "


def held_out_leaks(splits, columns):
    """(held-out split, its text, the other split) for every dev/test text equal to or inside a text of another
    split: brute force over every pair of texts."""
    texts = {s: {padded(t) for c in columns for t in d[c] if t.strip()} for s, d in splits.items()}
    return [(s, t, o) for s in texts if s != "train" for t in texts[s] for o in texts if o != s
            if any(t in u for u in texts[o])]


def exact_group_carve(rows, fraction, seed):
    """Carving as it was before containment: groups of identical (normalised) text, a seeded fraction to dev."""
    groups = list(dict.fromkeys(norm(r) for r in rows))
    random.Random(seed).shuffle(groups)
    dev = set(groups[: round(fraction * len(groups))])
    return {"train": {"text_a": [r for r in rows if norm(r) not in dev]},
            "dev": {"text_a": [r for r in rows if norm(r) in dev]}}


def phrases(n_sentences, seed, vocab=300, per_sentence=6):
    """SST-2's layout: sentences and contiguous phrases cut from them, a few sentences sharing common phrases."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n_sentences):
        words = [f"w{rng.randrange(vocab)}" for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words[1:1] = ["the", "film", "is"]  # a phrase inside many unrelated sentences
        rows.append(" ".join(words) + " .")
        for _ in range(per_sentence):
            i = rng.randrange(len(words))
            rows.append(" ".join(words[i: rng.randint(i + 1, len(words))]))
    return rows


def carve_rows(columns, task_type="classification", **fractions):
    ds = Dataset.from_dict({"id": [str(i) for i in range(len(columns["text_a"]))], **columns,
                           "label": [0] * len(columns["text_a"])})
    prepared = Prepared({"train": ds}, task_type, ["x"], list(columns))
    return carve_splits("t", prepared, CarveConfig(dev=fractions.get("dev", 0.0), test=fractions.get("test", 0.0),
                                                    seed=fractions.get("seed", 0))).splits


def test_phrase_fixture_leaks_by_identical_text_and_not_by_containment():
    rows = phrases(150, seed=0)
    old = exact_group_carve(rows, 0.2, seed=0)
    assert len(held_out_leaks(old, ["text_a"])) > 50  # today's rule: dev phrases inside train sentences
    for seed in range(3):
        new = carve_rows({"text_a": rows}, dev=0.2, seed=seed)
        assert held_out_leaks(new, ["text_a"]) == []
        assert 0.1 * len(rows) < len(new["dev"]) < 0.3 * len(rows)
        assert sorted(new["train"]["id"][:] + new["dev"]["id"][:], key=int) == [str(i) for i in range(len(rows))]


def test_pairs_tied_by_phrases_dev_and_test():
    """Pair rows tie texts together (a phrase as one sentence, an unrelated one as the other): the last pass moves
    groups back to train until no held-out text is inside a text of another split, dev and test both carved."""
    rows = phrases(120, seed=1)
    rng = random.Random(1)
    other = [rng.choice(rows) if rng.random() < 0.05 else f"x{i} y{i % 7} z" for i in range(len(rows))]
    for seed in range(3):
        new = carve_rows({"text_a": rows, "text_b": other}, dev=0.15, test=0.15, seed=seed)
        assert held_out_leaks(new, ["text_a", "text_b"]) == []
        assert len(new["dev"]) > 0 and len(new["test"]) > 0


def test_sst2_dev_carved_from_train_official_dev_as_test(shared_data):
    folder = shared_data / "glue" / "SST-2"
    whole = build_source("sst2", glue("sst2", folder, {"train": "train.tsv"}, carve=None)).splits["train"]
    p = build_source("sst2", glue("sst2", folder, {"train": "train.tsv", "test": "dev.tsv"}))
    assert list(p.splits) == ["train", "dev", "test"]
    train, dev = p.splits["train"], p.splits["dev"]
    assert len(train) + len(dev) == len(whole) and 0.08 * len(whole) < len(dev) < 0.12 * len(whole)
    assert not {norm(t) for t in dev["text_a"]} & {norm(t) for t in train["text_a"]}
    assert held_out_leaks(p.splits, ["text_a"]) == [] or {s for s, _, _ in held_out_leaks(p.splits, ["text_a"])} == {
        "test"}  # the official dev (our test) is a file: carving does not change it
    assert sorted(list(train["id"]) + list(dev["id"])) == sorted(whole["id"])  # nothing lost, nothing doubled
    assert len(p.splits["test"]) == 500  # the official dev file, untouched
    again = build_source("sst2", glue("sst2", folder, {"train": "train.tsv", "test": "dev.tsv"}))
    assert list(again.splits["dev"]["id"]) == list(dev["id"])  # seeded
    other = build_source("sst2", glue("sst2", folder, {"train": "train.tsv", "test": "dev.tsv"},
                                      carve={**CARVE, "seed": 1}))
    assert list(other.splits["dev"]["id"]) != list(dev["id"])


def test_sst2_sample_prepared_leakage_report(shared_data, tmp_path):
    """The shared SST-2 sample (phrases of sentences): identical-text groups put dev phrases inside train rows;
    prepare's carve does not, and the leakage report in meta.json counts what brute force counts."""
    folder = shared_data / "glue" / "SST-2"
    rows = build_source("sst2", glue("sst2", folder, {"train": "train.tsv"}, carve=None)).splits["train"]["text_a"]
    assert len(held_out_leaks(exact_group_carve(rows, 0.1, seed=0), ["text_a"])) > 10
    summary = prepare_dataset("sst2", glue("sst2", folder, {"train": "train.tsv", "test": "dev.tsv"}), tmp_path / "p")
    meta = schema.read_meta(tmp_path / "p")
    from datasets import load_from_disk
    splits = dict(load_from_disk(str(tmp_path / "p")))
    texts = {s: [padded(t) for t in d["text_a"]] for s, d in splits.items()}
    for pair in meta["leakage"]["pairs"]:
        a, b = pair["splits"]
        exact = sum(t in set(texts[a]) for t in texts[b])
        inside = sum(t not in set(texts[a]) and any(t in u for u in texts[a]) for t in texts[b])
        assert (pair["exact"], pair["inside"], pair["rows"]) == (exact, inside, len(texts[b])), pair
    by_pair = {tuple(p["splits"]): p for p in meta["leakage"]["pairs"]}
    assert by_pair["train", "dev"]["exact"] == by_pair["train", "dev"]["inside"] == 0
    assert summary.leakage == meta["leakage"] and "train -> dev: 0 equal / 0 inside" in summary.overlap_line()


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
