"""Word-level overlap between rows: which texts equal or sit inside other texts, and which share most of their
word n-grams. Carving (``sources/carve.py``) keeps contained texts out of held-out splits with it, and ``prepare``
writes the leakage report of every pair of splits (:func:`leakage_report`) into ``meta.json``.

**Words.** A text is the sequence of its lowercased words: runs of letters/digits/underscore and single
punctuation marks (``\\w+|[^\\w\\s]``), so spacing, case and punctuation spacing do not matter ("Good film." and
"good film ." are one text) but word boundaries do: "a good film" is *inside* "not a good film at all", while
"good" is not inside "goods". Containment is of whole word sequences, in order and contiguous.

**Finding containment without a quadratic scan.** Every distinct text becomes one pattern of an Aho-Corasick
automaton (pyahocorasick) over a string with one or two characters per word (a prefix-free code: a word's first
character never continues another word, so every match starts and ends at word boundaries); each text is then
scanned once, and every pattern found in it is a text inside it. Time is linear in the total length plus the
number of (pattern, text) hits, which for phrase-structured data (SST-2's phrases of sentences) is a few per
word (``benchmarks/overlap.py`` measures it on 100k-row phrase sets).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ahocorasick
import numpy as np

__all__ = ["LEAK_MAX_CHARS", "LEAK_WARN_FRACTION", "NGRAM", "NGRAM_FRACTION", "TEXT_COLUMNS", "TextIndex",
           "build_index", "leakage_report", "leakage_warnings", "text_columns", "words"]

WORD = re.compile(r"\w+|[^\w\s]")

TEXT_COLUMNS = {"classification": ("text_a", "text_b"), "regression": ("text_a", "text_b"), "qa": ("context",),
                "corpus": ("text",)}
"""The columns whose texts are compared, per task type. QA compares contexts (a question means nothing without its
paragraph, and a paragraph seen in training is what leaks answers); questions are not compared."""

NGRAM = 8
"""Word n-grams of the near-duplicate measure: long enough that ordinary phrases ("one of the best films of the")
rarely repeat across unrelated rows."""
NGRAM_FRACTION = 0.5
"""A row is a near duplicate of a split when at least this fraction of its word n-grams occur in that split."""
LEAK_MAX_CHARS = 100_000_000
"""The leakage report is skipped (and says so) for datasets of more characters than this (~20 M words): its index
takes ~5 us and ~150 B a word of distinct text (``benchmarks/overlap.py``), which a web-size MLM corpus exceeds."""
LEAK_WARN_FRACTION = 0.01
"""prepare warns (naming the splits and an example) when more than this fraction of a split's rows is equal to,
inside, or a near duplicate of rows of an earlier split."""

_SINGLE = (0x100, 0xD800)          # one character a word: the most frequent ~55k words
_LEAD = (0xE000, 0xF900)           # two characters: a lead character ...
_TRAIL = (0x10000, 0x110000)       # ... and a trail character, never a word's first character


def text_columns(ds: Any, task_type: str) -> list[list[str]]:
    """The compared text columns of a ``datasets.Dataset`` of ``task_type`` (:data:`TEXT_COLUMNS`), as lists."""
    return [ds[c][:] for c in TEXT_COLUMNS[task_type] if c in ds.column_names]


def words(text: str) -> list[str]:
    """The text's lowercased words and punctuation marks (see the module docstring)."""
    return WORD.findall(text.lower())


def _codes(counts: Counter) -> dict[str, str]:
    """A prefix-free code: the most frequent words get one character, the rest a lead + trail pair."""
    n_single = _SINGLE[1] - _SINGLE[0]
    n_trail = _TRAIL[1] - _TRAIL[0]
    ranked = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    if len(ranked) > n_single + (_LEAD[1] - _LEAD[0]) * n_trail:  # ~440 M distinct words: not a real text
        raise ValueError(f"{len(ranked):,} distinct words: more than the overlap index can code")
    code = {w: chr(_SINGLE[0] + i) for i, w in enumerate(ranked[:n_single])}
    for i, w in enumerate(ranked[n_single:]):
        code[w] = chr(_LEAD[0] + i // n_trail) + chr(_TRAIL[0] + i % n_trail)
    return code


@dataclass
class TextIndex:
    """The distinct non-empty texts of some rows and how they overlap.

    ``row_text[r, c]`` is the text id of row ``r``'s ``c``-th text column (-1: no words). ``inner[k]`` sits inside
    ``outer[k]`` (strictly: the two are different texts); every such pair is listed once."""

    n_texts: int
    row_text: np.ndarray      # (R, C) int64
    inner: np.ndarray         # (P,) int64
    outer: np.ndarray         # (P,) int64
    word_ids: list[np.ndarray]  # per text, its words as int64 ids (for n-grams)
    samples: list[str]        # per text, one original spelling (for examples in messages)

    def containers(self) -> np.ndarray:
        """(n_texts,) number of other texts each text is inside."""
        return np.bincount(self.inner, minlength=self.n_texts)


def build_index(columns: Sequence[Sequence[str]], containment: bool = True) -> TextIndex:
    """The overlap index of rows given as text columns (each a sequence of R strings; ``None`` reads as empty);
    ``containment=False`` leaves the containment pairs out (equal texts are still one text)."""
    n_rows = len(columns[0]) if columns else 0
    tokenised = [[words(t or "") for t in col] for col in columns]
    counts: Counter = Counter()
    for col in tokenised:
        for toks in col:
            counts.update(toks)
    code = _codes(counts)
    vocab = {w: i for i, w in enumerate(code)}
    keys: dict[str, int] = {}
    samples: list[str] = []
    word_ids: list[np.ndarray] = []
    row_text = np.full((n_rows, len(columns)), -1, dtype=np.int64)
    for c, (col, raw) in enumerate(zip(tokenised, columns)):
        for r, toks in enumerate(col):
            if not toks:
                continue
            key = "".join(code[w] for w in toks)
            i = keys.get(key)
            if i is None:
                i = keys[key] = len(keys)
                samples.append(raw[r])
                word_ids.append(np.fromiter((vocab[w] for w in toks), dtype=np.int64, count=len(toks)))
            row_text[r, c] = i
    inner, outer = _containment(list(keys)) if containment else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    return TextIndex(len(keys), row_text, inner, outer, word_ids, samples)


def _containment(keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """All (inner, outer) pairs of distinct coded texts where inner occurs in outer."""
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    automaton = ahocorasick.Automaton(ahocorasick.STORE_INTS)
    for i, key in enumerate(keys):
        automaton.add_word(key, i)
    automaton.make_automaton()
    inner: list[int] = []
    outer: list[int] = []
    for j, key in enumerate(keys):
        found = {i for _, i in automaton.iter(key)}
        found.discard(j)
        inner.extend(found)
        outer.extend([j] * len(found))
    return np.asarray(inner, dtype=np.int64), np.asarray(outer, dtype=np.int64)


# --------------------------------------------------------------------------------------------
# the leakage report
# --------------------------------------------------------------------------------------------


def _ngram_hashes(word_ids: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of every word n-gram of every text (uint64 polynomial hash) and the text each belongs to."""
    lengths = np.array([len(w) for w in word_ids], dtype=np.int64)
    if not len(word_ids) or lengths.max(initial=0) < n:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    flat = np.concatenate(word_ids).astype(np.uint64) + np.uint64(1)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    h = np.zeros(len(flat) - n + 1, dtype=np.uint64)
    prime = np.uint64(1_000_003)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * prime + flat[k: len(flat) - n + 1 + k]
    owner = np.repeat(np.arange(len(word_ids)), lengths)[: len(h)]
    pos = np.arange(len(h)) - starts[owner]
    ok = pos + n <= lengths[owner]  # windows inside one text
    return h[ok], owner[ok]


def leakage_report(splits: dict[str, Sequence[Sequence[str]]], n: int = NGRAM, fraction: float = NGRAM_FRACTION,
                   warn_fraction: float = LEAK_WARN_FRACTION) -> dict:
    """For every pair of splits (A, B), A before B in ``splits`` order, how many rows of B overlap rows of A.

    ``splits`` maps split name -> its text columns (as :func:`build_index` takes them). Counted per pair, each row
    of B at most once, in this order: ``exact`` (a text of the row equals a text of A), ``inside`` (a text of the
    row sits inside a text of A), ``ngram`` (at least ``fraction`` of the row's word ``n``-grams, over its texts,
    occur in A's texts). Rows of A inside rows of B (a train phrase within a dev sentence) are not counted: B's
    answer is not in them. ``warn_fraction`` is recorded for :func:`leakage_warnings` and the report. ``example``:
    the first row of B of the first kind counted (exact, inside, ngram) and a text of A it overlaps."""
    names = list(splits)
    sizes = [len(cols[0]) if cols else 0 for cols in splits.values()]
    width = max((len(cols) for cols in splits.values()), default=0)
    merged = [[t for name in names for t in (list(splits[name][c]) if c < len(splits[name])
                                             else [""] * sizes[names.index(name)])] for c in range(width)]
    index = build_index(merged)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    hashes, owner = _ngram_hashes(index.word_ids, n)
    per_text = np.bincount(owner, minlength=index.n_texts)
    pairs = []
    for a in range(len(names)):
        texts_a = np.zeros(index.n_texts, dtype=bool)
        rows_a = index.row_text[offsets[a]: offsets[a + 1]]
        texts_a[rows_a[rows_a >= 0]] = True
        inside_a = np.zeros(index.n_texts, dtype=bool)  # texts inside some text of A
        inside_a[index.inner[texts_a[index.outer]]] = True
        in_a = np.isin(hashes, np.unique(hashes[texts_a[owner]]))
        hits = np.bincount(owner[in_a], minlength=index.n_texts)
        for b in range(a + 1, len(names)):
            rows_b = index.row_text[offsets[b]: offsets[b + 1]]
            valid = rows_b >= 0
            safe = np.where(valid, rows_b, 0)
            exact = (valid & texts_a[safe]).any(axis=1)
            inside = (valid & inside_a[safe]).any(axis=1) & ~exact
            total = np.where(valid, per_text[safe], 0).sum(axis=1)
            hit = np.where(valid, hits[safe], 0).sum(axis=1)
            near = (total > 0) & (hit >= fraction * np.maximum(total, 1)) & ~exact & ~inside
            pair = {"splits": [names[a], names[b]], "rows": int(sizes[b]), "exact": int(exact.sum()),
                    "inside": int(inside.sum()), "ngram": int(near.sum()), "example": None}
            for kind, mask in (("exact", exact), ("inside", inside), ("ngram", near)):
                if mask.any():
                    r = int(np.flatnonzero(mask)[0])
                    pair["example"] = _example(index, kind, rows_b[r], texts_a, inside_a, hashes, owner, names[b],
                                               r)
                    break
            pairs.append(pair)
    return {"words": WORD.pattern, "ngram": n, "ngram_fraction": fraction, "warn_fraction": warn_fraction,
            "pairs": pairs}


def _example(index: TextIndex, kind: str, row: np.ndarray, texts_a: np.ndarray, inside_a: np.ndarray,
             hashes: np.ndarray, owner: np.ndarray, split: str, r: int) -> dict:
    """The overlapping text of row ``r`` of ``split`` and a text of A it overlaps (shortened)."""
    mine = [int(t) for t in row if t >= 0]
    if kind == "exact":
        t = next(t for t in mine if texts_a[t])
        other = t
    elif kind == "inside":
        t = next(t for t in mine if inside_a[t])
        outers = index.outer[(index.inner == t) & texts_a[index.outer]]
        other = int(outers.min())
    else:
        t = max(mine, key=lambda t: int(np.isin(hashes[owner == t], hashes[texts_a[owner]]).sum()))
        shared = np.isin(hashes[texts_a[owner]], hashes[owner == t])
        other = int(owner[texts_a[owner]][shared].min())
    return {"kind": kind, "split": split, "row": r, "text": _short(index.samples[t]),
            "overlaps": _short(index.samples[other])}


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def leakage_warnings(report: dict) -> list[str]:
    """One sentence per pair of splits whose overlapping rows exceed the report's ``warn_fraction`` of the later
    split's rows."""
    threshold = report["warn_fraction"]
    out = []
    for p in report["pairs"]:
        a, b = p["splits"]
        leaked = p["exact"] + p["inside"] + p["ngram"]
        if p["rows"] and leaked > threshold * p["rows"]:
            ex = p["example"]
            out.append(f"{leaked:,} of the {p['rows']:,} {b} rows ({100 * leaked / p['rows']:.1f}%) overlap {a}: "
                       f"{p['exact']:,} equal to a {a} text, {p['inside']:,} inside one, {p['ngram']:,} sharing "
                       f">= {100 * report['ngram_fraction']:g}% of their {report['ngram']}-grams with {a}; e.g. "
                       f"{b} row {ex['row']} {ex['text']!r} ({ex['kind']}) in {a} {ex['overlaps']!r}")
    return out
