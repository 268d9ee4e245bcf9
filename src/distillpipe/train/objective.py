"""The training objective: a weighted sum of loss terms, wired from student outputs and cached teacher signals.

The terms (their names, scopes, the arrays they read, their checks and functions) are the rows of
:data:`distillpipe.train.terms.TERMS`; the formulas are pure functions in :mod:`distillpipe.losses`. This module
sums the terms a run weights and owns the learned projections that only training needs (WaLDORf: one
projection W_h shared by every aligned layer, eq. (2); W_E for the embeddings, eq. (1)); they are saved in
checkpoints but are not part of the student.

The effective weight of a term is ``loss_weights[name]`` times the schedule's multiplier for the term's full
name (``<name>/<j>`` for a layer term on student block j; WaLDORf eq. (9) switches terms on one by one).
"""

from __future__ import annotations

import torch
from torch import nn

from distillpipe.config.run import ObjectiveConfig
from distillpipe.store.schema import LENGTH, SignalSpec, signal_parts
from distillpipe.students.base import StudentOutput
from distillpipe.train.terms import (
    BY_NAME,
    EMBEDDING_TERMS,
    LAYER_TERMS,
    TERMS,
    ObjectiveError,
    Setup,
    Step,
    StudentDims,
    check_names,
)

__all__ = ["Objective", "ObjectiveError", "StudentDims", "aligned_blocks", "embedding_stage", "probe_student",
           "store_names"]


def probe_student(model: nn.Module, batch: dict[str, torch.Tensor]) -> StudentDims:
    was = model.training
    model.eval()
    with torch.no_grad():
        out = model(batch, return_hidden=True)
    model.train(was)
    return StudentDims(hidden=tuple(h.shape[-1] for h in out.hidden), hidden_stride=out.hidden_stride,
                       attn_heads=tuple(a.shape[1] for a in out.attn_scores),
                       embedding=0 if out.embeddings is None else out.embeddings.shape[-1], lm=out.lm is not None)


def _weight(cfg: ObjectiveConfig, term: str) -> float:
    return float(cfg.loss_weights.get(term, 0.0))


def aligned_blocks(cfg: ObjectiveConfig) -> list[int]:
    """The student blocks that carry block losses (eqs. (2), (4)): those ``layer_map`` aligns with a
    teacher layer, when a hidden or attention weight is set. The slow build has one stage per entry."""
    if not any(_weight(cfg, t) for t in LAYER_TERMS):
        return []
    return [j for j, t in enumerate(cfg.layer_map) if t >= 0]


def embedding_stage(cfg: ObjectiveConfig) -> bool:
    """Whether the slow build starts with an embedding stage (eq. (8): alpha L_e alone)."""
    return any(_weight(cfg, t) for t in EMBEDDING_TERMS)


def store_names(cfg: ObjectiveConfig, kind: str, signals: SignalSpec) -> list[str]:
    """The teacher-cache arrays this objective reads, in the cache's stored forms (checked against the store by the
    caller): a signal's own array, its factors, or none when it is derived (the embeddings)."""
    names = [LENGTH]
    aligned = [t for t in cfg.layer_map if t >= 0]
    for term in TERMS:
        if _weight(cfg, term.name):
            read = [a for t in aligned for a in term.reads(t)] if term.scope == "layer" else term.reads(kind)
            names += [part for a in read for part in signal_parts(signals, a)]
    return list(dict.fromkeys(names))


class Objective(nn.Module):
    def __init__(self, cfg: ObjectiveConfig, *, kind: str, signals: SignalSpec, dims: StudentDims):
        super().__init__()
        check_names(cfg, "objective")
        self.cfg, self.kind, self.signals, self.pool = cfg, kind, signals, signals.pool
        self.layers = [(j, t) for j, t in enumerate(cfg.layer_map) if t >= 0]
        weighted = [term for term in TERMS if _weight(cfg, term.name)]
        setup = Setup(kind, signals, dims, self.layers)
        for term in weighted:
            if term.scope != "layer" and term.check is not None:
                term.check(setup)
        needs_layers = any(term.scope == "layer" for term in weighted)
        self.needs_hidden = needs_layers
        if needs_layers and len(cfg.layer_map) != len(dims.hidden):
            raise ObjectiveError(f"objective.layer_map has {len(cfg.layer_map)} entries but the student exposes "
                                 f"{len(dims.hidden)} layers: give one teacher layer (or -1) per student layer")
        if needs_layers and not self.layers:
            raise ObjectiveError("hidden/attn loss weights are set but objective.layer_map aligns no layer")
        if needs_layers and self.pool % dims.hidden_stride:
            raise ObjectiveError(f"the teacher cache pools {self.pool}x but the student's layers have stride "
                                 f"{dims.hidden_stride}: the pooling must be a multiple of the stride")
        for term in weighted:
            if term.scope == "layer" and term.check is not None:
                term.check(setup)
        # the learned projections, in this order (it decides their seeded initial values)
        self.hidden_proj = None
        if _weight(cfg, "hidden"):
            self.hidden_proj = nn.Linear(dims.hidden[self.layers[0][0]], signals.hidden_size)  # eq. (2): W_h shared
        self.embed_proj = None
        if _weight(cfg, "embedding"):
            self.embed_proj = nn.Linear(dims.embedding, signals.embedding_size)  # WaLDORf eq. (1): W_E

    def terms(self) -> list[str]:
        """Full names of the terms with a non-zero weight (what the schedule is asked about), in the order they
        are summed: the embedding and output terms, then each layer term over the aligned blocks."""
        out = [t.name for t in TERMS if t.scope != "layer" and _weight(self.cfg, t.name)]
        for t in TERMS:
            if t.scope == "layer" and _weight(self.cfg, t.name):
                out += [f"{t.name}/{j}" for j, _ in self.layers]
        return out

    def forward(self, out: StudentOutput, targets: dict[str, torch.Tensor], *, multipliers: dict[str, float],
                temperature: float) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """(weighted total, {term: unweighted value}) for the terms whose effective weight is non-zero."""
        parts: dict[str, torch.Tensor] = {}
        total = None
        step = Step(out, targets, targets["attention_mask"], temperature, self.kind, self.signals,
                    self.cfg.hidden_loss, self.hidden_proj, self.embed_proj)
        for term in self.terms():
            name, _, block = term.partition("/")
            w = _weight(self.cfg, name) * multipliers[term]  # a term the schedule lacks is a bug
            if w == 0.0:
                continue
            j = int(block) if block else None
            value = BY_NAME[name].loss(step) if j is None else BY_NAME[name].loss(step, j, self.cfg.layer_map[j])
            if value is None:  # e.g. hard loss on a batch without ground truth
                continue
            parts[term] = value.detach()
            total = w * value if total is None else total + w * value
        return total, parts  # total is None when no term applies to this batch (the loop skips the step)
