"""Local SQuAD JSON and text / JSONL corpora."""

import json
from pathlib import Path

import pytest
from _tiny import local_files

from distillpipe.config.base import build
from distillpipe.config.prepare import LocalSquadConfig, LocalTextConfig
from distillpipe.data.sources import PrepareError, build_source


def squad(files, encoding="utf-8", carve=None):
    return build(LocalSquadConfig, dict(format="squad", **local_files(files), encoding=encoding, carve=carve),
                 "prepare.local.sq")


def corpus(fmt, files, text_field="text", encoding="utf-8", on_bad_rows="error", carve=None):
    return build(LocalTextConfig, dict(format=fmt, **local_files(files), text_field=text_field, encoding=encoding,
                                       on_bad_rows=on_bad_rows, carve=carve), "prepare.local.c")


def squad_doc(qas, context="Warsaw is the capital of Poland. It lies on the Vistula."):
    return {"version": "1.1", "data": [{"title": "Warsaw", "paragraphs": [{"context": context, "qas": qas}]}]}


# --------------------------------------------------------------------------------------------
# SQuAD


def test_squad_v2_sample(shared_data):
    path = shared_data / "squad_v2" / "train-sample.json"
    prepared = build_source("squad_v2", squad({"train": path}))
    ds = prepared.splits["train"]
    assert prepared.task_type == "qa" and prepared.text_fields == ["question", "context"]
    assert set(ds.column_names) == {"id", "title", "context", "question", "answers"}
    assert ds.features["answers"]["answer_start"].feature.dtype == "int32"
    assert len(ds) == 2013
    assert sum(not a["text"] for a in ds["answers"]) == 1013
    assert set(ds["title"]) == {"Islamism", "Imperialism", "Warsaw", "French_and_Indian_War", "Force"}
    ref = {q["id"]: q for a in json.loads(path.read_text(encoding="utf-8"))["data"]
           for p in a["paragraphs"] for q in p["qas"]}
    for row in ds:
        q = ref[row["id"]]
        assert row["question"] == q["question"]
        assert row["answers"]["text"] == ([] if q["is_impossible"] else [a["text"] for a in q["answers"]])
        for text, start in zip(row["answers"]["text"], row["answers"]["answer_start"]):
            assert row["context"][start : start + len(text)] == text


def test_squad_v1_without_is_impossible(tmp_path):
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(squad_doc([
        {"id": "q1", "question": "What is the capital of Poland?", "answers": [{"text": "Warsaw", "answer_start": 0}]},
        {"id": "q2", "question": "Which river?", "answers": [{"text": "Vistula", "answer_start": 48},
                                                              {"text": "the Vistula", "answer_start": 44}]},
    ])), encoding="utf-8")
    ds = build_source("sq", squad({"dev": path})).splits["dev"]
    assert ds["id"] == ["q1", "q2"]
    assert ds[1]["answers"] == {"text": ["Vistula", "the Vistula"], "answer_start": [48, 44]}


def test_squad_answer_mismatch_names_question_id(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(squad_doc([
        {"id": "q-off", "question": "Which river?", "answers": [{"text": "Vistula", "answer_start": 40}]},
    ])), encoding="utf-8")
    with pytest.raises(PrepareError, match=r"question 'q-off'.*'Vistula'.*answer_start=40.*occurs at 48"):
        build_source("sq", squad({"train": path}))


def test_squad_invalid_json_names_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"version": "v2.0",\n "data": [\n  {"title": "x",, }\n]}\n', encoding="utf-8")
    with pytest.raises(PrepareError, match=rf"{path}:3: invalid JSON"):
        build_source("sq", squad({"train": path}))


def test_squad_missing_file_names_key(tmp_path):
    with pytest.raises(PrepareError, match=r"dev-v2\.0\.json does not exist.*prepare\.local\.sq\.files\.dev"):
        build_source("sq", squad({"dev": tmp_path / "dev-v2.0.json"}))


# --------------------------------------------------------------------------------------------
# text and JSONL corpora


def test_text_documents_separated_by_blank_lines(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("\nFirst document,\nsecond line.\n\n\n   \nSecond document.\n\nThird\n", encoding="utf-8")
    dev = tmp_path / "dev.txt"
    dev.write_text("Only one.", encoding="utf-8")
    prepared = build_source("c", corpus("text", {"train": path, "dev": dev}))
    assert prepared.task_type == "corpus"
    tr = prepared.splits["train"]
    assert tr["doc_id"] == ["train.txt:2", "train.txt:7", "train.txt:9"]
    assert tr["text"] == ["First document,\nsecond line.", "Second document.", "Third"]
    assert prepared.splits["dev"]["text"] == ["Only one."]


def test_text_file_without_documents_is_an_error(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n\n", encoding="utf-8")
    with pytest.raises(PrepareError, match=r"empty\.txt: no documents"):
        build_source("c", corpus("text", {"train": path}))


def test_text_undecodable_bytes(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes("one\n\ntwo\nna\u00efve\n".encode("latin-1"))
    with pytest.raises(PrepareError, match=rf"{path}:4: cannot decode byte 0xef.*prepare\.local\.c\.encoding"):
        build_source("c", corpus("text", {"train": path}))
    prepared = build_source("c", corpus("text", {"train": path}, encoding="latin-1"))
    assert prepared.splits["train"]["text"] == ["one", "two\nna\u00efve"]


def write_jsonl(path: Path) -> Path:
    path.write_text(
        '{"text": "A document.", "id": 1}\n'
        "\n"
        '{"text": "   "}\n'
        '{"text": "Another one."}\n'
        '{"text": "broken\n'
        '{"body": "no text field"}\n'
        '["not", "an", "object"]\n'
        '{"text": "Last."}\n',
        encoding="utf-8",
    )
    return path


def test_jsonl_bad_line_is_an_error_naming_line(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl")
    with pytest.raises(PrepareError) as err:
        build_source("c", corpus("jsonl", {"train": path}))
    assert f"{path}:5: invalid JSON" in str(err.value) and "prepare.local.c.on_bad_rows: skip" in str(err.value)


def test_jsonl_skip_counts_every_reason(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl")
    prepared = build_source("c", corpus("jsonl", {"train": path}, on_bad_rows="skip"))
    ds = prepared.splits["train"]
    assert ds["doc_id"] == ["c.jsonl:1", "c.jsonl:4", "c.jsonl:8"]
    assert ds["text"] == ["A document.", "Another one.", "Last."]
    assert prepared.skips.as_dict() == {
        "blank lines": 1,
        "empty documents": 1,
        "lines with invalid JSON": 1,
        "lines without a string 'text'": 2,
    }


def test_jsonl_missing_field_names_text_field_key(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"body": "x"}\n', encoding="utf-8")
    with pytest.raises(PrepareError, match=r"c\.jsonl:1: no string field 'text'.*prepare\.local\.c\.text_field"):
        build_source("c", corpus("jsonl", {"train": path}))
    prepared = build_source("c", corpus("jsonl", {"train": path}, text_field="body"))
    assert prepared.splits["train"]["text"] == ["x"]
