"""Teacher signal capture: one forward pass, only the selected layers kept, pooled on the device.

Mechanism: forward hooks, installed for one call and removed after it.

* ``hidden/L{j}``: a hook on encoder layer j's output (``base.encoder.layer[j-1]``), avg-pooled
  on the spot (WaLDORf eq. 3); ``hidden/L0`` and ``embeddings`` hook the embedding module.
  ``output_hidden_states`` is not used: it would keep every layer's (B, L, d) alive to the end.
* ``attn_scores/L{j}``, ``attn_probs/L{j}``: hooks on the ``query`` and ``key`` projections of
  layer j's self-attention only; once both fired, the scores ``Q K^T * scaling`` (the eager
  kernel's scores, before its additive mask) are recomputed from the hooked projections,
  max-pooled p x p (eq. 5) and cast, so one layer's (B, H, L, L) lives briefly and only for the
  selected layers. The hooks see projections, not the attention kernel, so they are independent
  of the attention implementation (eager, sdpa, flash) and of transformers' attention-function
  and mask-format internals, which the alternative (a custom ``AttentionInterface`` function
  recording scores) would depend on. The price is one extra Q K^T per selected layer: ~1 % of a
  BERT-Large layer's FLOPs at L=384, a few % on CPU where small batched matmuls are inefficient.
  Tests check the recomputed scores against a manual recomputation and ``output_attentions``
  of an eager run, which guards against a transformers change.
* Task logits and MLM logits come from the heads. For MLM the head runs on the masked positions
  only: (B, M, V) instead of (B, L, V) logits.
* Without task/MLM signals the forward stops after the deepest selected layer.

Layer numbering: encoder layers are 1-based, ``j`` = output (hidden) or self-attention (scores)
of encoder layer j, as in ``output_hidden_states[j]`` / ``output_attentions[j - 1]``;
``hidden/L0`` is the embedding output, avg-pooled (``embeddings`` is the same tensor unpooled).

Masking and fill conventions (the store's fill values, ``store.schema``): a row's signals do not
depend on how much padding its batch has. ``hidden`` groups without a real token, ``embeddings``
and ``start/end_logits`` at padding, ``attn_probs`` of padded queries and keys: 0.
``attn_scores``: max over real (query, key) pairs only; blocks without one are
:data:`~distillpipe.pooling.SCORE_MASKED` (-inf); with p = 1 every padded query or key
entry is -inf. MLM slots beyond a row's masked count: ``positions`` -1, ids/logits/logsumexp 0.

Dtypes: float16 for every float signal (the store has no bfloat16) except ``mlm/logsumexp``
(float32: the tail mass ``1 - sum(exp(topk - lse))`` needs it); ``mlm/topk_ids``,
``mlm/positions`` and ``length`` int32 (the store narrows them). Compute is fp32 on CPU and bf16
autocast on CUDA; pooling accumulates in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import torch
from torch import nn

from distillpipe.pooling import SCORE_MASKED, avg_pool_seq, max_pool_scores, n_groups
from distillpipe.runtime import autocast


@dataclass(frozen=True)
class CaptureRequest:
    """Which signals :func:`capture_batch` returns (mirrors ``store.schema.SignalSpec``)."""

    logits: bool
    """Task logits: ``logits`` (B, C) for classification, ``start_logits``/``end_logits`` (B, L) for QA."""
    mlm_topk: int
    """k > 0: ``mlm/topk_ids``, ``mlm/topk_logits`` (B, M, k), ``mlm/logsumexp``, ``mlm/positions``
    (B, M) at the masked positions. 0 = off (required for teachers without an MLM head)."""
    hidden_layers: tuple[int, ...]
    """Layers j (0 = embedding output, 1..n_layers) whose output is cached as ``hidden/L{j}``, avg-pooled p x."""
    attn_layers: tuple[int, ...]
    """Layers j (1..n_layers) whose pre-softmax scores are cached as ``attn_scores/L{j}``, max-pooled p x p."""
    attn_probs_layers: tuple[int, ...]
    """Layers j (1..n_layers) whose attention probabilities are cached unpooled as ``attn_probs/L{j}``."""
    pool: int
    """p >= 1; 1 = no pooling."""
    embeddings: bool
    """Embedding-layer output, unpooled: ``embeddings`` (B, L, e)."""

    def __post_init__(self) -> None:
        for name in ("hidden_layers", "attn_layers", "attn_probs_layers"):
            value = tuple(int(j) for j in getattr(self, name))
            object.__setattr__(self, name, value)
            low = 0 if name == "hidden_layers" else 1
            if any(j < low for j in value) or list(value) != sorted(set(value)):
                raise ValueError(f"CaptureRequest.{name} must be strictly increasing layer numbers >= {low}, "
                                 f"got {value}")
        if self.pool < 1:
            raise ValueError(f"CaptureRequest.pool must be >= 1, got {self.pool}")
        if self.mlm_topk < 0:
            raise ValueError(f"CaptureRequest.mlm_topk must be >= 0, got {self.mlm_topk}")
        if not (self.logits or self.mlm_topk or self.hidden_layers or self.attn_layers
                or self.attn_probs_layers or self.embeddings):
            raise ValueError("CaptureRequest selects no signal at all")

    @classmethod
    def from_signal_spec(cls, spec) -> CaptureRequest:
        """The request that fills a store described by ``distillpipe.store.schema.SignalSpec``."""
        return cls(logits=spec.task != "none", mlm_topk=spec.mlm_topk, hidden_layers=spec.hidden_layers,
                   attn_layers=spec.attn_layers, attn_probs_layers=spec.attn_probs_layers, pool=spec.pool,
                   embeddings=spec.embedding_size > 0)


class _StopForward(Exception):
    """Raised by a hook after the deepest selected layer when nothing later is needed."""


_HEAD_SUFFIXES = (("ForMaskedLM", "mlm"), ("ForSequenceClassification", "classification"),
                  ("ForQuestionAnswering", "qa"))
_MLM_HEAD_ATTRS = ("cls", "lm_head")  # BERT, RoBERTa


def teacher_head(model: nn.Module) -> str:
    """``base``, ``mlm``, ``classification`` or ``qa``, from the transformers class."""
    name = type(model).__name__
    for suffix, head in _HEAD_SUFFIXES:
        if name.endswith(suffix):
            return head
    if getattr(model, "base_model", None) is model:
        return "base"
    raise ValueError(f"cannot tell which head a {name} teacher has; load it with distillpipe.teacher.load_teacher")


def _encoder_layers(model: nn.Module) -> tuple[nn.Module, nn.ModuleList]:
    base = model.base_model
    layers = getattr(getattr(base, "encoder", None), "layer", None)
    ok = layers is not None and all(
        isinstance(getattr(getattr(getattr(layer, "attention", None), "self", None), proj, None), nn.Linear)
        for layer in layers for proj in ("query", "key")
    )
    if not ok or not hasattr(base, "embeddings"):
        raise ValueError(
            f"signal capture supports BERT-architecture encoders (embeddings, encoder.layer[i].attention.self."
            f"query/key); {type(model).__name__} does not have that structure"
        )
    pos_type = getattr(model.config, "position_embedding_type", "absolute")
    if pos_type not in (None, "absolute"):
        raise ValueError(f"position_embedding_type={pos_type!r}: relative-position scores are not captured; "
                         "use a teacher with absolute position embeddings")
    return base, layers


def check_request(model: nn.Module, request: CaptureRequest) -> None:
    """Raise ValueError when ``request`` asks for something ``model`` cannot give."""
    head = teacher_head(model)
    n = model.config.num_hidden_layers
    for name in ("hidden_layers", "attn_layers", "attn_probs_layers"):
        bad = [j for j in getattr(request, name) if j > n]
        if bad:
            raise ValueError(f"{name} {bad}: the teacher has only {n} layers (1..{n})")
    if request.logits and head not in ("classification", "qa"):
        raise ValueError(f"task logits requested but the teacher has a {head!r} head; set logits: false or load "
                         "a fine-tuned classification/QA teacher")
    if request.mlm_topk and head != "mlm":
        raise ValueError(f"mlm_topk={request.mlm_topk} but the teacher has no MLM head (it was loaded with head "
                         f"{head!r}); set mlm_topk: 0 and use hidden/attention signals only")
    if request.mlm_topk > model.config.vocab_size:
        raise ValueError(f"mlm_topk={request.mlm_topk} exceeds the vocabulary size {model.config.vocab_size}")


def _attention_scores(q: torch.Tensor, k: torch.Tensor, attn: nn.Module) -> torch.Tensor:
    """Pre-softmax scores of one self-attention module from its hooked projections (B, L, H*dh)."""
    B, L, _ = q.shape
    H, dh = attn.num_attention_heads, attn.attention_head_size
    scaling = getattr(attn, "scaling", dh ** -0.5)
    # Scaling q (B, L, H*dh) rather than the scores (B, H, L, L) is L/dh times cheaper; it differs
    # from the eager kernel's (Q K^T) * scaling by float rounding only.
    q = (q * scaling).view(B, L, H, dh).transpose(1, 2)  # (B, H, L, dh)
    k = k.view(B, L, H, dh).transpose(1, 2)  # (B, H, L, dh)
    return torch.matmul(q, k.transpose(2, 3))  # (B, H, L, L)


def _last_output(output):
    return output[0] if isinstance(output, tuple) else output


def capture_batch(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    request: CaptureRequest,
    *,
    seq_len: int | None = None,
    max_masked: int | None = None,
) -> dict[str, torch.Tensor]:
    """Run the teacher once on a collated ``batch`` (:func:`distillpipe.teacher.collate`) and return
    the requested signals, pooled and cast on the model's device (see the module docstring).

    Sequence axes have the batch length L (pooled: ceil(L/p)) unless ``seq_len`` is given, and MLM
    axes the batch's M unless ``max_masked`` is: then they are padded with the fill values to the
    store's fixed shapes. Also returns ``length`` (B,). The tensors are inference tensors (clone
    them outside ``inference_mode`` to use them in autograd).
    """
    if model.training:  # raised, not asserted: must hold under python -O too (a seed repo cached a train-mode teacher)
        raise AssertionError("teacher must be in eval() mode: dropout would corrupt every cached signal")
    check_request(model, request)
    head = teacher_head(model)
    base, layers = _encoder_layers(model)
    device = next(model.parameters()).device
    inputs = {k: batch[k].to(device, non_blocking=True) for k in ("input_ids", "token_type_ids", "attention_mask")}
    mask = inputs["attention_mask"].bool()  # (B, L)
    B, L = mask.shape
    p = request.pool
    out: dict[str, torch.Tensor] = {}
    handles = _install_hooks(base, layers, request, mask, out)
    try:
        with torch.inference_mode(), autocast(device):
            if request.mlm_topk:
                seq = base(**inputs).last_hidden_state  # (B, L, d)
                out.update(_mlm_signals(model, seq, batch, request.mlm_topk))
            elif request.logits:
                res = model(**inputs)
                if head == "qa":
                    out["start_logits"] = res.start_logits.float().masked_fill(~mask, 0.0).half()
                    out["end_logits"] = res.end_logits.float().masked_fill(~mask, 0.0).half()
                else:
                    out["logits"] = res.logits.half()
            else:
                try:
                    base(**inputs)
                except _StopForward:
                    pass
    finally:
        for h in handles:
            h.remove()
    out["length"] = mask.sum(dim=1, dtype=torch.int32)
    if seq_len is not None or max_masked is not None:
        out = {name: _pad_to(name, t, L if seq_len is None else seq_len, max_masked, p) for name, t in out.items()}
    return out


def _install_hooks(base: nn.Module, layers: nn.ModuleList, request: CaptureRequest, mask: torch.Tensor,
                   out: dict[str, torch.Tensor]) -> list:
    p = request.pool
    handles = []

    def on_hidden(j: int) -> Callable:
        def hook(module, args, output):
            h = _last_output(output)  # (B, L, d)
            if j == 0 and request.embeddings:
                out["embeddings"] = h.masked_fill(~mask[..., None], 0.0).half()
            if j in request.hidden_layers:
                out[f"hidden/L{j}"] = avg_pool_seq(h.float(), mask, p)[0].half()
        return hook

    def on_projection(j: int, which: str, stash: dict, attn: nn.Module) -> Callable:
        def hook(module, args, output):
            stash[which] = output
            if len(stash) == 2:  # query and key both seen, in whatever order the module runs them
                scores = _attention_scores(stash.pop("q"), stash.pop("k"), attn)
                if j in request.attn_probs_layers:
                    probs = torch.softmax(scores.float().masked_fill(~mask[:, None, None, :], float("-inf")), dim=-1)
                    out[f"attn_probs/L{j}"] = probs.masked_fill_(~mask[:, None, :, None], 0.0).half()
                if j in request.attn_layers:
                    out[f"attn_scores/L{j}"] = max_pool_scores(scores, mask, p, inplace=True)[0].half()
        return hook

    try:
        if request.embeddings or 0 in request.hidden_layers:
            handles.append(base.embeddings.register_forward_hook(on_hidden(0)))
        for j in request.hidden_layers:
            if j > 0:
                handles.append(layers[j - 1].register_forward_hook(on_hidden(j)))
        for j in sorted(set(request.attn_layers) | set(request.attn_probs_layers)):
            attn, stash = layers[j - 1].attention.self, {}
            handles.append(attn.query.register_forward_hook(on_projection(j, "q", stash, attn)))
            handles.append(attn.key.register_forward_hook(on_projection(j, "k", stash, attn)))
        if not (request.logits or request.mlm_topk):
            deepest = max((*request.hidden_layers, *request.attn_layers, *request.attn_probs_layers), default=0)
            if deepest < len(layers):
                stop_at = layers[deepest - 1] if deepest > 0 else base.embeddings

                def stop(module, args, output):
                    raise _StopForward

                handles.append(stop_at.register_forward_hook(stop))  # registered last: runs after the capture hooks
    except BaseException:
        for h in handles:
            h.remove()
        raise
    return handles


def _mlm_head(model: nn.Module) -> nn.Module:
    for attr in _MLM_HEAD_ATTRS:
        if isinstance(getattr(model, attr, None), nn.Module):
            return getattr(model, attr)
    raise ValueError(f"{type(model).__name__}: MLM head not found (looked for attributes {_MLM_HEAD_ATTRS})")


def _mlm_signals(model: nn.Module, seq: torch.Tensor, batch: Mapping[str, torch.Tensor],
                 k: int) -> dict[str, torch.Tensor]:
    if "masked_positions" not in batch:
        raise ValueError("mlm_topk > 0 but the batch has no masked_positions: collate MLM token rows")
    pos = batch["masked_positions"].to(seq.device, non_blocking=True)  # (B, M)
    unused = ~batch["masked_valid"].to(seq.device, non_blocking=True)  # (B, M)
    B, M = pos.shape
    hidden = seq.gather(1, pos[..., None].expand(B, M, seq.shape[-1]))  # (B, M, d)
    logits = _mlm_head(model)(hidden).float()  # (B, M, V): the head at masked positions only
    top, ids = logits.topk(k, dim=-1)  # (B, M, k), sorted descending
    return {
        "mlm/positions": pos.masked_fill(unused, -1).int(),
        "mlm/topk_ids": ids.masked_fill(unused[..., None], 0).int(),
        "mlm/topk_logits": top.masked_fill(unused[..., None], 0.0).half(),
        "mlm/logsumexp": torch.logsumexp(logits, dim=-1).masked_fill(unused, 0.0),
    }


def fill_value(name: str) -> float:
    """Value of ``name`` where a row has no data (padding, unused MLM slot)."""
    if name.startswith("attn_scores/"):
        return SCORE_MASKED
    if name == "mlm/positions":
        return -1
    return 0


def _pad_to(name: str, t: torch.Tensor, seq_len: int, max_masked: int | None, p: int) -> torch.Tensor:
    B, shape = t.shape[0], list(t.shape[1:])
    L, n = seq_len, n_groups(seq_len, p)
    if name in ("start_logits", "end_logits"):
        target = [L]
    elif name == "embeddings":
        target = [L, shape[1]]
    elif name.startswith("hidden/"):
        target = [n, shape[1]]
    elif name.startswith("attn_scores/"):
        target = [shape[0], n, n]
    elif name.startswith("attn_probs/"):
        target = [shape[0], L, L]
    elif name.startswith("mlm/") and max_masked is not None:
        target = [max_masked, *shape[1:]]
    else:
        return t
    if any(s > g for s, g in zip(shape, target)):
        raise ValueError(f"{name}: batch shape {tuple(shape)} does not fit the requested {tuple(target)} "
                         f"(seq_len={seq_len}, max_masked={max_masked}): a row is longer than the store allows")
    if shape == target:
        return t
    padded = t.new_full((B, *target), fill_value(name))
    padded[(slice(None), *(slice(0, s) for s in shape))] = t
    return padded


def to_host(signals: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Copy captured signals to host numpy arrays (one device sync) and refuse nan or overflow.

    fp16 overflow (|x| > 65504) or a broken teacher shows up as inf/nan; ``attn_scores`` may hold
    -inf (masked) but never nan or +inf.
    """
    host = {k: v.to("cpu", non_blocking=True) for k, v in signals.items()}  # pinned, async from CUDA
    for v in signals.values():
        if v.is_cuda:
            torch.cuda.synchronize(v.device)
            break
    arrays = {k: v.numpy() for k, v in host.items()}
    for name, a in arrays.items():
        if a.dtype.kind != "f":
            continue
        bad = (np.isnan(a) | np.isposinf(a)) if name.startswith("attn_scores/") else ~np.isfinite(a)
        if bad.any():
            raise ValueError(f"captured {name} holds {int(bad.sum())} nan/inf values (float16 overflow or a "
                             "broken teacher); no row of this batch was written")
    return arrays


def signal_names(request: CaptureRequest, head: str) -> list[str]:
    """Names :func:`capture_batch` returns for ``request`` on a teacher with ``head``."""
    names = []
    if request.logits:
        names += ["start_logits", "end_logits"] if head == "qa" else ["logits"]
    if request.mlm_topk:
        names += ["mlm/positions", "mlm/topk_ids", "mlm/topk_logits", "mlm/logsumexp"]
    names += [f"hidden/L{j}" for j in request.hidden_layers]
    names += [f"attn_scores/L{j}" for j in request.attn_layers]
    names += [f"attn_probs/L{j}" for j in request.attn_probs_layers]
    if request.embeddings:
        names.append("embeddings")
    return names + ["length"]


__all__ = ["CaptureRequest", "capture_batch", "check_request", "fill_value", "signal_names", "teacher_head",
           "to_host"]
