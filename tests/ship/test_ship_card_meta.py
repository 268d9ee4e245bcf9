"""The model card's front matter follows the Hub's conventions: parsed back offline by huggingface_hub's own
``ModelCard`` / ``metadata_load`` and ``model_index_to_eval_results``, its model-index holds every dev/test score of
the evaluate stage's record (checked against the record, key by key), and its license is the exporter's choice or
the base teacher's, as the teacher's own model card declares it."""

import json
import math

import pytest
import yaml
from _ship_tiny import export_kwargs
from huggingface_hub import ModelCard, metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results

from distillpipe.assets import resolve_model
from distillpipe.ship.card_meta import LicenseError, choose_license, front_matter, teacher_origin
from distillpipe.ship.export import export_run

NOT_SCORES = {"total", "HasAns_total", "NoAns_total", "tuned_threshold", "reachable_best_exact_thresh",
              "best_exact_thresh", "best_f1_thresh"}
"""Keys of the evaluate stage's records that are counts or thresholds (written out by hand, from squad.py)."""
PIPELINE_TAG = {"classification": "text-classification", "regression": "text-classification",
                "qa": "question-answering"}


@pytest.mark.parametrize("kind", ["classification", "regression", "qa"])
def test_every_score_is_in_the_model_index(exported, cls_run, reg_run, qa_run, kind):
    run = {"classification": cls_run, "regression": reg_run, "qa": qa_run}[kind]
    card_path = exported[kind] / "README.md"
    card = ModelCard.load(card_path, ignore_metadata_errors=False)  # raises on a model-index it cannot parse
    record = json.loads(run["metrics"].read_text())
    data = card.data
    assert data.license == "apache-2.0" and data.pipeline_tag == PIPELINE_TAG[kind]
    assert data.library_name == "transformers"  # these three architectures ship transformers code (item 1)
    assert data.datasets == [record["dataset"]]
    expected = {(split, k, v) for split in ("dev", "test") for k, v in (record[split] or {}).items()
                if k not in NOT_SCORES and math.isfinite(v)}
    got = {(e.dataset_split, e.metric_name, e.metric_value) for e in data.eval_results}
    assert got == expected and len(got) == len(data.eval_results)
    assert {e.task_type for e in data.eval_results} == {PIPELINE_TAG[kind]}
    assert {e.dataset_name for e in data.eval_results} == {record["dataset"]}
    if kind == "qa":
        assert {"exact", "f1", "HasAns_f1", "NoAns_exact", "best_f1"} <= {k for _, k, _ in got}
        assert data.metrics == ["squad_v2"]
        types = {e.metric_name: e.metric_type for e in data.eval_results}
        assert types["exact"] == "exact_match" and types["f1"] == "f1"
    else:
        assert set(data.metrics) <= {"accuracy", "f1", "matthews_correlation", "pearsonr", "spearmanr"}
    # the other reader: metadata_load on the file, model_index_to_eval_results on its model-index
    meta = metadata_load(card_path)
    name, results = model_index_to_eval_results(meta["model-index"])
    assert name == run["run"] and {(e.dataset_split, e.metric_name, e.metric_value) for e in results} == expected


def _params_with(run: dict, tmp_path, **sections) -> object:
    params = yaml.safe_load(run["params"].read_text()) | sections
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def test_license_defaults_to_the_embedded_teachers(cls_run, tmp_path):
    """The embedded MiniLM teacher's own model card declares its license; the student's card takes it, and names
    the Hub repository the teacher's files come from as base_model."""
    teacher_card = metadata_load(resolve_model("embedded:minilm-l6") / "README.md")
    params = _params_with(cls_run, tmp_path, teacher_import={"models": {"base": "embedded:minilm-l6"}})
    out = tmp_path / "out"
    export_run(cls_run["run"], **export_kwargs(cls_run, out, params_path=params, license="teacher"))
    data = ModelCard.load(out / "README.md").data
    assert data.license == teacher_card["license"] == "apache-2.0"
    assert data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert "License: `apache-2.0`, the teacher's (`embedded:minilm-l6`)" in (out / "README.md").read_text()


def _hub_cache(root, repo: str, sha: str, card: str):
    """A Hugging Face cache holding one file of one model, laid out as huggingface_hub lays it out."""
    folder = root / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(sha)
    (folder / "snapshots" / sha).mkdir(parents=True)
    (folder / "snapshots" / sha / "README.md").write_text(card)
    return root


def test_license_of_a_hub_teacher_comes_from_the_local_cache_only(tmp_path):
    cache = _hub_cache(tmp_path / "hub", "org/bert-small", "a" * 40, "---\nlicense: mit\n---\n# bert-small\n")
    for spec in ("org/bert-small", "org/bert-small@" + "a" * 40):
        origin = teacher_origin({"teacher_import": {"models": {"base": spec}}}, hub_cache=cache)
        assert (origin.hub_id, origin.license) == ("org/bert-small", "mit")
        assert choose_license("teacher", origin) == ("mit", f"the teacher's (`{spec}`), as its model card declares "
                                                            "it")
        assert choose_license("cc-by-4.0", origin)[0] == "cc-by-4.0"
    missing = teacher_origin({"teacher_import": {"models": {"base": "org/not-cached"}}}, hub_cache=cache)
    assert missing.license is None and missing.hub_id == "org/not-cached"
    with pytest.raises(LicenseError, match="its model card cannot be read here. Choose the student's license "
                                           "yourself: --license apache-2.0"):
        choose_license("teacher", missing)


def test_a_teacher_without_a_license_is_refused_unless_one_is_chosen(cls_run, tmp_path):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "config.json").write_text("{}")
    (teacher / "README.md").write_text("---\nlanguage: en\n---\nno license here\n")
    params = _params_with(cls_run, tmp_path, teacher_import={"models": {"base": str(teacher)}})
    kw = export_kwargs(cls_run, tmp_path / "out", params_path=params)
    with pytest.raises(LicenseError, match="declares none"):
        export_run(cls_run["run"], **(kw | {"license": "teacher"}))
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    with pytest.raises(LicenseError, match="not a Hub license identifier"):
        export_run(cls_run["run"], **(kw | {"license": "Apache 2.0"}))
    export_run(cls_run["run"], **(kw | {"license": "other"}))
    data = ModelCard.load(tmp_path / "out" / "README.md").data
    assert data.license == "other" and data.base_model is None  # a local folder is no Hub model


def test_hub_datasets_are_named_by_their_hub_id():
    metrics = {"task_type": "classification", "dataset": "sst2", "dev": {"accuracy": 0.9, "f1": float("nan")},
               "test": None}
    params = {"prepare": {"datasets": {"sst2": {"source": "hub", "name": "glue/sst2"}}}}
    config = {"student": "cmow_hybrid"}
    origin = teacher_origin({})
    meta = front_matter(run="r", config=config, metrics=metrics, params=params, license="mit", origin=origin)
    card = ModelCard("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n# r\n", ignore_metadata_errors=False)
    assert card.data.datasets == ["nyu-mll/glue"] and card.data.library_name == "distillpipe"
    (result,) = card.data.eval_results  # nan (a constant prediction's F1 here) has no place in a model-index
    assert (result.dataset_type, result.dataset_config, result.dataset_split, result.metric_value) == \
        ("nyu-mll/glue", "sst2", "dev", 0.9)
