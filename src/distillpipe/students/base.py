"""The contract between students and the training loop.

A student is an ``nn.Module`` built as ``Student(cfg, task)`` from its config dataclass (in
:mod:`distillpipe.config`) and a :class:`TaskSpec`. ``forward(batch, *, return_hidden=False)`` takes
the collated batch (a dict of tensors, below) and returns a :class:`StudentOutput` holding everything
a loss may need; per-layer states that cost extra work at inference are computed only with
``return_hidden=True`` (the loop asks for them when a hidden-state loss is on).
The loop never branches on which student it trains: losses read fields of the output.

Batch keys (all on the model's device):
  input_ids (B, L) long, token_type_ids (B, L) long, attention_mask (B, L) bool   joint encoding
  a_input_ids, a_attention_mask, b_input_ids, b_attention_mask                      DiffCat pairs
  mlm_positions (B, M) long, -1 = unused slot                                        kind 'mlm'

Parameter naming (the loop relies on it): the task head lives under the attribute ``head`` and the
MLM head under ``mlm_head``; everything else is the encoder. Bottleneck adapters (MiniALBERT) live in
modules whose attribute name starts with ``adapter``: adapter tuning trains exactly those and the head.
Initialising a task student from a general-distilled one copies every encoder tensor and refuses any
other mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from distillpipe.config.students import HeadConfig

TaskKind = Literal["mlm", "classification", "qa"]


@dataclass(frozen=True)
class TaskSpec:
    """What the student is trained for; built by the loop from the tokens' meta.json and the run's params."""

    kind: TaskKind
    vocab_size: int
    max_seq_len: int
    pad_id: int
    num_labels: int
    """Classes for kind 'classification' (regression is cast to bins upstream); 0 otherwise."""
    encoding: Literal["joint", "diffcat"]
    """Pairs: BERT-like joint encoding or DiffCat [a, |a-b|, b] of separate encodings."""
    head: HeadConfig | None
    """Classification head; None for 'mlm' and 'qa' (whose heads are fixed by the student)."""
    bin_width: float | None = None
    """A regression task cast to ``num_labels`` bins of this width (STS-B: 0.2, the teacher's); None otherwise."""

    def __post_init__(self) -> None:
        if (self.kind == "classification") != (self.num_labels > 0):
            raise ValueError(f"num_labels must be > 0 exactly for classification (kind={self.kind}, "
                             f"num_labels={self.num_labels})")
        if (self.kind == "classification") != (self.head is not None):
            raise ValueError(f"a head config is needed exactly for classification (kind={self.kind})")
        if self.encoding == "diffcat" and self.kind != "classification":
            raise ValueError("DiffCat encoding is for (pair) classification only")


@dataclass
class StudentOutput:
    """What a student's forward returns; fields it cannot produce stay None / empty."""

    logits: torch.Tensor | None = None
    """(B, C) classification logits."""
    start_logits: torch.Tensor | None = None
    """(B, L) QA span start logits (L = the batch's padded length)."""
    end_logits: torch.Tensor | None = None
    """(B, L) QA span end logits."""
    mlm_logits: torch.Tensor | None = None
    """(B, M, V) MLM logits at ``batch['mlm_positions']`` (rows of unused slots are arbitrary)."""
    hidden: tuple[torch.Tensor, ...] = field(default_factory=tuple)
    """Per-layer representations, each (B, L_h, d): what hidden-state losses align with the teacher."""
    hidden_stride: int = 1
    """Sequence positions per element of ``hidden``/``attn_scores`` (1: per token; 4: WaLDORf's
    blocks run on sequence/4, like the teacher's 4x-pooled targets)."""
    attn_scores: tuple[torch.Tensor, ...] = field(default_factory=tuple)
    """Per-layer pre-softmax attention scores, each (B, H, L_h, L_h)."""
    embeddings: torch.Tensor | None = None
    """(B, L, e) embedding-layer output (WaLDORf embedding loss)."""


def is_adapter(name: str) -> bool:
    """Whether parameter ``name`` (from ``named_parameters``) belongs to a bottleneck adapter."""
    return any(part.startswith("adapter") for part in name.split(".")[:-1])


def freeze_for_tuning(model: torch.nn.Module, tune: str) -> tuple[int, int]:
    """Leave trainable only what ``tune`` trains (``full``: all; ``adapters``: adapters + task head; ``head``: the
    task head) and return (trainable, total) parameter counts. Refuses a choice that would train nothing new."""
    def keep(name: str) -> bool:
        if tune == "full":
            return True
        if name.startswith("head."):
            return True
        return tune == "adapters" and is_adapter(name)

    if tune == "adapters" and not any(is_adapter(n) for n, _ in model.named_parameters()):
        raise ValueError(f"tune: adapters, but this student ({type(model).__name__}) has no adapters: give its "
                         "model config adapters, or tune: full / head")
    total = trainable = 0
    for name, p in model.named_parameters():
        p.requires_grad_(keep(name))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total
