"""The training objective: a weighted sum of loss terms, wired from student outputs and cached teacher signals.

The formulas are pure functions in :mod:`distillpipe.losses`; this module only decides which output
meets which target. It owns the learned projections that only training needs (WaLDORf: one
projection W_h shared by every aligned layer, eq. (2); W_E for the embeddings, eq. (1)); they are
saved in checkpoints but are not part of the student.

Term names: ``hard``, ``soft``, ``mlm_kd``, ``embedding``, ``lm``, and per aligned student layer j
``hidden/<j>``, ``attn/<j>`` (WaLDORf score MSE) and ``attn_kl/<j>`` (MiniALBERT attention KL, eq. 7). The
effective weight of a term is ``loss_weights[base]`` times the schedule's multiplier for the term's full name
(WaLDORf eq. (9) switches terms on one by one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from distillpipe import losses
from distillpipe.config.run import ObjectiveConfig
from distillpipe.data.collate import IGNORE
from distillpipe.errors import UserError
from distillpipe.pooling import pooled_mask
from distillpipe.store.schema import (
    EMBEDDINGS,
    END_LOGITS,
    LENGTH,
    LOGITS,
    MLM_ARRAYS,
    MLM_LOGSUMEXP,
    MLM_POSITIONS,
    MLM_TOPK_IDS,
    MLM_TOPK_LOGITS,
    START_LOGITS,
    SignalSpec,
    attn_probs_array,
    attn_scores_array,
    hidden_array,
    logit_arrays,
)
from distillpipe.students.base import StudentOutput


class ObjectiveError(UserError, ValueError):
    """The run's loss terms ask for something the student or the teacher cache does not provide."""


@dataclass(frozen=True)
class StudentDims:
    """What the student exposes, probed with one forward (see :func:`probe_student`)."""

    hidden: tuple[int, ...]
    """Width of each exposed layer."""
    hidden_stride: int
    attn_heads: tuple[int, ...]
    embedding: int
    """0 when the student exposes no embedding output."""
    lm: bool
    """Whether the student makes language-model predictions (``StudentOutput.lm``: ELMo-C and baselines)."""


def probe_student(model: nn.Module, batch: dict[str, torch.Tensor]) -> StudentDims:
    was = model.training
    model.eval()
    with torch.no_grad():
        out = model(batch, return_hidden=True)
    model.train(was)
    return StudentDims(hidden=tuple(h.shape[-1] for h in out.hidden), hidden_stride=out.hidden_stride,
                       attn_heads=tuple(a.shape[1] for a in out.attn_scores),
                       embedding=0 if out.embeddings is None else out.embeddings.shape[-1], lm=out.lm is not None)


LAYER_TERMS = ("hidden", "attn", "attn_kl")
"""Terms computed per aligned student layer (``layer_map``)."""


def _weight(cfg: ObjectiveConfig, term: str) -> float:
    return float(cfg.loss_weights.get(term, 0.0))


def aligned_blocks(cfg: ObjectiveConfig) -> list[int]:
    """The student blocks that carry block losses (eqs. (2), (4)): those ``layer_map`` aligns with a
    teacher layer, when a hidden or attention weight is set. The slow build has one stage per entry."""
    if not any(_weight(cfg, t) for t in LAYER_TERMS):
        return []
    return [j for j, t in enumerate(cfg.layer_map) if t >= 0]


def store_names(cfg: ObjectiveConfig, kind: str, signals: SignalSpec) -> list[str]:
    """The teacher-cache arrays this objective reads (checked against the store by the caller)."""
    names = [LENGTH]
    if _weight(cfg, "soft"):
        names += logit_arrays("qa" if kind == "qa" else "classification")
    if _weight(cfg, "mlm_kd"):
        names += MLM_ARRAYS
    aligned = [t for t in cfg.layer_map if t >= 0]
    if _weight(cfg, "hidden"):
        names += [hidden_array(t) for t in aligned]
    if _weight(cfg, "attn"):
        names += [attn_scores_array(t) for t in aligned]
    if _weight(cfg, "attn_kl"):
        names += [attn_probs_array(t) for t in aligned]
    if _weight(cfg, "embedding"):
        names += [EMBEDDINGS]
    return list(dict.fromkeys(names))


class Objective(nn.Module):
    def __init__(self, cfg: ObjectiveConfig, *, kind: str, signals: SignalSpec, dims: StudentDims):
        super().__init__()
        self.cfg, self.kind, self.pool = cfg, kind, signals.pool
        if kind == "mlm" and _weight(cfg, "soft"):
            raise ObjectiveError("loss_weights.soft is for task logits; on an MLM corpus use mlm_kd")
        if kind != "mlm" and _weight(cfg, "mlm_kd"):
            raise ObjectiveError("loss_weights.mlm_kd needs an MLM corpus")
        if _weight(cfg, "lm") and not dims.lm:
            raise ObjectiveError("loss_weights.lm needs a language-model student (student: elmo) on an MLM corpus")
        if dims.lm and (_weight(cfg, "hard") or _weight(cfg, "mlm_kd")):
            raise ObjectiveError("a language-model student (elmo) makes no MLM predictions: use loss_weights.lm "
                                 "(hard and mlm_kd are for MLM students)")
        self.layers = [(j, t) for j, t in enumerate(cfg.layer_map) if t >= 0]
        needs_layers = any(_weight(cfg, t) for t in LAYER_TERMS)
        self.needs_hidden = needs_layers
        if needs_layers and len(cfg.layer_map) != len(dims.hidden):
            raise ObjectiveError(f"objective.layer_map has {len(cfg.layer_map)} entries but the student exposes "
                                 f"{len(dims.hidden)} layers: give one teacher layer (or -1) per student layer")
        if needs_layers and not self.layers:
            raise ObjectiveError("hidden/attn loss weights are set but objective.layer_map aligns no layer")
        if needs_layers and self.pool % dims.hidden_stride:
            raise ObjectiveError(f"the teacher cache pools {self.pool}x but the student's layers have stride "
                                 f"{dims.hidden_stride}: the pooling must be a multiple of the stride")
        self.hidden_proj = None
        if _weight(cfg, "hidden"):
            widths = {dims.hidden[j] for j, _ in self.layers}
            if len(widths) != 1:
                raise ObjectiveError(f"one shared projection W_h needs equal widths of aligned layers, got {widths}")
            self.hidden_proj = nn.Linear(widths.pop(), signals.hidden_size)  # WaLDORf eq. (2): W_h shared
        if _weight(cfg, "attn"):
            if not dims.attn_heads:
                raise ObjectiveError("loss_weights.attn is set but this student exposes no attention scores")
            bad = {dims.attn_heads[j] for j, _ in self.layers} - {signals.n_heads}
            if bad:
                raise ObjectiveError(f"attention-score loss needs as many student heads as teacher heads "
                                     f"({signals.n_heads}); the student has {sorted(bad)}: set n_heads")
        if _weight(cfg, "attn_kl"):
            if not dims.attn_heads:
                raise ObjectiveError("loss_weights.attn_kl is set but this student exposes no attention scores")
            if dims.hidden_stride != 1:
                raise ObjectiveError(f"loss_weights.attn_kl compares token-level attention maps (the cache's unpooled "
                                     f"attn_probs); this student's layers have stride {dims.hidden_stride}")
            bad = {dims.attn_heads[j] for j, _ in self.layers} - {signals.n_heads}
            if bad:
                raise ObjectiveError(f"attention KL needs as many student heads as teacher heads "
                                     f"({signals.n_heads}); the student has {sorted(bad)}: set n_heads")
            missing = [t for _, t in self.layers if t not in signals.attn_probs_layers]
            if missing:
                raise ObjectiveError(f"loss_weights.attn_kl reads the teacher's attention probabilities of layers "
                                     f"{missing}, which the cache lacks (it has attn_probs of "
                                     f"{list(signals.attn_probs_layers)}): list them in teacher_cache signals "
                                     "attn_layers with attn_probs: true")
        self.embed_proj = None
        if _weight(cfg, "embedding"):
            if not dims.embedding:
                raise ObjectiveError("loss_weights.embedding is set but this student exposes no embeddings")
            self.embed_proj = nn.Linear(dims.embedding, signals.embedding_size)  # WaLDORf eq. (1): W_E

    def terms(self) -> list[str]:
        """Full names of the terms with a non-zero weight (what the schedule is asked about)."""
        out = [t for t in ("hard", "soft", "mlm_kd", "embedding", "lm") if _weight(self.cfg, t)]
        for base in LAYER_TERMS:
            if _weight(self.cfg, base):
                out += [f"{base}/{j}" for j, _ in self.layers]
        return out

    def forward(self, out: StudentOutput, targets: dict[str, torch.Tensor], *, multipliers: dict[str, float],
                temperature: float) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """(weighted total, {term: unweighted value}) for the terms whose effective weight is non-zero."""
        parts: dict[str, torch.Tensor] = {}
        total = None
        mask = targets["attention_mask"]  # (B, T) bool
        for term in self.terms():
            w = _weight(self.cfg, term.split("/")[0]) * multipliers[term]  # a term the schedule lacks is a bug
            if w == 0.0:
                continue
            value = self._term(term, out, targets, mask, temperature)
            if value is None:  # e.g. hard loss on a batch without ground truth
                continue
            parts[term] = value.detach()
            total = w * value if total is None else total + w * value
        return total, parts  # total is None when no term applies to this batch (the loop skips the step)

    def _term(self, term: str, out: StudentOutput, tg: dict[str, torch.Tensor], mask: torch.Tensor,
              T: float) -> torch.Tensor | None:
        if term == "hard":
            if self.kind == "classification":
                return None if (tg["labels"] == IGNORE).all() else losses.hard_ce(out.logits, tg["labels"], IGNORE)
            if self.kind == "qa":
                keep = tg["start_positions"] != IGNORE
                if not keep.any():
                    return None
                return losses.span_ce(out.start_logits[keep], out.end_logits[keep], tg["start_positions"][keep],
                                      tg["end_positions"][keep], mask[keep])
            labels = tg["mlm_labels"]  # (B, M)
            if (labels == IGNORE).all():
                return None
            return losses.hard_ce(out.mlm_logits.flatten(0, 1), labels.flatten(), IGNORE)
        if term == "soft":
            if self.kind == "classification":
                return losses.soft_kl(out.logits, tg[LOGITS], T)
            return losses.span_kd(out.start_logits, out.end_logits, tg[START_LOGITS], tg[END_LOGITS], mask, T)
        if term == "mlm_kd":
            M = out.mlm_logits.shape[1]  # the batch's most masked positions; the cache pads to its global max
            positions = tg[MLM_POSITIONS][:, :M].long()  # (B, M)
            slots = positions >= 0
            if not torch.equal(positions[slots], tg["mlm_positions"][slots]):
                raise ObjectiveError("the cached MLM positions differ from the tokens' static masks: "
                                     "re-run teacher_cache")
            return losses.topk_kd(out.mlm_logits[slots], tg[MLM_TOPK_IDS][:, :M][slots].long(),
                                  tg[MLM_TOPK_LOGITS][:, :M][slots], tg[MLM_LOGSUMEXP][:, :M][slots], T)
        if term == "lm":
            lm = out.lm
            if lm.target_ids.numel() == 0:  # no row of the batch has a target
                return None
            if lm.vectors is not None:
                return losses.continuous_cosine(lm.vectors, lm.target_vectors)  # ELMo-C eq. (2)
            return losses.lm_nll(lm.logprob)  # eq. (1)
        if term == "embedding":
            return losses.embedding_mse(self.embed_proj(out.embeddings), tg[EMBEDDINGS], mask)
        base, j = term.split("/")
        j = int(j)
        t_layer = self.cfg.layer_map[j]
        stride = out.hidden_stride
        f = self.pool // stride  # pooling still to apply to the student's layer outputs
        s_mask = pooled_mask(mask, stride)  # (B, ceil(T/stride)) validity at the student's resolution
        valid = pooled_mask(mask, self.pool)  # (B, ceil(T/p)) validity of the teacher's pooled positions
        if base == "hidden":
            h = losses.pool_student_hidden(out.hidden[j], s_mask, f)  # (B, ceil(T/p), d_s)
            target = tg[hidden_array(t_layer)]
            fn = losses.hidden_mse if self.cfg.hidden_loss == "mse" else losses.hidden_cosine
            return fn(self.hidden_proj(h), target, valid)
        if base == "attn_kl":  # MiniALBERT eq. (7): token level, per head, KL(teacher || student)
            return losses.attn_kl(out.attn_scores[j], tg[attn_probs_array(t_layer)], mask)
        scores = losses.pool_student_scores(out.attn_scores[j], s_mask, f)  # (B, H, ceil(T/p), ceil(T/p))
        return losses.attn_score_mse(scores, tg[attn_scores_array(t_layer)], valid)
