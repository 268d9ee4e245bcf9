"""On the embedded pipeline's own test sets (prepared and tokenized by the real stages from the real params.yaml,
with the MiniLM tokenizer), an exported student's predictions from the raw test text are the evaluate stage's,
example by example. The students have random weights and the teachers are tiny: the test is about the path from
text to prediction (tokenizer, truncation, windows, batching, forward, read-out), not about quality."""

import json
from pathlib import Path

import pytest
from _ship_tiny import CMOW, WALDORF, evaluated_run, export_kwargs
from datasets import load_from_disk
from typer.testing import CliRunner

from distillpipe.assets import TOKENIZER_FILES, resolve_model
from distillpipe.cli import app
from distillpipe.config.base import load_section
from distillpipe.config.prepare import PrepareConfig
from distillpipe.config.tokenize import TokenizeConfig
from distillpipe.data.prepare import prepare_dataset
from distillpipe.data.tokenize import tokenize_dataset
from distillpipe.evaluate.squad import exact_match, f1_score, gold_answers
from distillpipe.ship.export import export_run

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
runner = CliRunner()


def _embedded(root: Path, name: str) -> tuple[Path, Path]:
    prepare = load_section(PARAMS, "prepare", PrepareConfig)
    prepared, tokens = root / "data" / "prepared" / name, root / "data" / "tokens" / name
    prepare_dataset(name, prepare.dataset(name), prepared, prepare.wiki_articles)
    tokenize_dataset(name, prepared, load_section(PARAMS, "tokenize", TokenizeConfig), tokens)
    return prepared, tokens


def _tiny_teacher(path: Path, *, qa: bool, num_labels: int = 2) -> Path:
    """A random 1-layer BERT with the MiniLM tokenizer's vocabulary and files (evaluate scores a teacher too)."""
    import shutil

    import torch
    from transformers import BertConfig, BertForQuestionAnswering, BertForSequenceClassification

    minilm = resolve_model("embedded:minilm-l6")
    path.mkdir(parents=True)
    for f in TOKENIZER_FILES:
        if (minilm / f).is_file():
            shutil.copyfile(minilm / f, path / f)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, num_labels=num_labels)
    (BertForQuestionAnswering if qa else BertForSequenceClassification)(cfg).save_pretrained(path)
    return path


def _check(r: dict, folder: Path, tmp_path: Path) -> list[dict]:
    test = load_from_disk(str(r["prepared"]))["test"]
    fields = ["question", "context"] if "question" in test.column_names else \
        ["text_a", "text_b"] if "text_b" in test.column_names else ["text_a"]
    header = ["id", *(["question", "context"] if fields[0] == "question" else ["sentence1", "sentence2"][:len(fields)])]
    rows = [[str(v).replace("\t", " ").replace("\n", " ").replace("\r", " ") for v in row]
            for row in zip(test["id"], *(test[f] for f in fields))]
    (tmp_path / "test.tsv").write_text("\n".join("\t".join(x) for x in [header, *rows]) + "\n")
    res = runner.invoke(app, ["predict", str(folder), "--input", str(tmp_path / "test.tsv"), "--out",
                              str(tmp_path / "p.jsonl")])
    assert res.exit_code == 0, res.output
    got = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    evaluated = {e["id"]: e for e in json.loads(r["predictions"].read_text())["student"]["test"]}
    assert [g["id"] for g in got] == list(test["id"]) and set(evaluated) == set(test["id"])
    if fields[0] == "question":
        golds = {ex["id"]: gold_answers(ex["answers"]["text"]) for ex in test}
        for g in got:
            e = evaluated[g["id"]]
            assert max(exact_match(a, g["answer"]) for a in golds[g["id"]]) == e["em"], g
            assert max(f1_score(a, g["answer"]) for a in golds[g["id"]]) == pytest.approx(e["f1"]), g
            # the best non-null span too, whether or not the threshold lets the model answer
            assert max(f1_score(a, g["best_span"]) for a in golds[g["id"]]) == pytest.approx(e["span_f1"]), g
    else:
        assert {g["id"]: g["label_id"] for g in got} == {i: e["pred"] for i, e in evaluated.items()}
        assert len({g["label_id"] for g in got}) > 1
    return got


def test_polarity(tmp_path):
    prepared, tokens = _embedded(tmp_path, "polarity")
    teacher = _tiny_teacher(tmp_path / "models" / "teacher" / "polarity", qa=False)
    r = evaluated_run(tmp_path, "hybrid-polarity", prepared=prepared, tokens=tokens, teacher=teacher, model=CMOW,
                      encoding="joint", head="mlp", bin_width=None)
    export_run(r["run"], **export_kwargs(r, tmp_path / "exported"))
    got = _check(r, tmp_path / "exported", tmp_path)
    assert len(got) == 20  # gensim's 200 sentences: 140 / 40 / 20


@pytest.mark.slow
def test_wiki_pairs_diffcat(tmp_path):
    prepared, tokens = _embedded(tmp_path, "wiki_pairs")
    teacher = _tiny_teacher(tmp_path / "models" / "teacher" / "wiki_pairs", qa=False)
    r = evaluated_run(tmp_path, "hybrid-wiki_pairs", prepared=prepared, tokens=tokens, teacher=teacher, model=CMOW,
                      encoding="diffcat", head="mlp", bin_width=None)
    export_run(r["run"], **export_kwargs(r, tmp_path / "exported"))
    assert len(_check(r, tmp_path / "exported", tmp_path)) == 996


@pytest.mark.slow
def test_wiki_qa(tmp_path):
    prepared, tokens = _embedded(tmp_path, "wiki_qa")
    teacher = _tiny_teacher(tmp_path / "models" / "teacher" / "wiki_qa", qa=True)
    r = evaluated_run(tmp_path, "waldorf-baseline", prepared=prepared, tokens=tokens, teacher=teacher,
                      model={**WALDORF, "init_std": 0.5}, encoding="joint", head=None, bin_width=None)
    export_run(r["run"], **export_kwargs(r, tmp_path / "exported"))
    got = _check(r, tmp_path / "exported", tmp_path)
    assert len(got) == 858 and len({g["best_span"] for g in got}) > 100
