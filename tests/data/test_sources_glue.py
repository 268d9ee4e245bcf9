"""GLUE TSVs: the real samples in ../shared/data and tiny files in each task's real layout."""

from collections import Counter
from pathlib import Path

import pytest
from _tiny import local_files

from distillpipe.config.base import build
from distillpipe.config.prepare import LocalGlueConfig
from distillpipe.data.sources import PrepareError, build_source


def glue(task, files, encoding="utf-8", on_bad_rows="error", carve=None):
    return build(LocalGlueConfig, dict(format="glue", task=task, **local_files(files),
                                       encoding=encoding, on_bad_rows=on_bad_rows, carve=carve), "prepare.local.x")


def write(path: Path, lines: list[str], encoding="utf-8") -> Path:
    path.write_bytes(("\n".join(lines) + "\n").encode(encoding))
    return path


def raw_rows(path: Path) -> list[list[str]]:
    """Reference reader: data lines split on tabs, header dropped, BOM ignored."""
    return [line.split("\t") for line in path.read_text(encoding="utf-8-sig").splitlines()[1:]]


# --------------------------------------------------------------------------------------------
# real samples


def test_sst2_sample(shared_data):
    d = shared_data / "glue" / "SST-2"
    prepared = build_source("sst2", glue("sst2", {"train": d / "train.tsv", "dev": d / "dev.tsv"}))
    assert prepared.task_type == "classification" and prepared.text_fields == ["text_a"]
    assert prepared.label_names == ["negative", "positive"]
    for split in ("train", "dev"):
        ds, ref = prepared.splits[split], raw_rows(d / f"{split}.tsv")
        assert ds.column_names == ["id", "text_a", "label"]
        assert ds["text_a"] == [r[0] for r in ref]
        assert ds["label"] == [int(r[1]) for r in ref]
    assert len(prepared.splits["train"]) == 2000 and len(prepared.splits["dev"]) == 500


def test_stsb_sample_is_regression(shared_data):
    d = shared_data / "glue" / "STS-B"
    prepared = build_source("stsb", glue("stsb", {"train": d / "train.tsv", "dev": d / "dev.tsv"}))
    assert prepared.task_type == "regression" and prepared.num_labels == 1
    ds, ref = prepared.splits["dev"], raw_rows(d / "dev.tsv")
    assert ds.features["label"].dtype == "float32"
    assert ds["text_a"] == [r[7] for r in ref] and ds["text_b"] == [r[8] for r in ref]
    assert ds["label"] == pytest.approx([float(r[-1]) for r in ref], abs=1e-6)
    assert ds["id"] == [r[0] for r in ref]
    assert all(0 <= y <= 5 for y in prepared.splits["train"]["label"])


def test_rte_sample_keeps_leading_quotes(shared_data):
    d = shared_data / "glue" / "RTE"
    prepared = build_source("rte", glue("rte", {"train": d / "train.tsv", "dev": d / "dev.tsv"}))
    ref = raw_rows(d / "train.tsv")
    ds = prepared.splits["train"]
    assert len(ds) == 2000 and len(prepared.splits["dev"]) == 277
    quoted = [i for i, r in enumerate(ref) if r[1].startswith('"')]
    assert len(quoted) > 10
    assert all(ds[i]["text_a"] == ref[i][1] for i in quoted)
    assert ds["label"] == [["entailment", "not_entailment"].index(r[3]) for r in ref]


def test_mrpc_sample_with_bom_header(shared_data):
    d = shared_data / "glue" / "MRPC"
    assert (d / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbfQuality\t")
    prepared = build_source("mrpc", glue("mrpc", {"train": d / "train.tsv", "dev": d / "dev.tsv"}))
    ds, ref = prepared.splits["train"], raw_rows(d / "train.tsv")
    assert prepared.label_names == ["not_equivalent", "equivalent"]
    assert ds["label"] == [int(r[0]) for r in ref]
    assert ds["id"] == [f"{r[1]}-{r[2]}" for r in ref]
    assert ds["text_a"] == [r[3] for r in ref] and ds["text_b"] == [r[4] for r in ref]
    assert Counter(ds["label"]).keys() == {0, 1}


# --------------------------------------------------------------------------------------------
# crafted files in the other tasks' layouts


def test_cola_headerless_train_and_test_with_header(tmp_path):
    train = write(tmp_path / "in_domain_train.tsv", [
        "gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.",
        "gj04\t0\t*\tThey drank the pub.",
        'cj99\t1\t\t"Quoted" sentences stay quoted.',
    ])
    test = write(tmp_path / "test.tsv", ["index\tsentence", "0\tBill whistled past the house.", "1\tA sentence."])
    prepared = build_source("cola", glue("cola", {"train": train, "test": test}))
    assert prepared.label_names == ["unacceptable", "acceptable"]
    tr, te = prepared.splits["train"], prepared.splits["test"]
    assert tr["label"] == [1, 0, 1]
    assert tr["text_a"][2] == '"Quoted" sentences stay quoted.'
    assert tr["id"] == ["1", "2", "3"]  # no id column: the line number
    assert te["label"] == [-1, -1] and te["id"] == ["0", "1"] and te["text_a"][0] == "Bill whistled past the house."


def test_qqp_layout(tmp_path):
    train = write(tmp_path / "train.tsv", [
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
        "133273\t213221\t213222\tHow is the life of a math student?\tWhich level of prepration is enough?\t0",
        "402555\t536040\t536041\tHow do I control my horny emotions?\tHow do you control your horniness?\t1",
    ])
    test = write(tmp_path / "test.tsv", ["id\tquestion1\tquestion2", "0\tWhy am I mentally weak?\tWhy am I weak?"])
    prepared = build_source("qqp", glue("qqp", {"train": train, "test": test}))
    tr = prepared.splits["train"]
    assert tr["id"] == ["133273", "402555"] and tr["label"] == [0, 1]
    assert tr["text_b"][1] == "How do you control your horniness?"
    assert prepared.splits["test"]["label"] == [-1]


MNLI_PARSES = "( ( A ) b )\t( ( C ) d )\t(ROOT (S A))\t(ROOT (S C))"


def test_mnli_layout_and_split_names(tmp_path):
    train = write(tmp_path / "train.tsv", [
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label",
        f"0\t31193\t31193n\tgovernment\t{MNLI_PARSES}\tConceptually cream skimming has two dimensions.\t"
        "Product and geography are what make cream skimming work.\tneutral\tneutral",
        f"1\t101457\t101457e\ttelephone\t{MNLI_PARSES}\tyou know during the season\tYou lose the things.\t"
        "entailment\tentailment",
        f"2\t134793\t134793c\tfiction\t{MNLI_PARSES}\tOne of our number will carry out your instructions.\t"
        "A member of my team will not.\tcontradiction\tcontradiction",
    ])
    dev_header = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
                  "sentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")
    dev_m = write(tmp_path / "dev_matched.tsv", [
        dev_header,
        f"0\t63735\t63735n\tslate\t{MNLI_PARSES}\tThe new rights are nice enough\tEveryone really likes them.\t"
        "neutral\tentailment\tneutral\tneutral\tneutral\tneutral",
    ])
    dev_mm = write(tmp_path / "dev_mismatched.tsv", [
        dev_header,
        f"0\t75290\t75290c\tletters\t{MNLI_PARSES}\tYour contribution helped.\tIt did not help.\t"
        "contradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction",
    ])
    test = write(tmp_path / "test_matched.tsv", [
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2",
        f"0\t31493\t31493\ttravel\t{MNLI_PARSES}\tHierbas, ans seco, ans dulce.\tThe words are Spanish.",
    ])
    files = {"train": train, "dev_matched": dev_m, "dev_mismatched": dev_mm, "test_matched": test}
    prepared = build_source("mnli", glue("mnli", files))
    assert list(prepared.splits) == list(files)
    assert prepared.label_names == ["entailment", "neutral", "contradiction"]
    assert prepared.splits["train"]["label"] == [1, 0, 2]
    assert prepared.splits["train"]["text_a"][0] == "Conceptually cream skimming has two dimensions."
    assert prepared.splits["dev_matched"]["label"] == [1]  # gold_label, not label1
    assert prepared.splits["dev_mismatched"]["label"] == [2]
    assert prepared.splits["test_matched"]["label"] == [-1]
    assert prepared.splits["test_matched"]["text_b"] == ["The words are Spanish."]


def test_qnli_and_wnli_layouts(tmp_path):
    qnli = write(tmp_path / "qnli.tsv", [
        "index\tquestion\tsentence\tlabel",
        "0\tWhat came into force after the new constitution was herald?\tAs of that day, the new constitution "
        "heralding the Second Republic came into force.\tentailment",
        "1\tWhat is the first major city in the stream of the Rhine?\tThe most important tributaries are here.\t"
        "not_entailment",
    ])
    prepared = build_source("qnli", glue("qnli", {"dev": qnli}))
    assert prepared.splits["dev"]["label"] == [0, 1] and prepared.label_names == ["entailment", "not_entailment"]
    assert prepared.splits["dev"]["text_a"][1] == "What is the first major city in the stream of the Rhine?"
    wnli = write(tmp_path / "wnli.tsv", [
        "index\tsentence1\tsentence2\tlabel",
        "0\tI stuck a pin through a carrot. When I pulled the pin out, it had a hole.\tThe carrot had a hole.\t1",
        "1\tJohn couldn't see the stage with Billy in front of him because he is so short.\tJohn is so short.\t1",
        "2\tThe police arrested all of the gang members.\tThe police were trying to stop the drug trade.\t0",
    ])
    prepared = build_source("wnli", glue("wnli", {"train": wnli}))
    assert prepared.splits["train"]["label"] == [1, 1, 0]
    assert prepared.label_names == ["not_entailment", "entailment"]


# --------------------------------------------------------------------------------------------
# bad input


def rte_with_bad_rows(tmp_path):
    return write(tmp_path / "rte.tsv", [
        "index\tsentence1\tsentence2\tlabel",
        "0\tA good row.\tIt is good.\tentailment",
        "1\tA row with a missing column.\tnot_entailment",
        "2\tAn unknown label.\tIt is odd.\tmaybe",
        "3\tAnother good row.\tIt is fine.\tnot_entailment",
        "4\tA row with\ta tab too many.\tIt is long.\tentailment",
    ])


def test_bad_rows_error_names_file_line_and_skip_option(tmp_path):
    path = rte_with_bad_rows(tmp_path)
    with pytest.raises(PrepareError) as err:
        build_source("rte", glue("rte", {"train": path}))
    msg = str(err.value)
    assert f"{path}:3:" in msg and "prepare.local.rte.on_bad_rows: skip" in msg


def test_bad_rows_skipped_and_counted(tmp_path):
    prepared = build_source("rte", glue("rte", {"train": rte_with_bad_rows(tmp_path)}, on_bad_rows="skip"))
    assert prepared.splits["train"]["id"] == ["0", "3"]
    assert prepared.skips.as_dict() == {"rows with a wrong number of columns": 2, "rows with an unknown label": 1}


def test_unparsable_score(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    path = write(tmp_path / "stsb.tsv", [
        header,
        "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\tA plane takes off.\t5.000",
        "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man plays.\tA man plays a flute.\tfive",
    ])
    with pytest.raises(PrepareError, match=rf"{path}:3: score 'five' is not a number"):
        build_source("stsb", glue("stsb", {"train": path}))
    prepared = build_source("stsb", glue("stsb", {"train": path}, on_bad_rows="skip"))
    assert len(prepared.splits["train"]) == 1 and prepared.skips.as_dict() == {"rows with an unknown score": 1}


def test_undecodable_bytes_name_file_line_and_encoding_fixes_it(tmp_path):
    path = write(tmp_path / "sst2.tsv", ["sentence\tlabel", "fine\t1", "caf\u00e9 \u2014 good\t1"], encoding="cp1252")
    with pytest.raises(PrepareError) as err:
        build_source("sst2", glue("sst2", {"train": path}))
    msg = str(err.value)
    assert f"{path}:3:" in msg and "0xe9" in msg and "prepare.local.sst2.encoding" in msg and "cp1252" in msg
    prepared = build_source("sst2", glue("sst2", {"train": path}, encoding="cp1252"))
    assert prepared.splits["train"]["text_a"] == ["fine", "caf\u00e9 \u2014 good"]


def test_missing_file_names_params_key(tmp_path):
    with pytest.raises(PrepareError) as err:
        build_source("rte", glue("rte", {"train": tmp_path / "nope.tsv"}))
    assert "nope.tsv does not exist" in str(err.value) and "prepare.local.rte.files.train" in str(err.value)


def test_wrong_task_for_file_is_named(tmp_path, shared_data):
    with pytest.raises(PrepareError, match=r"no column\(s\) \['question1', 'question2'\].*task"):
        build_source("qqp", glue("qqp", {"train": shared_data / "glue" / "RTE" / "dev.tsv"}))


def test_a_renamed_label_column_is_an_error_naming_the_columns(tmp_path, shared_data):
    """A train file whose label column is not where the task expects it is refused, not read as unlabeled."""
    lines = (shared_data / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()
    path = write(tmp_path / "train.tsv", ["sentence\tsentiment"] + lines[1:])
    with pytest.raises(PrepareError) as err:
        build_source("sst2", glue("sst2", {"train": path}))
    msg = str(err.value)
    assert "no label column 'label'" in msg and "'sentiment'" in msg and f"{path}:1" in msg
    # the same file as a test split is fine: GLUE test files have no labels
    prepared = build_source("sst2", glue("sst2", {"test": path}))
    assert set(prepared.splits["test"]["label"]) == {-1}


def test_labels_of_another_task_are_refused_naming_both_sets(tmp_path, shared_data):
    rte_dev = shared_data / "glue" / "RTE" / "dev.tsv"
    header, *body = rte_dev.read_text(encoding="utf-8").splitlines()
    # RTE's columns under MNLI's names: the layout fits, the labels (not_entailment) do not
    path = write(tmp_path / "train.tsv", [header.replace("label", "gold_label")] + body)
    with pytest.raises(PrepareError) as err:
        build_source("mnli", glue("mnli", {"train": path}, on_bad_rows="skip"))
    msg = str(err.value)
    assert "'not_entailment'" in msg and "'contradiction'" in msg and "prepare.local.mnli.task" in msg


def test_cola_refuses_an_sst2_file(tmp_path, shared_data):
    path = shared_data / "glue" / "SST-2" / "dev.tsv"
    with pytest.raises(PrepareError, match=r"have no header line.*SST-2"):
        build_source("cola", glue("cola", {"train": path}))


def test_a_file_read_in_the_wrong_encoding_gives_a_short_message(tmp_path, shared_data):
    """UTF-8 read as UTF-16 decodes to one garbled 'line'; the error quotes only the start of it."""
    text = (shared_data / "glue" / "SST-2" / "dev.tsv").read_bytes()
    path = tmp_path / "train.tsv"
    path.write_bytes(text[: len(text) // 2 * 2])  # an even byte count: utf-16 decodes without an error
    with pytest.raises(PrepareError) as err:
        build_source("sst2", glue("sst2", {"train": path}, encoding="utf-16"))
    assert "encoding" in str(err.value) and len(str(err.value)) < 800
