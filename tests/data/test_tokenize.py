"""tokenize_dataset end to end on tiny prepared datasets: MLM and classification formats, the
fingerprint, determinism, and the errors a user can hit. QA windows: test_qa_windows.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset, DatasetDict, Features, List, Value, load_from_disk

from distillpipe.assets import load_tokenizer, resolve_model
from distillpipe.config.tokenize import (
    TokenizeClassificationConfig,
    TokenizeConfig,
    TokenizeMLMConfig,
    TokenizeQAConfig,
)
from distillpipe.data import schema
from distillpipe.data.tokenize import TokenizeError, tokenize_dataset

SPEC = "embedded:minilm-l6"

DOCS = {
    "d1": ["Anarchism is a political philosophy that advocates self-governed societies based on voluntary "
           "institutions. These are often described as stateless societies.",
           "The term anarchism derives from the ancient Greek anarchia, meaning without a ruler."],
    "d2": ["Autism is a disorder of neural development characterized by impaired social interaction "
           "and verbal and non-verbal communication \u2603 and by restricted, repetitive behavior.",
           "Parents usually notice signs in the first two years of their child's life.",
           "These signs often develop gradually."],
    "d3": ["Albedo, or reflection coefficient, is the diffuse reflectivity or reflecting power of a surface."],
}
DEV_DOCS = {"d9": ["Abraham Lincoln was the sixteenth President of the United States, serving from March 1861 "
                   "until his assassination in April 1865."]}


def write_prepared(path: Path, task_type: str, splits: dict[str, dict], features: Features | None = None,
                   **meta) -> Path:
    DatasetDict({k: Dataset.from_dict(v, features=features) for k, v in splits.items()}).save_to_disk(str(path))
    schema.write_meta(path, {"name": path.name, "task_type": task_type, **meta})
    return path


def corpus(docs: dict[str, list[str]]) -> dict[str, list]:
    return {"doc_id": [d for d, ps in docs.items() for _ in ps], "text": [p for ps in docs.values() for p in ps]}


def mlm_cfg(max_seq_len: int = 32, **kw) -> TokenizeConfig:
    args = dict(mask_views=2, mask_prob=0.15, mask_token_fraction=0.8, random_token_fraction=0.1, seed=0,
                max_eval_blocks=None) | kw
    return TokenizeConfig(SPEC, max_seq_len, {"wiki": TokenizeMLMConfig(kind="mlm", max_seq_len=None, **args)})


def cls_cfg(max_seq_len: int = 24) -> TokenizeConfig:
    return TokenizeConfig(SPEC, max_seq_len, {"pairs": TokenizeClassificationConfig("classification", None),
                                              "sent": TokenizeClassificationConfig("classification", None),
                                              "sts": TokenizeClassificationConfig("classification", None)})


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(SPEC)[0]


@pytest.fixture
def wiki(tmp_path) -> Path:
    return write_prepared(tmp_path / "prepared" / "wiki", "corpus", {"train": corpus(DOCS), "dev": corpus(DEV_DOCS)})


def arrow_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.arrow"))}


# --------------------------------------------------------------------------------------------
# MLM
# --------------------------------------------------------------------------------------------


def test_mlm_blocks_pack_the_corpus_and_views_are_recoverable(wiki, tmp_path, tok):
    out = tmp_path / "tokens" / "wiki"
    summary = tokenize_dataset("wiki", wiki, mlm_cfg(32), out)
    dd = load_from_disk(str(out))
    assert list(dd) == ["train", "dev"]
    special = set(tok.all_special_ids)
    for split, docs in (("train", DOCS), ("dev", DEV_DOCS)):
        ds = dd[split].with_format(None)
        assert ds.features == Features({
            "input_ids": List(Value("int32")), "token_type_ids": List(Value("int8")), "length": Value("int32"),
            "block_id": Value("int64"), "view": Value("int32"), "masked_positions": List(Value("int32")),
            "masked_labels": List(Value("int32"))})
        rows = ds.to_list()
        # Reference stream: each document's paragraphs tokenized alone, documents joined by [SEP].
        stream = []
        for paragraphs in docs.values():
            if stream:
                stream.append(tok.sep_token_id)
            for p in paragraphs:
                stream += tok(p, add_special_tokens=False)["input_ids"]
        originals = {}
        for r in rows:
            ids = np.array(r["input_ids"])
            ids[r["masked_positions"]] = r["masked_labels"]
            originals.setdefault(r["block_id"], []).append(ids.tolist())
            assert r["length"] == len(r["input_ids"]) == len(r["token_type_ids"]) and not any(r["token_type_ids"])
            assert r["masked_positions"] == sorted(set(r["masked_positions"])) and r["masked_positions"]
            assert not special & {ids[p] for p in r["masked_positions"]}  # never a special token
            n_maskable = sum(t not in special for t in ids)
            assert len(r["masked_positions"]) == max(1, int(np.floor(0.15 * n_maskable + 0.5)))
        assert [r["view"] for r in rows] == [0, 1] * (len(rows) // 2)
        assert sorted(originals) == list(range(len(originals)))
        blocks = []
        for b in range(len(originals)):
            assert originals[b][0] == originals[b][1]  # both views mask the same block
            blocks.append(originals[b][0])
        assert all(len(b) == 32 for b in blocks[:-1]) and len(blocks[-1]) <= 32
        assert all(b[0] == tok.cls_token_id and b[-1] == tok.sep_token_id for b in blocks)
        assert [t for b in blocks for t in b[1:-1]] == stream
        # The two views of a block differ (same positions for all blocks would mean a seeding bug).
        assert sum(rows[2 * i]["masked_positions"] != rows[2 * i + 1]["masked_positions"]
                   for i in range(len(blocks))) >= len(blocks) - 1
    assert tok.unk_token_id in [t for r in dd["train"]["input_ids"] for t in r]  # the snowman
    assert summary.rows == {"train": len(dd["train"]), "dev": len(dd["dev"])}
    assert summary.windows == (len(dd["train"]) + len(dd["dev"])) // 2 and summary.views == 2
    n = summary.windows
    assert summary.one_line().startswith(f"tokenize wiki: {2 * n:,} rows ({n:,} blocks x 2 views), 0 truncated, ")


def test_mlm_output_is_byte_identical_across_runs_and_batch_sizes(wiki, tmp_path):
    a, b, c = (tmp_path / n for n in ("a", "b", "c"))
    tokenize_dataset("wiki", wiki, mlm_cfg(), a)
    tokenize_dataset("wiki", wiki, mlm_cfg(), b)
    tokenize_dataset("wiki", wiki, mlm_cfg(), c, batch_size=1)
    assert arrow_bytes(a) and arrow_bytes(a) == arrow_bytes(b) == arrow_bytes(c)
    assert (a / "meta.json").read_bytes() == (b / "meta.json").read_bytes()
    # every file, datasets' state.json included: a folder's bytes (DVC's md5 of it) must not depend on its path,
    # or a re-run in another checkout would make every downstream stage re-run for nothing
    files = sorted(f.relative_to(a) for f in a.rglob("*") if f.is_file())
    assert files == sorted(f.relative_to(b) for f in b.rglob("*") if f.is_file())
    assert [(a / f).read_bytes() for f in files] == [(b / f).read_bytes() for f in files]
    for split in ("train", "dev"):
        assert load_from_disk(str(a))[split].to_list() == load_from_disk(str(c))[split].to_list()


def test_mlm_seed_changes_masks_not_blocks(wiki, tmp_path):
    tokenize_dataset("wiki", wiki, mlm_cfg(seed=0), tmp_path / "s0")
    tokenize_dataset("wiki", wiki, mlm_cfg(seed=1), tmp_path / "s1")
    r0, r1 = (load_from_disk(str(tmp_path / s))["train"].to_list() for s in ("s0", "s1"))
    assert [r["block_id"] for r in r0] == [r["block_id"] for r in r1]
    assert sum(x["masked_positions"] != y["masked_positions"] for x, y in zip(r0, r1)) >= len(r0) - 1
    for x, y in zip(r0, r1):
        ox, oy = np.array(x["input_ids"]), np.array(y["input_ids"])
        ox[x["masked_positions"]] = x["masked_labels"]
        oy[y["masked_positions"]] = y["masked_labels"]
        assert np.array_equal(ox, oy)


def test_max_eval_blocks_keeps_evenly_spaced_dev_blocks_with_their_masks(tmp_path):
    """The capped dev split is exactly the uncapped one's rows of blocks 0, mid, last (ids and masks as there);
    train is never cut."""
    prepared = write_prepared(tmp_path / "prepared" / "wiki", "corpus", {"train": corpus(DOCS), "dev": corpus(DOCS)})
    tokenize_dataset("wiki", prepared, mlm_cfg(16), tmp_path / "all")
    tokenize_dataset("wiki", prepared, mlm_cfg(16, max_eval_blocks=3), tmp_path / "cut")
    full, cut = (load_from_disk(str(tmp_path / n)) for n in ("all", "cut"))
    n_blocks = max(full["dev"]["block_id"]) + 1
    assert n_blocks >= 6
    kept = {0, round((n_blocks - 1) / 2), n_blocks - 1}  # round(i * (N - 1) / (3 - 1)), i = 0, 1, 2
    assert cut["dev"].to_list() == [r for r in full["dev"].to_list() if r["block_id"] in kept]
    assert len(cut["dev"]) == 3 * 2  # two views a block
    assert cut["train"].to_list() == full["train"].to_list()
    meta = schema.read_meta(tmp_path / "cut")
    assert meta["summary"]["rows"]["dev"] == 6 and meta["params"]["max_eval_blocks"] == 3
    assert meta["fingerprint"] != schema.read_meta(tmp_path / "all")["fingerprint"]


# --------------------------------------------------------------------------------------------
# fingerprint, meta, output folder
# --------------------------------------------------------------------------------------------


def fingerprint(prepared: Path, cfg: TokenizeConfig, out: Path, name: str = "wiki") -> str:
    tokenize_dataset(name, prepared, cfg, out)
    return schema.read_meta(out)["fingerprint"]


def test_fingerprint_follows_input_params_and_tokenizer(wiki, tmp_path):
    base = fingerprint(wiki, mlm_cfg(), tmp_path / "o")
    assert fingerprint(wiki, mlm_cfg(), tmp_path / "o") == base  # re-run
    # The prepared folder's summary (timings) and datasets' state.json do not count; its data does.
    meta = schema.read_meta(wiki) | {"summary": {"seconds": 1.23}}
    schema.write_meta(wiki, meta)
    assert fingerprint(wiki, mlm_cfg(), tmp_path / "o") == base
    seen = {base}
    for cfg in (mlm_cfg(seed=1), mlm_cfg(mask_prob=0.2), mlm_cfg(mask_views=3), mlm_cfg(max_seq_len=64)):
        seen.add(fingerprint(wiki, cfg, tmp_path / "o"))
    assert len(seen) == 5
    changed = write_prepared(tmp_path / "changed" / "wiki", "corpus",
                             {"train": corpus(DOCS | {"d3": ["Albedo is the diffuse reflectivity."]}),
                              "dev": corpus(DEV_DOCS)})
    assert fingerprint(changed, mlm_cfg(), tmp_path / "o") not in seen
    # Another tokenizer (here: same vocabulary, different tokenizer_config.json) changes it too.
    tok_dir = tmp_path / "tok"
    shutil.copytree(resolve_model(SPEC), tok_dir, ignore=shutil.ignore_patterns("*.safetensors", "1_Pooling"))
    conf = json.loads((tok_dir / "tokenizer_config.json").read_text())
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(conf | {"model_max_length": 256}))
    other = TokenizeConfig(str(tok_dir), 32, mlm_cfg().datasets)
    assert fingerprint(wiki, other, tmp_path / "o") not in seen | {base}


def test_meta_json_describes_tokens_and_tokenizer(wiki, tmp_path, tok):
    tokenize_dataset("wiki", wiki, mlm_cfg(), tmp_path / "o")
    meta = schema.read_meta(tmp_path / "o")
    assert set(meta) == {"name", "task_type", "kind", "fingerprint", "num_labels", "label_names", "tokenizer",
                         "max_seq_len", "params", "summary", "labeled"}
    assert meta["labeled"] is True  # prepare's outputs have ground truth; augment's do not
    assert (meta["name"], meta["task_type"], meta["kind"], meta["max_seq_len"]) == ("wiki", "corpus", "mlm", 32)
    assert meta["tokenizer"] | {"sha256": None} == {"spec": SPEC, "sha256": None, "vocab_size": 30522, "pad_id": 0,
                                                    "cls_id": 101, "sep_id": 102, "mask_id": 103}
    assert len(meta["tokenizer"]["sha256"]) == 64 and len(meta["fingerprint"]) == 64
    assert meta["params"] == {"kind": "mlm", "mask_views": 2, "mask_prob": 0.15, "mask_token_fraction": 0.8,
                              "random_token_fraction": 0.1, "seed": 0, "max_seq_len": 32,
                              "max_eval_blocks": None}
    assert "seconds" not in meta["summary"] and meta["summary"]["rows"]["train"] > 0


def test_output_replaces_a_previous_one_and_leaves_no_temp_folders(wiki, tmp_path):
    out = tmp_path / "tokens" / "wiki"
    out.mkdir(parents=True)
    (out / "stale.arrow").write_text("old")
    tokenize_dataset("wiki", wiki, mlm_cfg(), out)
    assert not (out / "stale.arrow").exists() and (out / "meta.json").is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["wiki"]


def test_kind_must_fit_the_prepared_task_type(wiki, tmp_path):
    cfg = TokenizeConfig(SPEC, 32, {"wiki": TokenizeClassificationConfig("classification", None)})
    with pytest.raises(TokenizeError, match=r"tokenize\.datasets\.wiki\.kind is 'classification'.*'corpus'.*kind: mlm"):
        tokenize_dataset("wiki", wiki, cfg, tmp_path / "o")
    qa = write_prepared(tmp_path / "qa", "regression", {"train": {"id": ["1"], "text_a": ["a"], "text_b": ["b"],
                                                                   "label": [1.0]}})
    cfg = TokenizeConfig(SPEC, 32, {"qa": TokenizeQAConfig("qa", 8, 8, None)})
    with pytest.raises(TokenizeError, match=r"tokenize\.datasets\.qa\.kind is 'qa'.*needs kind: classification"):
        tokenize_dataset("qa", qa, cfg, tmp_path / "o")
    assert not (tmp_path / "o").exists()
    with pytest.raises(TokenizeError, match="no entry 'nope'"):
        tokenize_dataset("nope", wiki, cfg, tmp_path / "o")


def test_a_split_without_any_token_is_refused(tmp_path):
    empty = write_prepared(tmp_path / "wiki", "corpus",
                           {"train": corpus(DOCS), "dev": {"doc_id": ["x"], "text": [" "]}})
    with pytest.raises(TokenizeError, match=r"wiki/dev \(1 rows\) gives no tokens"):
        tokenize_dataset("wiki", empty, mlm_cfg(), tmp_path / "o")
    assert not (tmp_path / "o").exists() and not (tmp_path / ".o.tmp").exists()


# --------------------------------------------------------------------------------------------
# classification
# --------------------------------------------------------------------------------------------

A = ["A great movie.", "Terrible, boring and far far far too long for anyone to sit through without sleeping.",
     "ok", "The plot twists kept coming, one after another, until the very last minute of the film."]
B = ["I loved it.", "Nope.", "A long second sentence that will certainly need to be truncated to fit the limit.",
     "Short."]


def longest_first(la: int, lb: int, budget: int) -> set[tuple[int, int]]:
    """The kept lengths allowed by longest-first truncation: the shorter side stays whole while it
    fits in half the budget, else both sides get half (the odd token to either)."""
    short = min(la, lb)
    if short <= budget // 2:
        return {(la, budget - la)} if la < lb else {(budget - lb, lb)}
    return {(budget // 2, budget - budget // 2), (budget - budget // 2, budget // 2)}


def test_pair_classification_joint_and_separate_encodings(tmp_path, tok):
    prepared = write_prepared(tmp_path / "pairs", "classification",
                              {"train": {"id": ["p0", "p1", "p2", "p3"], "text_a": A, "text_b": B,
                                         "label": [1, 0, -1, 1]}},
                              text_fields=["text_a", "text_b"], num_labels=2)
    L = 16
    summary = tokenize_dataset("pairs", prepared, cls_cfg(L), tmp_path / "o")
    ds = load_from_disk(str(tmp_path / "o"))["train"]
    assert ds.features["label"] == Value("int64") and ds.features["a_input_ids"] == List(Value("int32"))
    cls_, sep = tok.cls_token_id, tok.sep_token_id
    n_truncated = 0
    for r, a, b, i in zip(ds.to_list(), A, B, range(4)):
        ta, tb = (tok(x, add_special_tokens=False)["input_ids"] for x in (a, b))
        assert r["example_id"] == f"p{i}" and r["label"] == [1, 0, -1, 1][i]
        assert r["a_input_ids"] == [cls_, *ta[:L - 2], sep] and r["b_input_ids"] == [cls_, *tb[:L - 2], sep]
        ids, types = r["input_ids"], r["token_type_ids"]
        k = ids.index(sep)
        ja, jb = ids[1:k], ids[k + 1:-1]
        assert ids[0] == cls_ and ids[-1] == sep and r["length"] == len(ids) == len(types) <= L
        assert types == [0] * (k + 1) + [1] * (len(jb) + 1)
        assert ja == ta[:len(ja)] and jb == tb[:len(jb)]
        if len(ta) + len(tb) + 3 > L:  # longest_first: cut the longer side first, until both are even
            n_truncated += 1
            assert len(ids) == L
            assert (len(ja), len(jb)) in longest_first(len(ta), len(tb), L - 3)
        else:
            assert (ja, jb) == (ta, tb)
    assert n_truncated == 3 and summary.truncated == 3
    assert summary.counts["truncated_a"] == 2 and summary.counts["truncated_b"] == 1
    assert summary.one_line().startswith("tokenize pairs: 4 rows (pairs), 3 truncated, ")


def test_single_sentence_and_regression_labels(tmp_path, tok):
    sent = write_prepared(tmp_path / "sent", "classification",
                          {"train": {"id": ["s0", "s1"], "text_a": A[:2], "label": [1, 0]},
                           "dev": {"id": ["s2"], "text_a": A[2:3], "label": [1]}}, text_fields=["text_a"])
    tokenize_dataset("sent", sent, cls_cfg(12), tmp_path / "o1")
    dd = load_from_disk(str(tmp_path / "o1"))
    assert list(dd) == ["train", "dev"]
    for r, a in zip(dd["train"].to_list() + dd["dev"].to_list(), A):
        assert r["input_ids"] == r["a_input_ids"] == tok(a, truncation=True, max_length=12)["input_ids"]
        assert r["b_input_ids"] == [] and not any(r["token_type_ids"])
    sts = write_prepared(tmp_path / "sts", "regression",
                         {"train": {"id": ["r0", "r1"], "text_a": A[:2], "text_b": B[:2], "label": [4.25, 0.5]}},
                         features=Features({"id": Value("string"), "text_a": Value("string"),
                                            "text_b": Value("string"), "label": Value("float32")}),
                         text_fields=["text_a", "text_b"])
    tokenize_dataset("sts", sts, cls_cfg(), tmp_path / "o2")
    ds = load_from_disk(str(tmp_path / "o2"))["train"]
    assert ds.features["label"] == Value("float32") and ds["label"] == [4.25, 0.5]


def test_missing_text_b_is_reported(tmp_path):
    bad = write_prepared(tmp_path / "pairs", "classification",
                         {"train": {"id": ["p0"], "text_a": ["x"], "label": [0]}}, text_fields=["text_a", "text_b"])
    with pytest.raises(TokenizeError, match="no text_b column"):
        tokenize_dataset("pairs", bad, cls_cfg(), tmp_path / "o")
