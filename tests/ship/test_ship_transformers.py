"""An exported student loads in transformers alone (``trust_remote_code``: the folder's configuration_*.py and
modeling_*.py), in a child process where importing distillpipe fails, and predicts what ``distillpipe predict``
predicts, example by example on the test splits: logits within 1e-5 of distillpipe's own module on the same token
ids, the same labels, bin probabilities and QA spans. This is also the test that the re-implemented forwards in
ship/hf/ stay equal to the students' modules.

ELMo is tested as ELMo-C only: an ELMo-A or ELMo-Sub classification student has the same modules and forward (the
variants differ in the language model's output layer, which a classification student does not have), which
test_elmo_variants_share_one_classifier checks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _ship_tiny import ELMO, MINIALBERT, evaluated_run, export_kwargs, make_run
from datasets import load_from_disk
from scipy.special import softmax

from distillpipe.ship.bundle import load_model, read_config
from distillpipe.ship.export import export_run
from distillpipe.ship.predict import Predictor, Row
from distillpipe.ship.remote_code import CLASS_NAMES, DIFFCAT_REASON, TEMPLATES, files
from distillpipe.students import STUDENTS, build_student

PROBE = Path(__file__).with_name("_hf_probe.py")
TOL = 1e-5


@pytest.fixture(scope="session")
def pair_run(tmp_path_factory):
    """Sentence-pair regression on bins, MiniALBERT with the joint encoding (what the pipeline can feed)."""
    return make_run(tmp_path_factory.mktemp("pair"), "minialbert-joint", task="regression", model=MINIALBERT,
                    encoding="joint", head="mlp")


@pytest.fixture(scope="session")
def pair_exported(tmp_path_factory, pair_run):
    folder = tmp_path_factory.mktemp("exported") / pair_run["run"]
    export_run(pair_run["run"], **export_kwargs(pair_run, folder))
    return folder


@pytest.fixture(scope="session")
def elmo_exported(tmp_path_factory, cls_run):
    """An ELMo-C student with an MLP head (as finetune@elmo-c-polarity) on the classification run's tokens, evaluated
    and exported: only the student is new (its data, tokens and teacher are cls_run's)."""
    r = evaluated_run(tmp_path_factory.mktemp("elmo"), "elmo-c-toy", prepared=cls_run["prepared"],
                      tokens=cls_run["tokens"], teacher=cls_run["teacher"], model=ELMO, encoding="joint", head="mlp",
                      bin_width=None)
    folder = tmp_path_factory.mktemp("exported") / r["run"]
    export_run(r["run"], **export_kwargs(r, folder))
    return folder


def _rows(prepared, fields):
    test = load_from_disk(str(prepared))["test"]
    return [list(r) for r in zip(*(test[f] for f in fields))]


@pytest.fixture(scope="module")
def hf(exported, pair_exported, elmo_exported, cls_run, reg_run, pair_run, qa_run, tmp_path_factory):
    """One child interpreter (``python -I``, distillpipe blocked) runs every job; its results by job name."""
    jobs = {
        "cmow": {"folder": str(exported["classification"]), "kind": "classification",
                 "rows": _rows(cls_run["prepared"], ["text_a"])},
        "minialbert_diffcat": {"folder": str(exported["regression"]), "kind": "diffcat",
                               "rows": _rows(reg_run["prepared"], ["text_a", "text_b"])},
        "minialbert_pair": {"folder": str(pair_exported), "kind": "pair",
                            "rows": _rows(pair_run["prepared"], ["text_a", "text_b"])},
        "waldorf_qa": {"folder": str(exported["qa"]), "kind": "qa",
                       "rows": _rows(qa_run["prepared"], ["question", "context"])},
        "elmo": {"folder": str(elmo_exported), "kind": "classification",
                 "rows": _rows(cls_run["prepared"], ["text_a"])},
    }
    tmp = tmp_path_factory.mktemp("hf")
    (tmp / "jobs.json").write_text(json.dumps(list(jobs.values())))
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp / "hf_home"), "OMP_NUM_THREADS": "1",
           "TRANSFORMERS_VERBOSITY": "error", "HOME": str(tmp)}
    # -I: no PYTHONPATH, no user site, no current directory; the probe also blocks `import distillpipe` (the
    # editable install's .pth would otherwise put src/ on the path) and drops src/ from sys.path
    res = subprocess.run([sys.executable, "-I", str(PROBE), str(tmp / "jobs.json"), str(tmp / "out.json")],
                         capture_output=True, text=True, env=env, cwd=tmp, stdin=subprocess.DEVNULL, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads((tmp / "out.json").read_text())
    return {"meta": out, **dict(zip(jobs, out["jobs"])), "jobs": jobs}


def _distillpipe_logits(folder, **ids):
    """distillpipe's own module (as predict loads it) on one row of token ids."""
    model, _ = load_model(folder, torch.device("cpu"))
    batch = {k: torch.tensor([v]) for k, v in ids.items()}
    for prefix in ("", "a_", "b_"):
        if f"{prefix}input_ids" in batch:
            batch[f"{prefix}attention_mask"] = torch.ones_like(batch[f"{prefix}input_ids"]).bool()
    with torch.inference_mode():
        return model(batch)


def _predict(folder, rows):
    records, _ = Predictor(folder).predict([Row(i + 1, tuple(r)) for i, r in enumerate(rows)])
    return records


def _scores(pipeline_out):
    """{label: score} of one row's text-classification output (top_k=None: every label)."""
    while isinstance(pipeline_out, list) and len(pipeline_out) == 1 and isinstance(pipeline_out[0], list):
        pipeline_out = pipeline_out[0]
    return {d["label"]: d["score"] for d in pipeline_out}


def test_loaded_by_transformers_alone(hf, exported):
    assert hf["meta"]["distillpipe_blocked"] and not hf["meta"]["distillpipe_in_modules"]
    for name in ("cmow", "minialbert_diffcat", "minialbert_pair", "waldorf_qa", "elmo"):
        job = hf[name]
        assert job["model_module"].startswith("transformers_modules."), job["model_module"]  # the folder's code
        assert job["loading_info"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [],
                                       "error_msgs": []}, name
        assert job["tokenizer_class"].startswith("Bert")
    assert hf["cmow"]["model_class"] == "CMOWHybridForSequenceClassification"
    assert hf["waldorf_qa"]["model_class"] == "WaLDORfForQuestionAnswering"
    assert hf["elmo"]["model_class"] == "ElmoForSequenceClassification"
    config = read_config(exported["qa"])  # still distillpipe's own record
    assert config["auto_map"]["AutoModelForQuestionAnswering"] == "modeling_waldorf.WaLDORfForQuestionAnswering"
    assert set(config["transformers"]["files"]) <= set(os.listdir(exported["qa"]))


def _classification_equals_predict(folder, job, rows):
    """Per row: transformers' logits equal distillpipe's module's on the same ids, and the pipeline's label and
    probabilities equal ``predict``'s; the rows' token ids."""
    records = _predict(folder, rows)
    labels = []
    for row, rec in zip(job["rows"], records):
        ours = _distillpipe_logits(folder, input_ids=row["input_ids"]).logits[0].numpy()
        np.testing.assert_allclose(row["logits"], ours, atol=TOL)
        scores = _scores(row["pipeline"])
        assert max(scores, key=scores.get) == rec["label"]
        np.testing.assert_allclose([scores[k] for k in rec["probabilities"]], list(rec["probabilities"].values()),
                                   atol=TOL)
        labels.append(rec["label"])
    assert len(set(labels)) == 2, "a constant predictor would make this test vacuous"
    assert sum(len(r["input_ids"]) == 32 for r in job["rows"]) == 2  # the two long rows, cut as training cut them


def test_cmow_classification_equals_predict(hf, exported):
    _classification_equals_predict(exported["classification"], hf["cmow"], hf["jobs"]["cmow"]["rows"])


def test_elmo_classification_equals_predict(hf, elmo_exported):
    """ELMo-C features (forward and backward LSTMs with projections over the word-vector table, the scalar mix, mean
    pool) under an MLP head: predict pads rows into batches, transformers runs each row alone."""
    _classification_equals_predict(elmo_exported, hf["elmo"], hf["jobs"]["elmo"]["rows"])
    config = read_config(elmo_exported)
    assert config["transformers"] == {"files": files("elmo", "classification"), "limits": None}
    assert config["auto_map"]["AutoModelForSequenceClassification"] == "modeling_elmo.ElmoForSequenceClassification"
    card = (elmo_exported / "README.md").read_text()
    assert "ELMo-C biLM features" in card and "AutoModelForSequenceClassification.from_pretrained" in card
    assert "library_name: transformers" in card


def test_elmo_variants_share_one_classifier(cls_run):
    """ELMo-C, -A and -Sub classification students have the same parameters (names and shapes) and the same forward:
    one state dict gives all three the same logits, so the exported ELMo-C covers the other two."""
    from distillpipe.config.base import build
    from distillpipe.config.students import ElmoConfig

    task = cls_run["task"]  # joint, MLP head
    models = {}
    for output in ("continuous", "adaptive", "subword"):
        torch.manual_seed(0)
        models[output] = build_student(build(ElmoConfig, ELMO | {"output": output}, "model"), task).eval()
    state = models["continuous"].state_dict()
    state["input_vectors"].normal_()
    batch = {"input_ids": torch.tensor([[2, 16, 17, 3, 0], [2, 35, 36, 37, 3]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1] * 5]).bool()}
    logits = []
    for model in models.values():
        assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in state.items()}
        model.load_state_dict(state, strict=True)
        with torch.inference_mode():
            logits.append(model(batch).logits)
    assert torch.equal(logits[0], logits[1]) and torch.equal(logits[0], logits[2])


def test_every_architecture_ships_code():
    assert set(CLASS_NAMES) == set(STUDENTS)
    for key, name in CLASS_NAMES.items():
        for f in files(key, "classification"):
            assert (TEMPLATES / f).is_file(), f
        assert f"class {name}ForSequenceClassification(" in (TEMPLATES / f"modeling_{key}.py").read_text()


def test_minialbert_pair_regression_equals_predict(hf, pair_exported):
    job, rows = hf["minialbert_pair"], hf["jobs"]["minialbert_pair"]["rows"]
    records = _predict(pair_exported, rows)
    config = read_config(pair_exported)
    values = {label: float(label) for label in config["id2label"].values()}
    for row, rec in zip(job["rows"], records):
        ours = _distillpipe_logits(pair_exported, input_ids=row["input_ids"], token_type_ids=row["token_type_ids"])
        np.testing.assert_allclose(row["logits"], ours.logits[0].numpy(), atol=TOL)
        scores = _scores(row["pipeline"])  # the probability of each bin, named by its value
        assert sum(p * values[k] for k, p in scores.items()) == pytest.approx(rec["score"], abs=TOL)
    assert np.ptp([r["score"] for r in records]) > 0.01


def test_minialbert_diffcat_loads_but_the_pipeline_says_why_not(hf, exported):
    folder, job, rows = exported["regression"], hf["minialbert_diffcat"], hf["jobs"]["minialbert_diffcat"]["rows"]
    records = _predict(folder, rows)
    bin_width = read_config(folder)["task"]["bin_width"]
    for row, rec in zip(job["rows"], records):
        ours = _distillpipe_logits(folder, a_input_ids=row["a_input_ids"], b_input_ids=row["b_input_ids"])
        np.testing.assert_allclose(row["logits"], ours.logits[0].numpy(), atol=TOL)
        expected = softmax(np.asarray(row["logits"], np.float64)) @ (np.arange(len(row["logits"])) * bin_width)
        assert expected == pytest.approx(rec["score"], abs=TOL)
    assert "DiffCat" in job["pipeline_error"] and "a_input_ids" in job["pipeline_error"]
    assert read_config(folder)["transformers"]["limits"] == DIFFCAT_REASON


def test_waldorf_qa_equals_predict(hf, exported):
    folder, job, rows = exported["qa"], hf["waldorf_qa"], hf["jobs"]["waldorf_qa"]["rows"]
    records = _predict(folder, rows)
    for row, rec in zip(job["rows"], records):
        ours = _distillpipe_logits(folder, input_ids=row["input_ids"], token_type_ids=row["token_type_ids"])
        np.testing.assert_allclose(row["start"], ours.start_logits[0].numpy(), atol=TOL)
        np.testing.assert_allclose(row["end"], ours.end_logits[0].numpy(), atol=TOL)
        got = row["pipeline"]
        assert (got["answer"], got["has_answer"], got["best_span"]) == (rec["answer"], rec["has_answer"],
                                                                        rec["best_span"])
        # a sum of four logits, each within TOL (predict pads windows into batches: the last bits move)
        assert got["no_answer_score"] == pytest.approx(rec["no_answer_score"], abs=4 * TOL)
    assert {r["has_answer"] for r in records} == {True, False}, "both outcomes, or the test is vacuous"
