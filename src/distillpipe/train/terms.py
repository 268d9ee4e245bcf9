"""The loss terms, in one table (:data:`TERMS`): the names ``loss_weights`` accepts, the names the schedule
switches on and off, what each term reads from the teacher cache and how the objective computes it all derive
from its rows.

A row gives a term's name; its scope (WaLDORf eq. (8): ``embedding`` alpha L_e, on from the first step;
``layer``: one term ``<name>/<j>`` per aligned student block j, chi_j; ``output``: on the student's outputs,
chi_n, the slow build's final phase); the teacher-cache arrays it reads; what it needs of the student and the
cache (checked before training, so a misconfiguration fails with a message instead of a shape error); and the
function that wires a step's student output and targets to its formula, a pure function in
:mod:`distillpipe.losses`. Adding a term: its formula in ``losses.py``, one row here, its test (a term with
learned parameters, like ``hidden``'s W_h, also adds them to the objective, which owns them).

Row order is the order of the terms in the objective's sum (float addition is not associative: reordering
changes a run's bits) and of the arrays a run reads (part of a loader checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from distillpipe import losses
from distillpipe.compact import probs_from_factors, scores_from_factors
from distillpipe.config.run import ObjectiveConfig
from distillpipe.data.collate import IGNORE
from distillpipe.errors import UserError
from distillpipe.pooling import pooled_mask
from distillpipe.store.schema import (
    EMBEDDINGS,
    END_LOGITS,
    LOGITS,
    MLM_ARRAYS,
    MLM_LOGSUMEXP,
    MLM_POSITIONS,
    MLM_TOPK_IDS,
    MLM_TOPK_LOGITS,
    START_LOGITS,
    SignalSpec,
    attn_factor_arrays,
    attn_probs_array,
    attn_scores_array,
    hidden_array,
    logit_arrays,
    subspace_arrays,
)
from distillpipe.students.base import StudentOutput


class ObjectiveError(UserError, ValueError):
    """The run's loss terms ask for something the student or the teacher cache does not provide."""


@dataclass(frozen=True)
class StudentDims:
    """What the student exposes, probed with one forward (see :func:`distillpipe.train.objective.probe_student`)."""

    hidden: tuple[int, ...]
    """Width of each exposed layer."""
    hidden_stride: int
    attn_heads: tuple[int, ...]
    embedding: int
    """0 when the student exposes no embedding output."""
    lm: bool
    """Whether the student makes language-model predictions (``StudentOutput.lm``: ELMo-C and baselines)."""


@dataclass(frozen=True)
class Setup:
    """What a term's check sees: the run's task kind, the cache's signals, the student and the aligned layers."""

    kind: str
    signals: SignalSpec
    dims: StudentDims
    layers: Sequence[tuple[int, int]]
    """(student block j, teacher layer t) of every block ``layer_map`` aligns."""


@dataclass(frozen=True)
class Step:
    """What a term's function sees at one step."""

    out: StudentOutput
    targets: Mapping[str, torch.Tensor]
    """The batch's ground truth, cached teacher arrays (by store array name), and what the source derives for it
    (:meth:`distillpipe.train.data.Source.complete`: the embedding output, the subspaces by their constant names)."""
    mask: torch.Tensor
    """(B, T) bool: real tokens."""
    temperature: float
    kind: str
    signals: SignalSpec
    """The cache's signal spec: its pooling p of layer signals and the compact forms its arrays are in."""
    hidden_loss: str
    hidden_proj: nn.Module | None
    """WaLDORf eq. (2): W_h, shared by every aligned layer (the objective owns the learned projections)."""
    embed_proj: nn.Module | None
    """WaLDORf eq. (1): W_E."""


@dataclass(frozen=True)
class Term:
    name: str
    scope: Literal["embedding", "layer", "output"]
    reads: Callable[..., tuple[str, ...]]
    """The teacher-cache arrays it reads: ``reads(kind)``, or ``reads(t)`` for a layer term on teacher layer t."""
    loss: Callable[..., torch.Tensor | None]
    """Its value: ``loss(step)``, or ``loss(step, j, t)`` for a layer term on student block j aligned with teacher
    layer t; None when the batch has nothing for it (e.g. ground truth on unlabeled rows)."""
    check: Callable[[Setup], None] | None
    """Raises :class:`ObjectiveError` when the student or the cache cannot give the term; None: nothing to check."""
    doc: str
    """What it is, for the ``loss_weights`` reader."""


# ------------------------------------------------------------------------------------------------
# the functions: which output meets which target
# ------------------------------------------------------------------------------------------------

_LM_STUDENT = ("a language-model student (elmo) makes no MLM predictions: use loss_weights.lm "
               "(hard and mlm_kd are for MLM students)")


def _hard(s: Step) -> torch.Tensor | None:
    out, tg = s.out, s.targets
    if s.kind == "classification":
        return None if (tg["labels"] == IGNORE).all() else losses.hard_ce(out.logits, tg["labels"], IGNORE)
    if s.kind == "qa":
        keep = tg["start_positions"] != IGNORE
        if not keep.any():
            return None
        return losses.span_ce(out.start_logits[keep], out.end_logits[keep], tg["start_positions"][keep],
                              tg["end_positions"][keep], s.mask[keep])
    labels = tg["mlm_labels"]  # (B, M)
    if (labels == IGNORE).all():
        return None
    return losses.hard_ce(out.mlm_logits.flatten(0, 1), labels.flatten(), IGNORE)


def _check_hard(x: Setup) -> None:
    if x.dims.lm:
        raise ObjectiveError(_LM_STUDENT)


def _soft(s: Step) -> torch.Tensor:
    if s.kind == "classification":
        return losses.soft_kl(s.out.logits, s.targets[LOGITS], s.temperature)
    return losses.span_kd(s.out.start_logits, s.out.end_logits, s.targets[START_LOGITS], s.targets[END_LOGITS],
                          s.mask, s.temperature)


def _check_soft(x: Setup) -> None:
    if x.kind == "mlm":
        raise ObjectiveError("loss_weights.soft is for task logits; on an MLM corpus use mlm_kd")


def _mlm_kd(s: Step) -> torch.Tensor:
    out, tg = s.out, s.targets
    M = out.mlm_logits.shape[1]  # the batch's most masked positions; the cache pads to its global max
    positions = tg[MLM_POSITIONS][:, :M].long()  # (B, M)
    slots = positions >= 0
    if not torch.equal(positions[slots], tg["mlm_positions"][slots]):
        raise ObjectiveError("the cached MLM positions differ from the tokens' static masks: re-run teacher_cache")
    return losses.topk_kd(out.mlm_logits[slots], tg[MLM_TOPK_IDS][:, :M][slots].long(),
                          tg[MLM_TOPK_LOGITS][:, :M][slots], tg[MLM_LOGSUMEXP][:, :M][slots], s.temperature)


def _check_mlm_kd(x: Setup) -> None:
    if x.kind != "mlm":
        raise ObjectiveError("loss_weights.mlm_kd needs an MLM corpus")
    if x.dims.lm:
        raise ObjectiveError(_LM_STUDENT)


def _lm(s: Step) -> torch.Tensor | None:
    lm = s.out.lm
    if lm.target_ids.numel() == 0:  # no row of the batch has a target
        return None
    if lm.vectors is not None:
        return losses.continuous_cosine(lm.vectors, lm.target_vectors)  # ELMo-C eq. (2)
    return losses.lm_nll(lm.logprob)  # eq. (1)


def _check_lm(x: Setup) -> None:
    if not x.dims.lm:
        raise ObjectiveError("loss_weights.lm needs a language-model student (student: elmo) on an MLM corpus")


def _layer_masks(s: Step) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(validity at the student's resolution (B, ceil(T/stride)), validity of the teacher's pooled positions
    (B, ceil(T/p)), the pooling still to apply to the student's layer outputs)."""
    stride, p = s.out.hidden_stride, s.signals.pool
    return pooled_mask(s.mask, stride), pooled_mask(s.mask, p), p // stride


def _hidden(s: Step, j: int, t: int) -> torch.Tensor:
    s_mask, valid, f = _layer_masks(s)
    h = s.hidden_proj(losses.pool_student_hidden(s.out.hidden[j], s_mask, f))  # (B, ceil(T/p), d)
    if s.signals.hidden_rank:  # the cache holds coordinates in the layer's principal subspace
        mean, basis = (s.targets[a] for a in subspace_arrays(t))
        fn = losses.subspace_mse if s.hidden_loss == "mse" else losses.subspace_cosine
        return fn(h, s.targets[hidden_array(t)], mean, basis, valid)
    fn = losses.hidden_mse if s.hidden_loss == "mse" else losses.hidden_cosine
    return fn(h, s.targets[hidden_array(t)], valid)


def _check_hidden(x: Setup) -> None:
    widths = {x.dims.hidden[j] for j, _ in x.layers}
    if len(widths) != 1:
        raise ObjectiveError(f"one shared projection W_h needs equal widths of aligned layers, got {widths}")


def _attn(s: Step, j: int, t: int) -> torch.Tensor:
    s_mask, valid, f = _layer_masks(s)
    scores = losses.pool_student_scores(s.out.attn_scores[j], s_mask, f)  # (B, H, ceil(T/p), ceil(T/p))
    name = attn_scores_array(t)
    target = scores_from_factors(*(s.targets[a] for a in attn_factor_arrays(name))) if s.signals.attn_rank \
        else s.targets[name]
    return losses.attn_score_mse(scores, target, valid)


def _check_heads(x: Setup, what: str, loss: str) -> None:
    if not x.dims.attn_heads:
        raise ObjectiveError(f"loss_weights.{what} is set but this student exposes no attention scores")
    bad = {x.dims.attn_heads[j] for j, _ in x.layers} - {x.signals.n_heads}
    if bad:
        raise ObjectiveError(f"{loss} needs as many student heads as teacher heads ({x.signals.n_heads}); the "
                             f"student has {sorted(bad)}: set n_heads")


def _check_attn(x: Setup) -> None:
    _check_heads(x, "attn", "attention-score loss")


def _attn_kl(s: Step, j: int, t: int) -> torch.Tensor:
    # MiniALBERT eq. (7): token level, per head, KL(teacher || student)
    name = attn_probs_array(t)
    if s.signals.attn_rank:  # the softmax of the cached factors' (row-centred) scores
        target = probs_from_factors(*(s.targets[a] for a in attn_factor_arrays(name)), s.mask)
    else:
        target = s.targets[name]
    return losses.attn_kl(s.out.attn_scores[j], target, s.mask)


def _check_attn_kl(x: Setup) -> None:
    if not x.dims.attn_heads:
        raise ObjectiveError("loss_weights.attn_kl is set but this student exposes no attention scores")
    if x.dims.hidden_stride != 1:
        raise ObjectiveError(f"loss_weights.attn_kl compares token-level attention maps (the cache's unpooled "
                             f"attn_probs); this student's layers have stride {x.dims.hidden_stride}")
    _check_heads(x, "attn_kl", "attention KL")
    missing = [t for _, t in x.layers if t not in x.signals.attn_probs_layers]
    if missing:
        raise ObjectiveError(f"loss_weights.attn_kl reads the teacher's attention probabilities of layers "
                             f"{missing}, which the cache lacks (it has attn_probs of "
                             f"{list(x.signals.attn_probs_layers)}): list them in teacher_cache signals "
                             "attn_layers with attn_probs: true")


def _embedding(s: Step) -> torch.Tensor:
    return losses.embedding_mse(s.embed_proj(s.out.embeddings), s.targets[EMBEDDINGS], s.mask)


def _check_embedding(x: Setup) -> None:
    if not x.dims.embedding:
        raise ObjectiveError("loss_weights.embedding is set but this student exposes no embeddings")
    if not x.signals.embedding_size:
        raise ObjectiveError("loss_weights.embedding reads the teacher's embedding output, which the cache does not "
                             "keep: set embeddings: true in its teacher_cache signals")


# ------------------------------------------------------------------------------------------------
# the table
# ------------------------------------------------------------------------------------------------

TERMS: tuple[Term, ...] = (
    Term("hard", "output", lambda kind: (), _hard, _check_hard,
         "ground truth: task CE, QA span CE or MLM CE at the static masks; never on unlabeled rows"),
    Term("soft", "output", lambda kind: logit_arrays("qa" if kind == "qa" else "classification"), _soft, _check_soft,
         "the teacher's task logits with temperature (T^2 scaled; QA: start and end)"),
    Term("mlm_kd", "output", lambda kind: MLM_ARRAYS, _mlm_kd, _check_mlm_kd,
         "the teacher's top-k MLM logits, with the tail mass (CMOW's soft MLM)"),
    Term("lm", "output", lambda kind: (), _lm, _check_lm,
         "a language model's next/previous-token loss on a corpus (ELMo-C: cosine distance to the target's fixed "
         "vector, eq. 2; its softmax baselines: negative log-likelihood, eq. 1)"),
    Term("hidden", "layer", lambda t: (hidden_array(t),), _hidden, _check_hidden,
         "hidden states through one shared learned projection (WaLDORf eq. 2; objective.hidden_loss: mse or "
         "cosine)"),
    Term("attn", "layer", lambda t: (attn_scores_array(t),), _attn, _check_attn,
         "pre-softmax attention scores, MSE (WaLDORf eq. 4)"),
    Term("attn_kl", "layer", lambda t: (attn_probs_array(t),), _attn_kl, _check_attn_kl,
         "attention probabilities per head and query, KL (MiniALBERT eq. 7; reads the cache's attn_probs)"),
    Term("embedding", "embedding", lambda kind: (EMBEDDINGS,), _embedding, _check_embedding,
         "the embedding output through a learned projection (WaLDORf eq. 1)"),
)
BY_NAME: dict[str, Term] = {t.name: t for t in TERMS}
NAMES = tuple(BY_NAME)
"""The names ``loss_weights`` accepts."""
LAYER_TERMS = tuple(t.name for t in TERMS if t.scope == "layer")
OUTPUT_TERMS = tuple(t.name for t in TERMS if t.scope == "output")
EMBEDDING_TERMS = tuple(t.name for t in TERMS if t.scope == "embedding")


def check_names(cfg: ObjectiveConfig, where: str) -> None:
    """Refuse a ``loss_weights`` name that is not a term (the config layer cannot know the table)."""
    unknown = sorted(set(cfg.loss_weights) - set(NAMES))
    if unknown:
        raise ObjectiveError(f"{where}: loss_weights: unknown term(s) {unknown}; known: {list(NAMES)}")
