"""The seed papers' signal sets at their teachers' shapes, the stand-in (or real) teacher, token rows and stores:
the inputs of ``benchmarks/at_scale.py``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from distillpipe.compact import Constants
from distillpipe.store import constants as store_constants
from distillpipe.store.manifest import Manifest, TeacherInfo
from distillpipe.store.resume import create_or_resume
from distillpipe.store.schema import SignalPrecision, SignalSpec
from distillpipe.teacher.cache import producer_code
from distillpipe.teacher.fit import fit_constants
from distillpipe.teacher.standin import SHAPES, standin_teacher

RESULTS = Path(__file__).resolve().parent / "results" / "at_scale.json"
ARGS = argparse.Namespace(teacher="standin", device=torch.device("cpu"))  # set by main()
BATCH = 64
VARIANTS = ("dense", "compact")
"""How a set's signals are stored: ``dense`` (float16 hidden states and attention maps as the teacher computes
them: the format before compact forms, but for the embedding output, derived in both) and ``compact`` (the
defaults: the set's ranks, int8)."""
FIT_ROWS = 1024
"""Rows of a subspace fit (hidden_fit_rows)."""


@dataclass(frozen=True)
class SignalSet:
    """One seed paper's teacher signals, on its teacher's shape."""

    name: str
    paper: str
    shape: str
    head: str
    seq_len: int
    signals: dict
    compact: dict = field(default_factory=dict)
    """The compact forms at the defaults: ``hidden_rank`` and ``attn_rank`` (docs/precision.md)."""
    masked: int = 0
    """MLM positions per row (15% of the tokens)."""
    rows: int = 1024
    shard_rows: int = 1024
    """The stage's default for small rows; for rows of MBs, smaller here (a shard is held twice while written, and
    the CPU capture of the stand-in's 8 attention layers is slow): per-shard costs then weigh more, not less."""

    def spec(self, variant: str = "compact") -> SignalSpec:
        """The set's spec, its hidden states and attention ``dense`` or ``compact`` (:data:`VARIANTS`)."""
        cfg = SHAPES[self.shape]
        s = self.signals
        task = {"qa": "qa", "classification": "classification"}.get(self.head, "none") if s.get("logits") else "none"
        probs = s.get("attn_probs", False)
        c = self.compact if variant == "compact" else {}
        attention = bool(s.get("attn_layers")) and (not probs or bool(c.get("attn_rank")))
        return SignalSpec(max_seq_len=self.seq_len, pool=s.get("pool", 1), task=task,
                          n_classes=2 if task == "classification" else 0, vocab_size=cfg["vocab_size"],
                          mlm_topk=s.get("mlm_topk", 0), mlm_max_masked=self.masked if s.get("mlm_topk") else 0,
                          hidden_layers=tuple(s.get("hidden_layers", ())), hidden_size=cfg["hidden_size"],
                          attn_layers=() if probs else tuple(s.get("attn_layers", ())),
                          n_heads=cfg["num_attention_heads"],
                          attn_probs_layers=tuple(s.get("attn_layers", ())) if probs else (),
                          embedding_size=cfg["hidden_size"] if s.get("embeddings") else 0,
                          hidden_rank=c.get("hidden_rank", 0), hidden_fit_rows=FIT_ROWS if c.get("hidden_rank") else 0,
                          attn_rank=c.get("attn_rank", 0),
                          precision=SignalPrecision(hidden="int8" if c and s.get("hidden_layers") else "float16",
                                                    attention="int8" if c and attention else "float16"))


EIGHT = [3, 6, 9, 12, 15, 18, 21, 24]
SETS = {s.name: s for s in (
    SignalSet("logits", "task logits (SQuAD v2 start/end)", "bert-large", "qa", 384, {"logits": True}),
    SignalSet("cmow", "CMOW: MLM top-64", "bert-base", "mlm", 128, {"mlm_topk": 64}, masked=20, rows=4096),
    SignalSet("waldorf", "WaLDORf: logits + embeddings + hidden and scores of 8 layers, pooled 4x", "bert-large",
              "qa", 384, {"logits": True, "embeddings": True, "hidden_layers": EIGHT, "attn_layers": EIGHT,
                          "pool": 4}, compact={"hidden_rank": 128, "attn_rank": 8}, rows=256, shard_rows=128),
    SignalSet("minialbert", "MiniALBERT: MLM top-64 + hidden and attention probabilities of 3 layers", "bert-base",
              "mlm", 128, {"mlm_topk": 64, "hidden_layers": [4, 8, 12], "attn_layers": [4, 8, 12],
                           "attn_probs": True}, compact={"hidden_rank": 64, "attn_rank": 8}, masked=20, rows=1024,
              shard_rows=256),
)}


# -- teachers --------------------------------------------------------------------------------------------------


def make_teacher(sset: SignalSet, kind: str, device: torch.device) -> torch.nn.Module:
    """The stand-in (a forward that costs nothing) or a real BERT of the set's shape with random weights (the
    forward included: what a GPU run measures), in eval mode on ``device``."""
    if kind == "standin":
        return standin_teacher(sset.shape, sset.head, max_batch=BATCH, max_seq_len=sset.seq_len,
                               max_masked=sset.masked).to(device)
    import transformers

    cfg = transformers.BertConfig(**SHAPES[sset.shape], max_position_embeddings=512, num_labels=2)
    cls = {"qa": transformers.BertForQuestionAnswering, "mlm": transformers.BertForMaskedLM,
           "classification": transformers.BertForSequenceClassification, "base": transformers.BertModel}[sset.head]
    torch.manual_seed(0)
    return cls(cfg, attn_implementation="sdpa").eval().to(device)




def make_rows(n: int, seq_len: int, masked: int, seed: int = 0):
    """Token rows of 50-100% of L (length variety as in real corpora), MLM positions when asked."""
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    lengths = rng.integers(seq_len // 2, seq_len + 1, size=n)
    cols = {"input_ids": [[101] + rng.integers(1000, 29000, size=k - 2).tolist() + [102] for k in lengths],
            "token_type_ids": [[0] * k for k in lengths], "length": lengths.tolist()}
    if masked:
        cols["masked_positions"] = [np.sort(rng.choice(np.arange(1, k - 1), size=min(masked, k - 2),
                                                       replace=False)).tolist() for k in lengths]
    return Dataset.from_dict(cols)


def new_store(path: Path, spec: SignalSpec, n: int, shard_rows: int, name: str, constants: tuple | None = None):
    """A store being built (its writer); with its ``constants`` (arrays, info: :func:`set_constants`) written first."""
    manifest = Manifest(teacher=TeacherInfo(name=f"stand-in {name}", weights_sha256="stand-in",
                                            tokenizer_sha256="stand-in", config={}),
                        tokens_fingerprint=f"at-scale-{n}", split="train", signals=spec,
                        compute={"precision": "fp32", "batch_size": BATCH}, code=producer_code(), n_rows=n,
                        shard_rows=shard_rows)
    writer = create_or_resume(path, manifest)
    store_constants.write_constants(path, *(constants or ({}, {})))
    return writer


def set_constants(sset: SignalSet, variant: str, model: torch.nn.Module, rows) -> tuple[tuple, Constants | None]:
    """((arrays, info) to write into each store, the same on the teacher's device for the capture) of the set's
    variant: its subspaces fitted on the rows (as the build does), the embedding tables."""
    spec = sset.spec(variant)
    arrays, info = fit_constants(model, rows, spec, BATCH, 0)
    return (arrays, info), store_constants.as_constants(arrays, info, spec).to(ARGS.device)
