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
  unmasked_input_ids (B, L) long: input_ids with the static masks undone             kind 'mlm'
    (what a causal language model reads and predicts; an MLM student must not read it)

Parameter naming (the loop relies on it): the task head lives under the attribute ``head`` and the
MLM head (any pretraining output layer, e.g. a language model's) under ``mlm_head``; everything else is
the encoder. Bottleneck adapters (MiniALBERT) live in modules whose attribute name starts with ``adapter``:
adapter tuning trains exactly those and the head.
Initialising a task student from a general-distilled one copies every encoder tensor and refuses any
other mismatch.

Fixed input vectors (ELMo-C): a student whose input layer is a fixed word-vector table holds it in a buffer
named ``input_vectors`` (V, e), zero when built; the loop copies the table in (:func:`set_input_vectors`),
so it is saved with the weights and counts as no parameter.
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
    lm: LMOutput | None = None
    """Next/previous-token predictions of a language-model student (ELMo-C and baselines) on kind 'mlm'."""


@dataclass
class LMOutput:
    """The N predictions of a language model (forward LM: token t+1 from tokens <= t; backward: t-1 from >= t),
    over every target of the batch. Exactly one of ``vectors`` (continuous outputs) and ``logprob`` is set."""

    target_ids: torch.Tensor
    """(N,) long: the predicted tokens."""
    vectors: torch.Tensor | None = None
    """(N, e) continuous outputs (ELMo-C), compared with ``target_vectors`` by the cosine distance (eq. 2)."""
    target_vectors: torch.Tensor | None = None
    """(N, e) the fixed vectors of the targets."""
    logprob: torch.Tensor | None = None
    """(N,) log p(target | context) under a (full or adaptive) softmax (eq. 1)."""
    top1: torch.Tensor | None = None
    """(N,) long: the most likely token (softmax) or the nearest vector by cosine (continuous); in eval mode
    only (it costs a pass over the whole vocabulary)."""


INPUT_VECTORS = "input_vectors"


def set_input_vectors(model: torch.nn.Module, table: torch.Tensor) -> None:
    """Copy a fixed word-vector table (V, e) into the student's ``input_vectors`` buffer, checking its shape."""
    buf = getattr(model, INPUT_VECTORS, None)
    if not isinstance(buf, torch.Tensor):
        raise ValueError(f"{type(model).__name__} has no fixed input vectors: give word vectors only to a student "
                         "that reads them (elmo)")
    if tuple(buf.shape) != tuple(table.shape):
        raise ValueError(f"the word-vector table is {tuple(table.shape)} but the student expects {tuple(buf.shape)} "
                         "(vocabulary size x model d_input): set the model's d_input to the table's dim")
    with torch.no_grad():
        buf.copy_(table)


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
