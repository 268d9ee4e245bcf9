"""Carving ``dev`` and ``test`` out of ``train`` (``carve:`` of a local or hub dataset), by groups.

A random row split leaks whenever rows share text: two GLUE pairs with the same first sentence, two SQuAD
questions on one article, two paragraphs of one document. So rows are grouped first and whole groups are
drawn: SQuAD rows by article title (the context when titles are empty), classification rows by sentence,
with pair rows joined into one group when they share either sentence (connected components of the
row-sentence graph, so a sentence never sits on both sides of a split), corpus rows by document.
"""

from __future__ import annotations

import random

import numpy as np
from datasets import Dataset
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from distillpipe.config.prepare import CarveConfig
from distillpipe.data.sources.base import Prepared, PrepareError

__all__ = ["carve_splits", "row_groups"]


def row_groups(ds: Dataset, task_type: str) -> np.ndarray:
    """(N,) int group id per row: rows with one id must stay in one split."""
    if task_type == "qa":
        keys = [t.strip() or c for t, c in zip(ds["title"], ds["context"])]
        return _ids(keys)
    if task_type == "corpus":
        return _ids(ds["doc_id"])
    texts = [ds["text_a"]] + ([ds["text_b"]] if "text_b" in ds.column_names else [])
    sentence = {}  # normalised sentence -> node id after the N row nodes
    edges_row, edges_sentence = [], []
    for column in texts:
        for i, text in enumerate(column):
            key = " ".join(text.split()).lower()
            edges_row.append(i)
            edges_sentence.append(len(ds) + sentence.setdefault(key, len(sentence)))
    n = len(ds) + len(sentence)
    graph = coo_matrix((np.ones(len(edges_row), dtype=np.int8), (edges_row, edges_sentence)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    return labels[: len(ds)]


def _ids(keys: list[str]) -> np.ndarray:
    index: dict[str, int] = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)


def carve_splits(name: str, prepared: Prepared, carve: CarveConfig) -> Prepared:
    """``prepared`` with ``dev``/``test`` rows moved out of ``train`` by a seeded draw of whole groups; every split
    keeps its rows in their original order."""
    train = prepared.splits["train"]
    groups = row_groups(train, prepared.task_type)
    order = _first_seen(groups)
    n = len(order)
    wanted = {s: getattr(carve, s) for s in ("dev", "test") if getattr(carve, s) > 0}
    counts = {s: max(1, round(n * f)) for s, f in wanted.items()}
    if n - sum(counts.values()) < 1:
        raise PrepareError(f"prepare: dataset {name}: train has {n:,} groups (rows sharing a "
                           f"{'title' if prepared.task_type == 'qa' else 'sentence or document'} form one), too few "
                           f"to carve {counts} from it and keep a train split; lower carve fractions or add rows")
    shuffled = list(order)
    random.Random(carve.seed).shuffle(shuffled)
    assigned: dict[int, str] = {}
    lo = 0
    for split, k in counts.items():
        for g in shuffled[lo: lo + k]:
            assigned[g] = split
        lo += k
    where = np.array([assigned.get(g, "train") for g in groups.tolist()])
    splits = dict(prepared.splits)
    splits["train"] = train.select(np.flatnonzero(where == "train"))
    for split in counts:
        splits[split] = train.select(np.flatnonzero(where == split))
    ordered = {s: splits[s] for s in ("train", "dev", "test") if s in splits}
    ordered.update({s: d for s, d in splits.items() if s not in ordered})
    return Prepared(splits=ordered, task_type=prepared.task_type, label_names=prepared.label_names,
                    text_fields=prepared.text_fields, skips=prepared.skips, provenance=prepared.provenance)


def _first_seen(groups: np.ndarray) -> list[int]:
    """Group ids in order of their first row (a stable order to shuffle from)."""
    _, first = np.unique(groups, return_index=True)
    return [int(groups[i]) for i in np.sort(first)]
