"""Datasets from the Hugging Face hub: GLUE tasks (``glue/<task>``), SQuAD (``squad``,
``squad_v2``) and any corpus with a text column. Offline, this fails within seconds with the
``params.yaml`` snippet that reads the same data from local files instead."""

from __future__ import annotations

import logging

from datasets import Dataset

from distillpipe.assets import hub_offline_reason
from distillpipe.config.prepare import HubConfig
from distillpipe.data.features import FEATURES, features_for
from distillpipe.data.sources.base import Prepared, PrepareError, Skips
from distillpipe.data.sources.glue import TASKS as GLUE_TASKS

logger = logging.getLogger(__name__)

GLUE_REPO = "nyu-mll/glue"
SQUAD_REPOS = {"squad": "rajpurkar/squad", "squad_v2": "rajpurkar/squad_v2"}
# Hub column names of each GLUE task: (text_a, text_b); every task also has ``label`` and ``idx``.
GLUE_COLUMNS = {
    "cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"), "qqp": ("question1", "question2"), "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2"),
}
# Folder names of the original GLUE download (download_glue_data.py).
GLUE_DIRS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "mnli": "MNLI",
             "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}


def resolve(cfg: HubConfig) -> tuple[str, str, str | None]:
    """(kind, hub repo, hub subset) with kind ``glue:<task>``, ``squad`` or ``corpus``."""
    name = cfg.name.strip("/")
    head, _, tail = name.rpartition("/")
    if head in ("glue", GLUE_REPO) or name in ("glue", GLUE_REPO):
        task = (cfg.subset or "") if name in ("glue", GLUE_REPO) else tail
        if task not in GLUE_COLUMNS:
            raise PrepareError(f"hub name {cfg.name!r} (subset {cfg.subset!r}): unknown GLUE task; "
                               f"known: {sorted(GLUE_COLUMNS)}")
        return f"glue:{task}", GLUE_REPO, task
    short = name.rpartition("/")[2]
    if short in SQUAD_REPOS and (not head or SQUAD_REPOS[short] == name):
        return "squad", SQUAD_REPOS[short], cfg.subset
    return "corpus", name, cfg.subset


def _offline_snippet(name: str, kind: str) -> str:
    carve = "      carve: {dev: 0.1, test: 0.0, seed: 0}   # dev selects the model; the official dev is the test"
    if kind.startswith("glue:"):
        task = kind.split(":", 1)[1]
        devs = ["dev_matched", "dev_mismatched"] if task == "mnli" else ["dev"]
        files = ", ".join(["train: train.tsv", *(f"{d.replace('dev', 'test')}: {d}.tsv" for d in devs)])
        fmt = (f"      format: glue\n      task: {task}\n      path: data/raw/{GLUE_DIRS[task]}\n"
               f"      files: {{{files}}}\n      encoding: utf-8\n      on_bad_rows: error\n{carve}")
    elif kind == "squad":
        fmt = ("      format: squad\n      path: data/raw/squad\n"
               "      files: {train: train-v2.0.json, test: dev-v2.0.json}\n"
               f"      encoding: utf-8\n{carve}")
    else:
        fmt = ("      format: jsonl              # or text: documents separated by blank lines\n"
               "      path: data/raw/corpus\n      files: {train: train.jsonl, dev: dev.jsonl}\n"
               "      text_field: text\n      encoding: utf-8\n      on_bad_rows: error\n      carve: null")
    return f"prepare:\n  local:\n    {name}:\n{fmt}"


def map_hub_split(kind: str, ds: Dataset, cfg: HubConfig, skips: Skips) -> Dataset:
    """One hub split in our schema (columns, dtypes and label ids)."""
    if kind.startswith("glue:"):
        task = kind.split(":", 1)[1]
        a, b = GLUE_COLUMNS[task]
        names = GLUE_TASKS[task].label_names
        hub_names = getattr(ds.features.get("label"), "names", None)
        if names is not None and hub_names is not None and list(hub_names) != list(names):
            raise PrepareError(f"hub {cfg.name}: label names {hub_names} differ from the expected {list(names)}")
        text_fields = ["text_a"] + (["text_b"] if b else [])
        task_type = "classification" if names is not None else "regression"

        def glue(batch: dict) -> dict:
            out = {"id": [str(i) for i in batch["idx"]], "text_a": batch[a], "label": batch["label"]}
            if b:
                out["text_b"] = batch[b]
            return out

        return ds.map(glue, batched=True, remove_columns=ds.column_names, features=features_for(task_type, text_fields))
    if kind == "squad":
        return ds.select_columns(list(FEATURES["qa"])).cast(FEATURES["qa"])
    if cfg.text_field not in ds.column_names:
        raise PrepareError(
            f"hub {cfg.name}: no column {cfg.text_field!r} (columns: {ds.column_names}); "
            "set `text_field` to one of them"
        )
    ids = "id" if "id" in ds.column_names else None

    def corpus(batch: dict, indices: list[int]) -> dict:
        keep = [i for i, t in enumerate(batch[cfg.text_field]) if isinstance(t, str) and t.strip()]
        return {
            "doc_id": [str(batch[ids][i]) if ids else str(indices[i]) for i in keep],
            "text": [batch[cfg.text_field][i] for i in keep],
        }

    out = ds.map(corpus, batched=True, with_indices=True, remove_columns=ds.column_names, features=FEATURES["corpus"])
    skips.add("empty documents", len(ds) - len(out))
    return out


def build_hub(name: str, cfg: HubConfig) -> Prepared:
    key = f"prepare.datasets.{name}"
    kind, repo, subset = resolve(cfg)
    reason = hub_offline_reason()
    if reason is not None:
        raise PrepareError(
            f"{key}: the Hugging Face hub is unreachable ({reason}), so {cfg.name!r} cannot be downloaded. "
            "Download the data on a connected machine, copy the files into a folder here and read them from "
            f"`prepare.local` in params.yaml instead (move the entry there), e.g.\n{_offline_snippet(name, kind)}"
        )
    from datasets import load_dataset
    from huggingface_hub import HfApi

    if not cfg.splits:
        raise PrepareError(f"{key}.splits is empty; "
                           "map our split names to hub splits, e.g. {train: train, test: validation}")
    # one commit for every split, recorded in meta.json (a DVC output): a moved branch cannot mix two versions
    sha = HfApi().dataset_info(repo, revision=cfg.revision).sha
    if cfg.revision != sha:
        logger.warning("%s: hub dataset %s resolved to commit %s; pin it (%s.revision: %s) so that a moved hub "
                       "dataset changes params.yaml instead of slipping in unnoticed", key, repo, sha, key, sha)
    skips = Skips()
    splits = {}
    for ours, theirs in cfg.splits.items():
        logger.info("loading %s (%s) split %s at %s from the hub", repo, subset, theirs, sha[:12])
        ds = load_dataset(repo, subset, split=theirs, revision=sha)
        splits[ours] = map_hub_split(kind, ds, cfg, skips)
    provenance = {"hub_repo": repo, "hub_revision": sha}
    if kind.startswith("glue:"):
        task = GLUE_TASKS[kind.split(":", 1)[1]]
        text_fields = ["text_a"] + (["text_b"] if task.text_b else [])
        task_type = "classification" if task.label_names else "regression"
        return Prepared(splits, task_type, list(task.label_names or []), text_fields, skips, provenance)
    if kind == "squad":
        return Prepared(splits, "qa", [], ["question", "context"], skips, provenance)
    return Prepared(splits, "corpus", [], ["text"], skips, provenance)
