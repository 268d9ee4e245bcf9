"""Building word-vector tables (stage ``word_vectors``): gensim FastText trained on a prepared corpus, or a
FastText binary in Facebook's format (``cc.en.300.bin``) read with ``load_facebook_vectors``; either way
looked up for every string of the teacher tokenizer's vocabulary (format: :mod:`distillpipe.data.word_vectors`).

Training splits the corpus with the tokenizer's own normaliser and pre-tokeniser, so its words are the ones
the wordpieces come from; one worker and a seed make the bytes reproducible across processes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distillpipe.assets import load_tokenizer, tokenizer_sha256
from distillpipe.config.word_vectors import LocalVectorsConfig, TrainedVectorsConfig
from distillpipe.data.word_vectors import META_FILE, TABLE_FILE, WordVectorsError, table_fingerprint

log = logging.getLogger(__name__)

CONTINUATION = "##"


@dataclass(frozen=True)
class WordVectorsSummary:
    name: str
    vocab: int
    dim: int
    seconds: float

    def one_line(self) -> str:
        return f"word_vectors {self.name}: {self.vocab:,} x {self.dim} table in {self.seconds:.1f} s"


def token_strings(tok: Any) -> list[str | None]:
    """The string of every vocabulary id (``##`` stripped), None for special tokens."""
    special = set(tok.all_special_ids)
    vocab = tok.get_vocab()
    out: list[str | None] = [None] * len(vocab)
    for piece, i in vocab.items():
        if i not in special:
            out[i] = piece[len(CONTINUATION):] if piece.startswith(CONTINUATION) and len(piece) > 2 else piece
    return out


def corpus_words(tok: Any, texts: list[str]) -> list[list[str]]:
    """Each text as the tokenizer's words: its normaliser (e.g. lower-casing) and pre-tokeniser (whitespace and
    punctuation), before WordPiece."""
    backend = tok.backend_tokenizer
    norm, pre = backend.normalizer, backend.pre_tokenizer
    out = []
    for t in texts:
        t = norm.normalize_str(t) if norm is not None else t
        out.append([w for w, _ in pre.pre_tokenize_str(t)] if pre is not None else t.split())
    return out


def train_fasttext(sentences: list[list[str]], cfg: TrainedVectorsConfig):
    """gensim FastText skip-gram, one worker and seeded: the same sentences give the same vectors."""
    from gensim.models import FastText

    model = FastText(vector_size=cfg.dim, window=cfg.window, min_count=cfg.min_count, min_n=cfg.min_n,
                     max_n=cfg.max_n, sg=1, seed=cfg.seed, workers=1, epochs=cfg.epochs)
    model.build_vocab(corpus_iterable=sentences)
    model.train(corpus_iterable=sentences, total_examples=len(sentences), epochs=cfg.epochs)
    return model.wv


def build_table(kv: Any, strings: list[str | None]) -> np.ndarray:
    """(V, d) float32: row i = ``kv[strings[i]]`` (FastText composes unseen words from n-grams), zero for None."""
    table = np.zeros((len(strings), kv.vector_size), dtype=np.float32)
    for i, s in enumerate(strings):
        if s is not None:
            table[i] = kv[s]
    return table


def make_word_vectors(name: str, cfg: TrainedVectorsConfig | LocalVectorsConfig, tokenizer_spec: str,
                      out_dir: str | Path, corpus_dir: str | Path | None = None) -> WordVectorsSummary:
    """Build table ``name`` for the tokenizer ``tokenizer_spec`` and write it atomically to ``out_dir``."""
    t0 = time.time()
    tok, model_dir = load_tokenizer(tokenizer_spec)
    strings = token_strings(tok)
    if isinstance(cfg, TrainedVectorsConfig):
        from datasets import load_from_disk

        if corpus_dir is None:
            raise WordVectorsError(f"word_vectors {name}: trained vectors need the corpus (--corpus "
                                   f"data/prepared/{cfg.corpus})")
        texts = load_from_disk(str(corpus_dir))["train"]["text"]
        sentences = corpus_words(tok, texts)
        log.info("training FastText (dim %d, %d epochs) on %s words of %d texts", cfg.dim, cfg.epochs,
                 f"{sum(map(len, sentences)):,}", len(texts))
        kv = train_fasttext(sentences, cfg)
        source = {"kind": "trained", "corpus": cfg.corpus, "config": {k: getattr(cfg, k) for k in
                  ("dim", "epochs", "window", "min_count", "min_n", "max_n", "seed")}}
    else:
        from gensim.models.fasttext import load_facebook_vectors

        path = Path(cfg.path)
        if not path.is_file():
            raise WordVectorsError(f"word_vectors.local.{name}.path: {path} is not a file (a FastText .bin, e.g. "
                                   "cc.en.300.bin from https://fasttext.cc)")
        kv = load_facebook_vectors(str(path))
        source = {"kind": "fasttext_bin", "file": path.name, "bytes": path.stat().st_size}
    table = build_table(kv, strings)
    if cfg.center:
        real = table.any(axis=1)  # special tokens stay zero (never targets)
        table[real] -= table[real].mean(axis=0, dtype=np.float64).astype(np.float32)
    source["center"] = cfg.center
    meta = {"name": name, "source": source, "dim": int(table.shape[1]), "vocab_size": int(table.shape[0]),
            "tokenizer_sha256": tokenizer_sha256(model_dir), "tokenizer": tokenizer_spec,
            "special_ids": sorted(int(i) for i in tok.all_special_ids),
            "fingerprint": table_fingerprint(table)}
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / TABLE_FILE, table)
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return WordVectorsSummary(name, table.shape[0], table.shape[1], time.time() - t0)


