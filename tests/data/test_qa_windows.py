"""QA windows (distillpipe.data.qa_windows) through tokenize_dataset, on the real SQuAD v2 sample."""

from __future__ import annotations

import json
import os
import unicodedata
from itertools import groupby
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset, DatasetDict, Features, List, Value, load_from_disk

from distillpipe.assets import load_tokenizer
from distillpipe.config.base import ConfigError
from distillpipe.config.tokenize import TokenizeConfig, TokenizeQAConfig
from distillpipe.data import schema
from distillpipe.data.qa_windows import answer_token_span, check_lengths
from distillpipe.data.tokenize import tokenize_dataset

SPEC = "embedded:minilm-l6"
L, STRIDE, MAX_Q = 128, 32, 24
FEATURES = Features({"id": Value("string"), "title": Value("string"), "context": Value("string"),
                     "question": Value("string"),
                     "answers": {"text": List(Value("string")), "answer_start": List(Value("int32"))}})


def squad_sample() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    for c in (os.environ.get("DISTILLPIPE_SHARED_DATA"), root.parent / "shared" / "data", "/work/shared/data"):
        if c and (Path(c) / "squad_v2" / "train-sample.json").is_file():
            return Path(c) / "squad_v2" / "train-sample.json"
    return None


def flatten_squad(path: Path) -> dict[str, list]:
    """SQuAD JSON -> the prepared qa columns (schema.py)."""
    rows: dict[str, list] = {k: [] for k in FEATURES}
    for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
        for para in article["paragraphs"]:
            for q in para["qas"]:
                rows["id"].append(q["id"])
                rows["title"].append(article["title"])
                rows["context"].append(para["context"])
                rows["question"].append(q["question"])
                rows["answers"].append({"text": [a["text"] for a in q["answers"]],
                                        "answer_start": [a["answer_start"] for a in q["answers"]]})
    return rows


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(SPEC)[0]


@pytest.fixture(scope="module")
def squad(tmp_path_factory):
    """(prepared rows by id, window rows, summary) for the whole SQuAD v2 sample."""
    path = squad_sample()
    if path is None:
        pytest.skip("shared/data/squad_v2/train-sample.json not found beside the repository")
    tmp = tmp_path_factory.mktemp("squad")
    rows = flatten_squad(path)
    DatasetDict({"train": Dataset.from_dict(rows, features=FEATURES)}).save_to_disk(str(tmp / "prepared"))
    schema.write_meta(tmp / "prepared", {"name": "squad", "task_type": "qa"})
    qa_cfg = TokenizeQAConfig("qa", doc_stride=STRIDE, max_query_len=MAX_Q, max_seq_len=None)
    cfg = TokenizeConfig(SPEC, L, {"squad": qa_cfg})
    summary = tokenize_dataset("squad", tmp / "prepared", cfg, tmp / "tokens")
    out = load_from_disk(str(tmp / "tokens"))["train"]
    assert out.features["offset_mapping"] == List(List(Value("int32"), length=2))
    examples = {i: {k: rows[k][n] for k in rows} for n, i in enumerate(rows["id"])}
    return examples, out.to_list(), summary


def norm(s: str) -> str:
    return " ".join(s.lower().split())


def bert_norm(s: str) -> str:
    """What the uncased BERT normalizer does to text: lowercase and strip accents."""
    return "".join(c for c in unicodedata.normalize("NFD", s.lower()) if unicodedata.category(c) != "Mn")


def context_range(w: dict) -> tuple[int, int]:
    ctx = [o for o in w["offset_mapping"] if o[0] >= 0]
    return ctx[0][0], ctx[-1][1]


def gold_span(context: str, text: str, start: int) -> tuple[int, int]:
    end = start + len(text)
    while start < end and context[start].isspace():
        start += 1
    while end > start and context[end - 1].isspace():
        end -= 1
    return start, end


def test_windows_follow_the_bert_layout_and_offsets_point_into_the_context(squad, tok):
    examples, windows, _ = squad
    questions = dict(zip(examples, tok([ex["question"] for ex in examples.values()],
                                       add_special_tokens=False)["input_ids"]))
    checked = 0
    for w in windows:
        ex = examples[w["example_id"]]
        ids, types, offsets = w["input_ids"], w["token_type_ids"], w["offset_mapping"]
        k = ids.index(tok.sep_token_id)
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and w["length"] == len(ids) <= L
        assert ids[1:k] == questions[w["example_id"]][:MAX_Q]
        assert types == [0] * (k + 1) + [1] * (len(ids) - k - 1)
        assert all(o == [-1, -1] for o in offsets[:k + 1] + offsets[-1:])
        for t, (a, b) in zip(tok.convert_ids_to_tokens(ids[k + 1:-1]), offsets[k + 1:-1]):
            assert 0 <= a < b <= len(ex["context"])
            if t != tok.unk_token:
                assert bert_norm(ex["context"][a:b]) == t.removeprefix("##")
                checked += 1
    assert checked > 300_000


def test_consecutive_windows_overlap_by_doc_stride_and_cover_the_context(squad, tok):
    examples, windows, summary = squad
    ids_in_order = [w["example_id"] for w in windows]
    assert [k for k, _ in groupby(ids_in_order)] == list(examples)  # every example, in order, contiguous
    contexts = sorted({ex["context"] for ex in examples.values()})
    enc = tok(contexts, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    tokens_of = {c: [tuple(o) for o in offsets] for c, offsets in zip(contexts, enc)}
    multi = 0
    for ex_id, group in groupby(windows, key=lambda w: w["example_id"]):
        ctx = [[tuple(o) for o in w["offset_mapping"] if o[0] >= 0] for w in group]
        full = tokens_of[examples[ex_id]["context"]]
        stitched = ctx[0]
        for prev, cur in zip(ctx, ctx[1:]):
            assert cur[:STRIDE] == prev[-STRIDE:]
            stitched = stitched + cur[STRIDE:]
        assert stitched == full
        multi += len(ctx) > 1
    assert multi > 500  # the sample exercises the stride
    assert summary.windows == len(windows) and summary.rows == {"train": len(windows)}


def test_every_answer_is_recoverable_from_the_offsets_of_a_window(squad):
    examples, windows, summary = squad
    by_example = {k: list(g) for k, g in groupby(windows, key=lambda w: w["example_id"])}
    n_answers = aligned = exact_first = labelled = 0
    for ex_id, ex in examples.items():
        ws = by_example[ex_id]
        assert all(w["has_answer"] == bool(ex["answers"]["text"]) for w in ws)
        if not ex["answers"]["text"]:
            assert all(w["start_positions"] == w["end_positions"] == 0 for w in ws)
            continue
        for i, (text, start) in enumerate(zip(ex["answers"]["text"], ex["answers"]["answer_start"])):
            n_answers += 1
            a, b = gold_span(ex["context"], text, start)
            assert ex["context"][start:start + len(text)] == text
            inside = [w for w in ws if context_range(w)[0] <= a and b <= context_range(w)[1]]
            assert inside, f"{ex_id}: answer {text!r} in no window"
            for w in inside:
                # Minimal run of context tokens covering [a, b), found from the offsets alone.
                o = np.array(w["offset_mapping"])
                ctx = o[:, 0] >= 0
                s = np.flatnonzero(ctx & (o[:, 1] > a))[0]
                e = np.flatnonzero(ctx & (o[:, 0] < b))[-1]
                got = ex["context"][o[s, 0]:o[e, 1]]
                if (o[s, 0], o[e, 1]) == (a, b):  # the answer starts and ends at token boundaries
                    assert norm(got) == norm(text)
                    aligned += 1
                else:  # an answer inside a word piece ("Japan" found in "Japanese"): the covering tokens
                    assert o[s, 0] <= a and b <= o[e, 1] and text in got
                if i == 0:  # the training label is the first answer
                    assert (w["start_positions"], w["end_positions"]) == (s, e)
                    labelled += 1
                    exact_first += got == text
        first = gold_span(ex["context"], ex["answers"]["text"][0], ex["answers"]["answer_start"][0])
        for w in ws:  # windows without the whole first answer in their context point at [CLS]
            lo, hi = context_range(w)
            if not (lo <= first[0] and first[1] <= hi):
                assert w["start_positions"] == w["end_positions"] == 0
    assert n_answers > 2_500 and aligned / n_answers > 0.99
    assert labelled == summary.counts["windows_with_answer"] and exact_first / labelled > 0.99
    assert summary.counts["answerable"] == 1000 and summary.counts["answers_in_no_window"] == 0


def test_long_questions_are_truncated_and_counted(squad, tok):
    examples, _, summary = squad
    enc = tok([ex["question"] for ex in examples.values()], add_special_tokens=False)["input_ids"]
    long = sum(len(ids) > MAX_Q for ids in enc)
    assert long > 0 and summary.truncated == summary.counts["truncated_questions"] == long
    assert summary.one_line().startswith(f"tokenize squad: {summary.windows:,} rows (2,013 examples -> "
                                         f"{summary.windows:,} windows), {long} questions truncated, ")


def test_answer_token_span_on_a_hand_made_window():
    #          [CLS]     q      [SEP]    "the"   "cat"    "##s"    "sat"   [SEP]
    offsets = np.array([[-1, -1], [-1, -1], [-1, -1], [0, 3], [4, 7], [7, 8], [9, 12], [-1, -1]])
    is_ctx = offsets[:, 0] >= 0
    assert answer_token_span(offsets, is_ctx, 4, 8) == (4, 5)  # "cats"
    assert answer_token_span(offsets, is_ctx, 4, 7) == (4, 4)  # "cat": inside the word, the covering piece
    assert answer_token_span(offsets, is_ctx, 9, 12) == (6, 6)
    assert answer_token_span(offsets, is_ctx, 9, 15) == (0, 0)  # runs past the window
    assert answer_token_span(offsets, np.zeros(8, dtype=bool), 0, 3) == (0, 0)


def test_a_stride_that_leaves_no_room_is_refused_naming_the_params(tok):
    check_lengths(tok, 128, 32, 48)
    with pytest.raises(ValueError, match=r"room for 77 context tokens.*doc_stride=80"):
        check_lengths(tok, 128, 80, 48)
    # The config already refuses it at load, naming the key.
    with pytest.raises(ConfigError, match=r"tokenize\.datasets\.wiki_qa\.doc_stride must be in"):
        TokenizeConfig(SPEC, 128, {"wiki_qa": TokenizeQAConfig("qa", doc_stride=80, max_query_len=48,
                                                               max_seq_len=None)})
