"""Carving ``dev`` and ``test`` out of ``train`` (``carve:`` of a local or hub dataset), by groups.

A random row split leaks whenever rows share text: two GLUE pairs with the same first sentence, two SQuAD
questions on one article, two paragraphs of one document, and a phrase cut from a sentence (SST-2's train rows are
phrases of its sentences: a dev phrase inside a train sentence was seen, word for word, in training). So rows are
grouped first and whole groups are drawn:

* rows sharing a text are one group: SQuAD rows also by article title (the context when titles are empty), corpus
  rows also by document, and pair rows are joined when they share either sentence (connected components of the
  row-text graph, so a sentence never sits on both sides of a split);
* a text inside other texts (whole word sequences, :mod:`distillpipe.data.overlap`) joins the group of the one
  outermost text around it when there is exactly one; a text inside several unrelated texts (a common phrase
  such as "the film") joins no group: it goes to dev (test) only when every outermost text around it went there,
  and stays in train otherwise. Task datasets only: an MLM corpus is grouped by document and equal paragraph
  (containment would index every paragraph of what may be a web-size corpus);
* a last pass checks every containment pair and moves back to train any dev/test group with a text inside a text
  of another split (needed only when pair rows tie phrases together), until none is left.

What this guarantees (task datasets): no dev or test row has a text equal to, or inside, a text of a row of any
other split of the carve (train, or test for dev). Train texts may sit inside dev/test texts (a train phrase "good"
in a dev sentence): that is ordinary language, not a copy of a held-out row. Splits given as files are not changed;
the leakage report of ``prepare`` measures them. Dev/test get about the carve's fraction of train's groups (a
phrase inside sentences of several splits stays in train, so slightly fewer rows).
"""

from __future__ import annotations

import random

import numpy as np
from datasets import Dataset
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from distillpipe.config.prepare import CarveConfig
from distillpipe.data.overlap import TextIndex, build_index, text_columns
from distillpipe.data.sources.base import Prepared, PrepareError

__all__ = ["carve_splits"]

SPLITS = ("train", "dev", "test")


def _keys(ds: Dataset, task_type: str) -> list[str] | None:
    """The group key besides text: the article of a QA row, the document of a corpus row."""
    if task_type == "qa":
        return [t.strip() or c for t, c in zip(ds["title"][:], ds["context"][:])]
    if task_type == "corpus":
        return ds["doc_id"][:]
    return None


def carve_units(index: TextIndex, keys: list[str] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group the rows of ``index``: (row unit (R,), text unit (T,), dependent (U,) bool: units whose texts all sit
    inside several unrelated outermost texts, which are placed after the draw, not drawn)."""
    n_rows, n_texts = index.row_text.shape[0], index.n_texts
    rows, cols = np.nonzero(index.row_text >= 0)
    src = [rows]
    dst = [n_rows + index.row_text[rows, cols]]
    n = n_rows + n_texts
    if keys is not None:
        key_ids: dict[str, int] = {}
        src.append(np.arange(n_rows))
        dst.append(n + np.array([key_ids.setdefault(k, len(key_ids)) for k in keys], dtype=np.int64))
        n += len(key_ids)
    maximal = index.containers() == 0
    roots = maximal[index.outer]
    n_roots = np.bincount(index.inner[roots], minlength=n_texts)
    single = roots & (n_roots[index.inner] == 1)  # a text with one outermost text around it joins that text's group
    src.append(n_rows + index.inner[single])
    dst.append(n_rows + index.outer[single])
    src, dst = np.concatenate(src), np.concatenate(dst)
    graph = coo_matrix((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    _, labels = np.unique(labels, return_inverse=True)  # dense ids
    n_units = int(labels.max()) + 1 if n else 0
    row_unit, text_unit = labels[:n_rows], labels[n_rows: n_rows + n_texts]
    has_anchor = np.zeros(n_units, dtype=bool)  # a maximal text, or a single-root text (joined to its maximal one)
    has_anchor[text_unit[maximal]] = True
    has_text = np.zeros(n_units, dtype=bool)
    has_text[text_unit] = True
    return row_unit, text_unit, has_text & ~has_anchor


def assign_units(index: TextIndex, row_unit: np.ndarray, text_unit: np.ndarray, dependent: np.ndarray,
                 counts: dict[str, int], seed: int) -> np.ndarray:
    """(U,) split code per unit (0 train, 1 dev, 2 test): a seeded draw of ``counts`` drawable units, dependent
    units placed after it, then every containment pair checked (see the module docstring)."""
    n_units = len(dependent)
    order = [int(u) for u in _first_seen(row_unit) if not dependent[u]]
    random.Random(seed).shuffle(order)
    split = np.zeros(n_units, dtype=np.int64)
    lo = 0
    for name, k in counts.items():
        split[order[lo: lo + k]] = SPLITS.index(name)
        lo += k
    maximal = index.containers() == 0
    roots = maximal[index.outer]
    dep = roots & dependent[text_unit[index.inner]]
    if dep.any():  # a dependent unit goes where all the outermost texts around its texts went, else to train
        u, s = text_unit[index.inner[dep]], split[text_unit[index.outer[dep]]]
        lo_s = np.full(n_units, len(SPLITS), dtype=np.int64)
        hi_s = np.full(n_units, -1, dtype=np.int64)
        np.minimum.at(lo_s, u, s)
        np.maximum.at(hi_s, u, s)
        agreed = dependent & (lo_s == hi_s)
        split[agreed] = lo_s[agreed]
    inner_u, outer_u = text_unit[index.inner], text_unit[index.outer]
    while True:  # a held-out text inside a text of another split: its unit goes back to train
        bad = (split[inner_u] > 0) & (split[inner_u] != split[outer_u])
        if not bad.any():
            return split
        split[inner_u[bad]] = 0


def carve_splits(name: str, prepared: Prepared, carve: CarveConfig) -> Prepared:
    """``prepared`` with ``dev``/``test`` rows moved out of ``train`` by a seeded draw of whole groups; every split
    keeps its rows in their original order."""
    train = prepared.splits["train"]
    index = build_index(text_columns(train, prepared.task_type), containment=prepared.task_type != "corpus")
    row_unit, text_unit, dependent = carve_units(index, _keys(train, prepared.task_type))
    n = int((~dependent).sum())
    wanted = {s: getattr(carve, s) for s in ("dev", "test") if getattr(carve, s) > 0}
    counts = {s: max(1, round(n * f)) for s, f in wanted.items()}
    if n - sum(counts.values()) < 1:
        raise PrepareError(f"prepare: dataset {name}: train has {n:,} groups (rows sharing a "
                           f"{'title' if prepared.task_type == 'qa' else 'sentence or document'}, or a text inside "
                           f"another, form one), too few to carve {counts} from it and keep a train split; lower "
                           "carve fractions or add rows")
    split = assign_units(index, row_unit, text_unit, dependent, counts, carve.seed)
    where = split[row_unit]
    splits = dict(prepared.splits)
    splits["train"] = train.select(np.flatnonzero(where == 0))
    for s in counts:
        rows = np.flatnonzero(where == SPLITS.index(s))
        if not len(rows):
            raise PrepareError(f"prepare: dataset {name}: no {s} row is left after keeping texts inside train texts "
                               f"out of {s} (every drawn group has a text inside a train text); raise carve.{s}")
        splits[s] = train.select(rows)
    ordered = {s: splits[s] for s in SPLITS if s in splits}
    ordered.update({s: d for s, d in splits.items() if s not in ordered})
    return Prepared(splits=ordered, task_type=prepared.task_type, label_names=prepared.label_names,
                    text_fields=prepared.text_fields, skips=prepared.skips, provenance=prepared.provenance)


def _first_seen(groups: np.ndarray) -> np.ndarray:
    """Group ids in order of their first row (a stable order to shuffle from)."""
    _, first = np.unique(groups, return_index=True)
    return groups[np.sort(first)]
