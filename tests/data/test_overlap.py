"""The overlap index and the leakage report against brute force: containment pairs equal a pairwise scan of word
lists, and every count of the report equals a naive loop over rows (lists of words, tuple n-grams), on small
phrase-structured data with case, spacing, punctuation and word-boundary traps."""

import random
import re

import numpy as np
import pytest

from distillpipe.data.overlap import build_index, leakage_report, leakage_warnings

VOCAB = ["the", "film", "good", "goods", "not", "a", "bad", "very", "story", "is", "it", "plot", "dull", "fun",
         "great", "cast", "of", "and", "too", "long"]


def toks(text):
    """Independent of the module's regex engine use: split on spaces after padding punctuation."""
    text = re.sub(r"([^\w\s])", r" \1 ", text.lower())
    return text.split()


def inside(small, big):
    """Whole-word, contiguous occurrence of the list ``small`` in the list ``big``."""
    n = len(small)
    return any(big[i:i + n] == small for i in range(len(big) - n + 1))


def spelled(words, rng):
    """The words with random case, spacing and punctuation spacing (all of which the index must ignore)."""
    out = " ".join(w.upper() if rng.random() < 0.2 else w for w in words)
    return out.replace(" .", "." if rng.random() < 0.5 else " .").replace(" ", "  " if rng.random() < 0.1 else " ")


def phrase_set(n_sentences, seed, phrases=4):
    """Sentences and contiguous phrases cut from them (SST-2's layout), spelled variously."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n_sentences):
        s = [rng.choice(VOCAB) for _ in range(rng.randint(3, 12))] + ["."]
        rows.append(spelled(s, rng))
        for _ in range(phrases):
            i = rng.randrange(len(s))
            rows.append(spelled(s[i: rng.randint(i + 1, len(s))], rng))
    return rows


def test_containment_pairs_equal_a_pairwise_scan():
    rows = phrase_set(60, seed=1) + ["goods", "good", "Good.", "good ."]
    index = build_index([rows])
    words = [toks(s) for s in index.samples]
    assert len({tuple(w) for w in words}) == index.n_texts  # distinct texts are distinct word lists
    naive = {(i, j) for i in range(index.n_texts) for j in range(index.n_texts) if i != j and inside(words[i],
                                                                                                        words[j])}
    assert set(zip(index.inner.tolist(), index.outer.tolist())) == naive and len(naive) > 100
    good, goods = index.samples.index("good"), index.samples.index("goods")
    assert (good, goods) not in naive  # word boundaries, not substrings
    assert index.row_text[-2, 0] == index.row_text[-1, 0]  # "Good." and "good ." are one text


def naive_report(splits, n, fraction):
    names = list(splits)
    pairs = []
    for a in range(len(names)):
        texts_a = [toks(t) for cols in splits[names[a]] for t in cols if toks(t)]
        grams_a = {tuple(t[i:i + n]) for t in texts_a for i in range(len(t) - n + 1)}
        for b in range(a + 1, len(names)):
            counts = {"exact": 0, "inside": 0, "ngram": 0}
            first = {}
            for r, row in enumerate(zip(*splits[names[b]])):
                mine = [toks(t) for t in row if toks(t)]
                grams = [tuple(t[i:i + n]) for t in mine for i in range(len(t) - n + 1)]
                if any(t == u for t in mine for u in texts_a):
                    kind = "exact"
                elif any(inside(t, u) for t in mine for u in texts_a):
                    kind = "inside"
                elif grams and sum(g in grams_a for g in grams) >= fraction * len(grams):
                    kind = "ngram"
                else:
                    continue
                counts[kind] += 1
                first.setdefault(kind, r)
            example = next(((k, first[k]) for k in ("exact", "inside", "ngram") if k in first), None)
            pairs.append({"splits": [names[a], names[b]], "rows": len(splits[names[b]][0]), **counts,
                          "first": example})
    return pairs


@pytest.mark.parametrize("n", [3, 8])
def test_leakage_counts_equal_brute_force(n):
    rng = random.Random(5)
    rows = phrase_set(80, seed=2)
    rng.shuffle(rows)
    pairs_b = [spelled([rng.choice(VOCAB) for _ in range(5)], rng) for _ in rows]  # a second text column
    pairs_b[:40] = [""] * 40  # rows without a second text
    cut = [0, 200, 280, len(rows)]
    splits = {name: [rows[lo:hi], pairs_b[lo:hi]] for name, lo, hi in zip(["train", "dev", "test"], cut, cut[1:])}
    report = leakage_report(splits, n=n, fraction=0.5)
    expected = naive_report(splits, n, 0.5)
    assert len(report["pairs"]) == 3
    for got, want in zip(report["pairs"], expected):
        assert {k: got[k] for k in ("splits", "rows", "exact", "inside", "ngram")} == \
            {k: want[k] for k in ("splits", "rows", "exact", "inside", "ngram")}
        assert (got["example"]["kind"], got["example"]["row"]) == want["first"]
    assert sum(p["exact"] for p in report["pairs"]) and sum(p["inside"] for p in report["pairs"])
    assert sum(p["ngram"] for p in report["pairs"])


def test_warning_names_the_split_and_an_example():
    train = ["a great cast and a good story .", "the plot is dull"]
    dev = ["a good story", "it is fun", "nothing like it"]
    report = leakage_report({"train": [train], "dev": [dev]})
    assert report["pairs"][0] | {"example": None} == {"splits": ["train", "dev"], "rows": 3, "exact": 0, "inside": 1,
                                                      "ngram": 0, "example": None}
    (warning,) = leakage_warnings(report)
    assert "1 of the 3 dev rows" in warning and "'a good story'" in warning and "a great cast" in warning
    assert leakage_warnings({**report, "warn_fraction": 0.5}) == []


def test_ngram_hashes_stay_inside_a_text():
    """An n-gram across the end of one text and the start of the next is not an n-gram of either."""
    report = leakage_report({"train": [["a b c", "d e f"]], "dev": [["c d e"]]}, n=3, fraction=0.5)
    assert report["pairs"][0]["ngram"] == 0
    report = leakage_report({"train": [["a b c d e f"]], "dev": [["c d e x"]]}, n=3, fraction=0.5)
    assert report["pairs"][0]["ngram"] == 1
    assert np.isclose(report["ngram_fraction"], 0.5)
