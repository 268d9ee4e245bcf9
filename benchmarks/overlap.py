"""Containment at 100k+ rows: the overlap index (data/overlap.py, an Aho-Corasick automaton over word-coded texts)
vs a naive pairwise scan, and carving and the leakage report at full size.

A synthetic SST-2-like phrase set: sentences of Zipf-distributed words (5-40 words), each with itself and random
contiguous phrases cut from it as rows (SST-2: 67,349 train phrases of 8,544 sentences). Part 1 checks the index's
containment pairs equal the naive scan's on a subset and prints the ratio of their times; part 2 times the index,
the carve (10% dev) and the report on the whole set and checks the carve leaves no dev row inside a train row.

Usage: python benchmarks/overlap.py [--rows 100000] [--naive-rows 3000] [--quick]
``--quick``: 20,000 rows, 1,000 naive (a smoke run).
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
from datasets import Dataset

from distillpipe.config.prepare import CarveConfig
from distillpipe.data.overlap import build_index, leakage_report, words
from distillpipe.data.sources.base import Prepared
from distillpipe.data.sources.carve import carve_splits


def phrase_rows(n_rows: int, seed: int = 0, vocab: int = 20_000, phrases: int = 7) -> list[str]:
    """~``n_rows`` rows: sentences and ``phrases`` random contiguous phrases of each, in sentence order."""
    rng = random.Random(seed)
    weights = [1 / (r + 1) for r in range(vocab)]
    rows: list[str] = []
    while len(rows) < n_rows:
        sentence = rng.choices(range(vocab), weights, k=rng.randint(5, 40))
        rows.append(" ".join(f"w{w}" for w in sentence))
        for _ in range(phrases):
            i = rng.randrange(len(sentence))
            j = rng.randint(i + 1, min(len(sentence), i + 12))
            rows.append(" ".join(f"w{w}" for w in sentence[i:j]))
    return rows[:n_rows]


def naive_pairs(texts: list[str]) -> set[tuple[str, str]]:
    """(inner, outer) of distinct word sequences, by trying every pair: the quadratic reference."""
    seqs = sorted({" " + " ".join(words(t)) + " " for t in texts})
    return {(a, b) for a in seqs for b in seqs if a != b and a in b}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--naive-rows", type=int, default=3_000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.naive_rows = 20_000, 1_000
    rows = phrase_rows(args.rows)
    print(f"{len(rows):,} rows, mean {np.mean([len(r.split()) for r in rows]):.1f} words")

    small = rows[: args.naive_rows]
    t0 = time.perf_counter()
    index = build_index([small])
    t_index = time.perf_counter() - t0
    t0 = time.perf_counter()
    naive = naive_pairs(small)
    t_naive = time.perf_counter() - t0
    key = [" " + " ".join(words(s)) + " " for s in index.samples]
    mine = {(key[i], key[o]) for i, o in zip(index.inner.tolist(), index.outer.tolist())}
    assert mine == naive, "the index's containment pairs differ from the naive scan's"
    print(f"part 1, {len(small):,} rows ({index.n_texts:,} texts, {len(naive):,} containment pairs, equal): index "
          f"{t_index:.2f} s, naive pairwise {t_naive:.2f} s: {t_naive / t_index:.0f}x (the naive scan grows with the "
          f"square of the rows: ~{t_naive * (len(rows) / len(small)) ** 2 / 3600:.1f} h at {len(rows):,})")

    t0 = time.perf_counter()
    index = build_index([rows])
    t_index = time.perf_counter() - t0
    ds = Dataset.from_dict({"id": [str(i) for i in range(len(rows))], "text_a": rows, "label": [0] * len(rows)})
    t0 = time.perf_counter()
    carved = carve_splits("bench", Prepared({"train": ds}, "classification", ["0"], ["text_a"]),
                          CarveConfig(dev=0.1, test=0.0, seed=0))
    t_carve = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = leakage_report({s: [d["text_a"][:]] for s, d in carved.splits.items()})
    t_report = time.perf_counter() - t0
    pair = report["pairs"][0]
    assert pair["exact"] == pair["inside"] == 0, pair
    print(f"part 2, {len(rows):,} rows ({index.n_texts:,} texts, {len(index.inner):,} containment pairs): index "
          f"{t_index:.1f} s; carve 10% dev {t_carve:.1f} s (train {len(carved.splits['train']):,}, dev "
          f"{len(carved.splits['dev']):,}); leakage report {t_report:.1f} s: dev rows equal to / inside train "
          f"{pair['exact']} / {pair['inside']}, near-duplicate {pair['ngram']}")


if __name__ == "__main__":
    main()
