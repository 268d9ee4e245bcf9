"""The seed papers' signal sets at their teachers' shapes, the stand-in (or real) teacher, token rows and stores:
the inputs of ``benchmarks/at_scale.py``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distillpipe.store.manifest import Manifest, TeacherInfo
from distillpipe.store.resume import create_or_resume
from distillpipe.store.schema import SignalPrecision, SignalSpec
from distillpipe.teacher.cache import producer_code
from distillpipe.teacher.standin import SHAPES, standin_teacher

RESULTS = Path(__file__).resolve().parent / "results" / "at_scale.json"
ARGS = argparse.Namespace(teacher="standin", device=torch.device("cpu"))  # set by main()
BATCH = 64


@dataclass(frozen=True)
class SignalSet:
    """One seed paper's teacher signals, on its teacher's shape."""

    name: str
    paper: str
    shape: str
    head: str
    seq_len: int
    signals: dict
    masked: int = 0
    """MLM positions per row (15% of the tokens)."""
    rows: int = 1024
    shard_rows: int = 1024
    """The stage's default for small rows; for rows of MBs, smaller here (a shard is held twice while written, and
    the CPU capture of the stand-in's 8 attention layers is slow): per-shard costs then weigh more, not less."""

    def spec(self, precision: str = "float16") -> SignalSpec:
        """The set's spec; ``precision="int8"``: every quantizable signal it keeps stored compressed."""
        cfg = SHAPES[self.shape]
        s = self.signals
        task = {"qa": "qa", "classification": "classification"}.get(self.head, "none") if s.get("logits") else "none"
        probs = s.get("attn_probs", False)
        return SignalSpec(max_seq_len=self.seq_len, pool=s.get("pool", 1), task=task,
                          n_classes=2 if task == "classification" else 0, vocab_size=cfg["vocab_size"],
                          mlm_topk=s.get("mlm_topk", 0), mlm_max_masked=self.masked if s.get("mlm_topk") else 0,
                          hidden_layers=tuple(s.get("hidden_layers", ())), hidden_size=cfg["hidden_size"],
                          attn_layers=() if probs else tuple(s.get("attn_layers", ())),
                          n_heads=cfg["num_attention_heads"],
                          attn_probs_layers=tuple(s.get("attn_layers", ())) if probs else (),
                          embedding_size=cfg["hidden_size"] if s.get("embeddings") else 0,
                          precision=_precision(s, probs) if precision == "int8" else SignalPrecision())


def _precision(s: dict, probs: bool) -> SignalPrecision:
    return SignalPrecision(hidden="int8" if s.get("hidden_layers") else "float16",
                           embeddings="int8" if s.get("embeddings") else "float16",
                           attn_scores="int8" if s.get("attn_layers") and not probs else "float16",
                           mlm_topk="uint8" if s.get("mlm_topk") else "float16")


EIGHT = [3, 6, 9, 12, 15, 18, 21, 24]
SETS = {s.name: s for s in (
    SignalSet("logits", "task logits (SQuAD v2 start/end)", "bert-large", "qa", 384, {"logits": True}),
    SignalSet("cmow", "CMOW: MLM top-64", "bert-base", "mlm", 128, {"mlm_topk": 64}, masked=20, rows=4096),
    SignalSet("waldorf", "WaLDORf: logits + embeddings + hidden and scores of 8 layers, pooled 4x", "bert-large",
              "qa", 384, {"logits": True, "embeddings": True, "hidden_layers": EIGHT, "attn_layers": EIGHT,
                          "pool": 4}, rows=256, shard_rows=128),
    SignalSet("minialbert", "MiniALBERT: MLM top-64 + hidden and attention probabilities of 3 layers", "bert-base",
              "mlm", 128, {"mlm_topk": 64, "hidden_layers": [4, 8, 12], "attn_layers": [4, 8, 12],
                           "attn_probs": True}, masked=20, rows=1024, shard_rows=256),
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


def new_store(path: Path, spec: SignalSpec, n: int, shard_rows: int, name: str):
    manifest = Manifest(teacher=TeacherInfo(name=f"stand-in {name}", weights_sha256="stand-in",
                                            tokenizer_sha256="stand-in", config={}),
                        tokens_fingerprint=f"at-scale-{n}", split="train", signals=spec,
                        compute={"precision": "fp32", "batch_size": BATCH}, code=producer_code(), n_rows=n,
                        shard_rows=shard_rows)
    return create_or_resume(path, manifest)
