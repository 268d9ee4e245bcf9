"""Hub source: offline failure within seconds, name resolution, and the column mapping applied to
in-memory datasets shaped like the hub's (no download is possible here)."""

import time

import pytest
import yaml
from datasets import ClassLabel, Dataset, Features, List, Value

from distillpipe.config.base import build
from distillpipe.config.prepare import HubConfig, LocalDatasetConfig
from distillpipe.data.features import FEATURES
from distillpipe.data.sources import PrepareError, build_source
from distillpipe.data.sources.base import Skips
from distillpipe.data.sources.hub import map_hub_split, resolve


def hub(name, subset=None, text_field="text", splits=None, carve=None):
    return build(HubConfig, dict(source="hub", name=name, subset=subset, revision=None,
                                 splits=splits or {"train": "train"}, text_field=text_field, carve=carve),
                 "prepare.datasets.h")


@pytest.mark.parametrize("name, snippet", [
    ("glue/sst2", "format: glue\n      task: sst2\n      path: data/raw/SST-2\n"
                  "      files: {train: train.tsv, test: dev.tsv}"),
    ("glue/mnli", "test_matched: dev_matched.tsv, test_mismatched: dev_mismatched.tsv"),
    ("squad_v2", "format: squad"),
    ("wikimedia/wikipedia", "format: jsonl"),
])
def test_offline_fails_fast_with_local_snippet(name, snippet, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(PrepareError) as err:
        build_source("mine", hub(name, subset="20231101.en" if "wiki" in name else None))
    assert time.perf_counter() - start < 10
    msg = str(err.value)
    assert "prepare.datasets.mine" in msg and "hub is unreachable" in msg and "_OFFLINE is set" in msg
    assert "  local:\n    mine:\n      format:" in msg and snippet in msg
    # the snippet is valid params as pasted (GLUE/SQuAD: dev carved from train, the official dev as test)
    entry = yaml.safe_load(msg[msg.index("prepare:"):])["prepare"]["local"]["mine"]
    cfg = build(LocalDatasetConfig, entry, "prepare.local.mine")
    assert (cfg.carve is not None) == (entry["format"] in ("glue", "squad"))


@pytest.mark.parametrize("name, subset, expected", [
    ("glue/sst2", None, ("glue:sst2", "nyu-mll/glue", "sst2")),
    ("nyu-mll/glue", "mnli", ("glue:mnli", "nyu-mll/glue", "mnli")),
    ("glue", "rte", ("glue:rte", "nyu-mll/glue", "rte")),
    ("squad", None, ("squad", "rajpurkar/squad", None)),
    ("rajpurkar/squad_v2", None, ("squad", "rajpurkar/squad_v2", None)),
    ("wikimedia/wikipedia", "20231101.en", ("corpus", "wikimedia/wikipedia", "20231101.en")),
])
def test_resolve(name, subset, expected):
    assert resolve(hub(name, subset)) == expected


def test_resolve_unknown_glue_task():
    with pytest.raises(PrepareError, match="unknown GLUE task"):
        resolve(hub("glue/sst5"))


def test_map_glue_pair_task():
    ds = Dataset.from_dict(
        {"premise": ["A man sleeps.", "A dog runs."], "hypothesis": ["A man rests.", "A cat runs."],
         "label": [0, -1], "idx": [7, 8]},
        features=Features({"premise": Value("string"), "hypothesis": Value("string"),
                           "label": ClassLabel(names=["entailment", "neutral", "contradiction"]),
                           "idx": Value("int32")}),
    )
    out = map_hub_split("glue:mnli", ds, hub("glue/mnli"), Skips())
    assert out.features == FEATURES["classification"]
    assert out.to_list() == [
        {"id": "7", "text_a": "A man sleeps.", "text_b": "A man rests.", "label": 0},
        {"id": "8", "text_a": "A dog runs.", "text_b": "A cat runs.", "label": -1},
    ]


def test_map_glue_single_and_regression():
    sst = Dataset.from_dict({"sentence": ["good film"], "label": [1], "idx": [0]},
                            features=Features({"sentence": Value("string"),
                                               "label": ClassLabel(names=["negative", "positive"]),
                                               "idx": Value("int32")}))
    out = map_hub_split("glue:sst2", sst, hub("glue/sst2"), Skips())
    assert (out.features == FEATURES["classification_single"]
            and out[0] == {"id": "0", "text_a": "good film", "label": 1})
    sts = Dataset.from_dict({"sentence1": ["a"], "sentence2": ["b"], "label": [3.8], "idx": [4]})
    out = map_hub_split("glue:stsb", sts, hub("glue/stsb"), Skips())
    assert out.features == FEATURES["regression"] and out[0]["label"] == pytest.approx(3.8)


def test_map_glue_label_order_mismatch_is_refused():
    ds = Dataset.from_dict({"sentence": ["x"], "label": [0], "idx": [0]},
                           features=Features({"sentence": Value("string"),
                                              "label": ClassLabel(names=["positive", "negative"]),
                                              "idx": Value("int32")}))
    with pytest.raises(PrepareError, match="label names"):
        map_hub_split("glue:sst2", ds, hub("glue/sst2"), Skips())


def test_map_squad():
    ds = Dataset.from_dict(
        {"id": ["a", "b"], "title": ["T", "T"], "context": ["Paris is big.", "Paris is big."],
         "question": ["What is big?", "Who?"],
         "answers": [{"text": ["Paris"], "answer_start": [0]}, {"text": [], "answer_start": []}]},
        features=Features({"id": Value("string"), "title": Value("string"), "context": Value("string"),
                           "question": Value("string"),
                           "answers": {"text": List(Value("string")), "answer_start": List(Value("int32"))}}),
    )
    out = map_hub_split("squad", ds, hub("squad_v2"), Skips())
    assert out.features == FEATURES["qa"] and out[1]["answers"] == {"text": [], "answer_start": []}


def test_map_corpus_counts_empty_documents():
    ds = Dataset.from_dict({"id": ["12", "13", "14"], "title": ["A", "B", "C"],
                            "text": ["Alpha text.", "  ", "Gamma."]})
    skips = Skips()
    out = map_hub_split("corpus", ds, hub("wikimedia/wikipedia", "20231101.en"), skips)
    assert out.to_list() == [{"doc_id": "12", "text": "Alpha text."}, {"doc_id": "14", "text": "Gamma."}]
    assert skips.as_dict() == {"empty documents": 1}
    with pytest.raises(PrepareError, match=r"no column 'body'"):
        map_hub_split("corpus", ds, hub("x/y", text_field="body"), Skips())
