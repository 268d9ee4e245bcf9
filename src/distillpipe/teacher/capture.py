"""Teacher signal capture: one forward pass, only the selected layers kept, pooled on the device.

Mechanism: forward hooks, installed for one call and removed after it.

Where each architecture keeps those modules, and which signals it cannot give, is :mod:`.arch`'s table: the same
table ``teacher_import``, ``plan`` and ``new-task`` refuse a params file with.

* ``hidden/L{j}``: a hook on encoder layer j's output (:func:`~.arch.hidden_module`: ``encoder.layer[j-1]``, or
  DeBERTa's convolution after layer 1, ModernBERT's final norm after the last), avg-pooled on the spot (WaLDORf eq.
  3); ``hidden/L0`` hooks the first layer's input (ELECTRA-small: after ``embeddings_project``), ``embeddings`` the
  embedding module's output. Each is what ``output_hidden_states[j]`` holds.
  ``output_hidden_states`` is not used: it would keep every layer's (B, L, d) alive to the end.
* ``attn_scores/L{j}``, ``attn_probs/L{j}``: hooks on the query and key projections of
  layer j's self-attention only (BERT, RoBERTa, ELECTRA: ``query``/``key``; DistilBERT: ``q_lin``/``k_lin``; refused
  for DeBERTa and ModernBERT, whose scores are not Q K^T of their projections: :mod:`.arch`); once both fired, the
  scores ``Q K^T * scaling`` (the eager
  kernel's scores, before its additive mask) are recomputed from the hooked projections,
  max-pooled p x p (eq. 5) and cast, so one layer's (B, H, L, L) lives briefly and only for the
  selected layers. The hooks see projections, not the attention kernel, so they are independent
  of the attention implementation (eager, sdpa, flash) and of transformers' attention-function
  and mask-format internals, which the alternative (a custom ``AttentionInterface`` function
  recording scores) would depend on. The price is one extra Q K^T per selected layer: ~1 % of a
  BERT-Large layer's FLOPs at L=384, a few % on CPU where small batched matmuls are inefficient.
  Tests check the recomputed scores against a manual recomputation and ``output_attentions``
  of an eager run, which guards against a transformers change.
* Compact forms (:mod:`distillpipe.compact`), computed on the device from the same hooks: with ``hidden_rank`` a
  layer's pooled states become their coordinates in the store's subspace of that layer; with ``attn_rank`` a pooled
  score map (or, for probabilities, the scores with each query's mean taken out) becomes its rank-r factors per head;
  the embedding output is never returned (the store derives it from the teacher's tables), but the hook checks the
  derived values against the teacher's own on every batch, so a teacher whose embedding layer computes anything
  else is refused before a row is written. The subspaces and the derived layer come in ``constants``.
* Task logits and MLM logits come from the heads. For MLM the head runs on the masked positions
  only: (B, M, V) instead of (B, L, V) logits.
* Without task/MLM signals the forward stops after the deepest selected layer.

Layer numbering: encoder layers are 1-based, ``j`` = output (hidden) or self-attention (scores)
of encoder layer j, as in ``output_hidden_states[j]`` / ``output_attentions[j - 1]``;
``hidden/L0`` is the embedding output, avg-pooled (``embeddings`` is the same tensor unpooled).

Masking and fill conventions (the store's fill values, :func:`distillpipe.store.schema.fill_value`):
a row's signals do not depend on how much padding its batch has. ``hidden`` groups without a real token (and their
coordinates), ``start/end_logits`` at padding, ``attn_probs`` of padded queries and keys, factors at padded positions:
0.
``attn_scores``: max over real (query, key) pairs only; blocks without one are
:data:`~distillpipe.pooling.SCORE_MASKED` (-inf); with p = 1 every padded query or key
entry is -inf. MLM slots beyond a row's masked count: ``positions`` -1, ids/logits/logsumexp 0.

Dtypes: float16 for every float signal (the store has no bfloat16) except ``mlm/logsumexp``
(float32: the tail mass ``1 - sum(exp(topk - lse))`` needs it); ``mlm/topk_ids``,
``mlm/positions`` and ``length`` int32 (the store narrows them). Compute is fp32 on CPU and bf16
autocast on CUDA; pooling accumulates in fp32.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import torch
from torch import nn

from distillpipe.compact import Constants, low_rank_factors, to_coords
from distillpipe.pooling import avg_pool_seq, max_pool_scores, n_groups, pooled_mask
from distillpipe.runtime import autocast
from distillpipe.store.schema import (
    ATTN_PROBS,
    ATTN_SCORES,
    CONSTANTS,
    EMBEDDINGS,
    END_LOGITS,
    HIDDEN,
    LENGTH,
    LOGITS,
    MLM,
    MLM_LOGSUMEXP,
    MLM_POSITIONS,
    MLM_TOPK_IDS,
    MLM_TOPK_LOGITS,
    START_LOGITS,
    SignalSpec,
    array_group,
    attn_factor_arrays,
    attn_probs_array,
    attn_scores_array,
    dense_scores,
    fill_value,
    hidden_array,
    signal_arrays,
)
from distillpipe.teacher.arch import (
    Arch,
    attention_projections,
    check_signals,
    embedding_tables,
    encoder_layers,
    hidden_module,
    mlm_logits,
    model_inputs,
    spec_signals,
)

EMBEDDINGS_GROUP = f"{CONSTANTS}/{EMBEDDINGS}"


class _StopForward(Exception):
    """Raised by a hook after the deepest selected layer when nothing later is needed."""


_HEAD_SUFFIXES = (("ForMaskedLM", "mlm"), ("ForSequenceClassification", "classification"),
                  ("ForQuestionAnswering", "qa"))


def teacher_head(model: nn.Module) -> str:
    """``base``, ``mlm``, ``classification`` or ``qa``, from the transformers class."""
    name = type(model).__name__
    for suffix, head in _HEAD_SUFFIXES:
        if name.endswith(suffix):
            return head
    if getattr(model, "base_model", None) is model:
        return "base"
    raise ValueError(f"cannot tell which head a {name} teacher has; load it with distillpipe.teacher.load_teacher")


def check_spec(model: nn.Module, spec: SignalSpec) -> None:
    """Raise ValueError when ``spec`` asks for something ``model`` cannot give, or describes another model
    (hidden size, heads, vocabulary, classes): a store's shapes must be this teacher's."""
    head = teacher_head(model)
    mc = model.config
    check_signals(mc, spec_signals(spec), "teacher_cache")  # the signals this architecture cannot give (arch.py)
    n = mc.num_hidden_layers
    if not (spec.task != "none" or spec.mlm_topk or spec.hidden_layers or spec.attn_layers or spec.attn_probs_layers
            or spec.embedding_size):
        raise ValueError("the signal spec selects no signal at all")
    for name in ("hidden_layers", "attn_layers", "attn_probs_layers"):
        bad = [j for j in getattr(spec, name) if j > n]
        if bad:
            raise ValueError(f"{name} {bad}: the teacher has only {n} layers (1..{n})")
    for name in ("attn_layers", "attn_probs_layers"):
        if 0 in getattr(spec, name):
            raise ValueError(f"{name} has layer 0, the embedding output, which has no attention: attention layers "
                             f"are numbered from 1 (1..{n})")
    if spec.task != "none" and head != spec.task:
        raise ValueError(f"task logits ({spec.task}) requested but the teacher has a {head!r} head; set logits: false "
                         f"or load a fine-tuned {spec.task} teacher")
    if spec.mlm_topk and head != "mlm":
        raise ValueError(f"mlm_topk={spec.mlm_topk} but the teacher has no MLM head (it was loaded with head "
                         f"{head!r}); set mlm_topk: 0 and use hidden/attention signals only")
    sizes = {"hidden_size": (spec.hidden_size, mc.hidden_size), "n_heads": (spec.n_heads, mc.num_attention_heads),
             "vocab_size": (spec.vocab_size, mc.vocab_size)}
    if spec.task == "classification":
        sizes["n_classes"] = (spec.n_classes, mc.num_labels)
    if spec.embedding_size:
        sizes["embedding_size"] = (spec.embedding_size, mc.hidden_size)
    differ = [f"{k}={want} (the teacher has {have})" for k, (want, have) in sizes.items() if want != have]
    if differ:
        raise ValueError(f"the signal spec describes another teacher: {', '.join(differ)}; build the spec from this "
                         "teacher (distillpipe.teacher.cache.signal_spec)")


def embedding_constants(model: nn.Module, pad_id: int) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """The teacher's embedding tables as the store keeps them (``constants/embeddings/*``, float32) and how they
    combine (``eps``, the position rule, the pad id): what :class:`~distillpipe.compact.DerivedEmbeddings` needs.
    BERT and ELECTRA count positions from 0, RoBERTa from ``pad_id + 1`` (its embedding module has a
    ``padding_idx``). Refused for an embedding module of another structure; the capture's check on every batch
    refuses any that computes something else."""
    emb = model.base_model.embeddings
    tables = embedding_tables(model)  # DistilBERT: no token types, a zero table (arch.py)
    norm = next(m for m in emb.children() if isinstance(m, nn.LayerNorm))
    arrays = {f"{EMBEDDINGS_GROUP}/{k}": v.detach().float().cpu().numpy().copy() for k, v in tables.items()}
    positions = "after_padding" if getattr(emb, "padding_idx", None) is not None else "absolute"
    pad = int(emb.padding_idx) if positions == "after_padding" else int(pad_id)
    return arrays, {"eps": float(norm.eps), "positions": positions, "pad_id": pad}


def _attention_scores(q: torch.Tensor, k: torch.Tensor, H: int) -> torch.Tensor:
    """Pre-softmax scores of one BERT-semantics self-attention from its hooked projections (B, L, H*dh): the eager
    kernel's ``(Q K^T) * dh**-0.5`` (BertSelfAttention and DistilBertSelfAttention both set ``scaling`` so)."""
    B, L, _ = q.shape
    dh = q.shape[-1] // H
    scaling = dh ** -0.5
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
    spec: SignalSpec,
    *,
    seq_len: int | None = None,
    max_masked: int | None = None,
    constants: Constants | None = None,
) -> dict[str, torch.Tensor]:
    """Run the teacher once on a collated ``batch`` (:func:`distillpipe.teacher.collate`) and return
    the signals ``spec`` selects (:func:`signal_names`), pooled and cast on the model's device (see the module
    docstring). ``spec`` is checked against the model (:func:`check_spec`); its ``max_seq_len`` and
    ``mlm_max_masked`` do not pad anything by themselves. ``constants``: the store's subspaces and derived embedding
    layer, needed when ``spec`` has a ``hidden_rank`` or the embeddings (:func:`embedding_constants`,
    :func:`distillpipe.teacher.fit.fit_constants`); on the model's device.

    Sequence axes have the batch length L (pooled: ceil(L/p)) unless ``seq_len`` is given, and MLM
    axes the batch's M unless ``max_masked`` is: then they are padded with the fill values to the
    store's fixed shapes. Also returns ``length`` (B,). The tensors are inference tensors (clone
    them outside ``inference_mode`` to use them in autograd).
    """
    if model.training:  # raised, not asserted: must hold under python -O too (a seed repo cached a train-mode teacher)
        raise AssertionError("teacher must be in eval() mode: dropout would corrupt every cached signal")
    check_spec(model, spec)
    _check_constants(spec, constants)
    base, layers, arch = encoder_layers(model)
    device = next(model.parameters()).device
    inputs = {k: batch[k].to(device, non_blocking=True) for k in ("input_ids", "token_type_ids", "attention_mask")}
    forward_inputs = model_inputs(model, inputs)  # DistilBERT and ModernBERT take no token types
    mask = inputs["attention_mask"].bool()  # (B, L)
    B, L = mask.shape
    p = spec.pool
    out: dict[str, torch.Tensor] = {}
    handles = _install_hooks(base, layers, arch, int(model.config.num_attention_heads), spec, inputs, out, constants)
    try:
        with torch.inference_mode(), autocast(device):
            if spec.mlm_topk:
                seq = base(**forward_inputs).last_hidden_state  # (B, L, d)
                out.update(_mlm_signals(model, seq, batch, spec.mlm_topk))
            elif spec.task == "qa":
                res = model(**forward_inputs)
                out[START_LOGITS] = res.start_logits.float().masked_fill(~mask, 0.0).half()
                out[END_LOGITS] = res.end_logits.float().masked_fill(~mask, 0.0).half()
            elif spec.task == "classification":
                out[LOGITS] = model(**forward_inputs).logits.half()
            else:
                try:
                    base(**forward_inputs)
                except _StopForward:
                    pass
    finally:
        for h in handles:
            h.remove()
    out[LENGTH] = mask.sum(dim=1, dtype=torch.int32)
    if seq_len is not None or max_masked is not None:
        out = {name: _pad_to(name, t, L if seq_len is None else seq_len, max_masked, p) for name, t in out.items()}
    return out


def _check_constants(spec: SignalSpec, constants: Constants | None) -> None:
    have = constants.subspaces if constants is not None else {}
    missing = [j for j in spec.hidden_layers if spec.hidden_rank and j not in have]
    if missing:
        raise ValueError(f"hidden_rank={spec.hidden_rank}: the subspaces of layers {missing} are missing from the "
                         "constants (fit them first: distillpipe.teacher.fit.fit_constants)")
    if spec.embedding_size and (constants is None or constants.embeddings is None):
        raise ValueError("the embeddings are derived from the teacher's tables: pass constants with them "
                         "(distillpipe.teacher.capture.embedding_constants)")
    for j, (mean, basis) in (constants.subspaces.items() if constants is not None and spec.hidden_rank else ()):
        if basis.shape != (spec.hidden_size, spec.hidden_rank) or mean.shape != (spec.hidden_size,):
            raise ValueError(f"the subspace of layer {j} has a basis {tuple(basis.shape)} and a mean "
                             f"{tuple(mean.shape)}; the spec needs ({spec.hidden_size}, {spec.hidden_rank})")


EMBEDDING_RTOL = 2.0**-10
"""How far a derived embedding output may be from the teacher's own (relative, plus the same absolutely): twice
float16's rounding, the precision the output was stored at before it was derived."""


def check_derived_embeddings(captured: torch.Tensor, derived: torch.Tensor, mask: torch.Tensor) -> None:
    """Raise ValueError unless the derived embedding output equals the teacher's own (B, L, e) on the real tokens,
    within :data:`EMBEDDING_RTOL`: the store keeps the tables, not the rows, so they must compute what the teacher
    computes."""
    h = captured.float().masked_fill(~mask[..., None], 0.0)
    err = (derived.float() - h).abs() - EMBEDDING_RTOL * (1.0 + h.abs())
    if bool((err > 0).any()):
        worst = float((derived.float() - h).abs().max())
        raise ValueError(f"the embedding output derived from the teacher's tables differs from the teacher's own by "
                         f"up to {worst:.3g}: this teacher's embedding layer computes something else than "
                         "LayerNorm(word + position + token type); cache it without embeddings")


def _install_hooks(base: nn.Module, layers: nn.ModuleList, arch: Arch, n_heads: int, spec: SignalSpec,
                   inputs: Mapping[str, torch.Tensor], out: dict[str, torch.Tensor],
                   constants: Constants | None) -> list:
    p, r = spec.pool, spec.attn_rank
    mask = inputs["attention_mask"].bool()
    handles = []

    def on_embeddings(module, args, output):
        derived = constants.embeddings(inputs["input_ids"], inputs["token_type_ids"], mask)
        check_derived_embeddings(_last_output(output), derived, mask)

    def on_layer_input(module, args, kwargs):  # hidden/L0: the first layer's input, output_hidden_states[0]
        on_hidden(0)(module, args, args[0] if args else kwargs["hidden_states"])

    def on_hidden(j: int) -> Callable:
        def hook(module, args, output):
            h = _last_output(output)  # (B, L, d)
            if j in spec.hidden_layers:
                pooled = avg_pool_seq(h.float(), mask, p)[0]  # (B, n, d)
                if spec.hidden_rank:
                    mean, basis = constants.subspaces[j]
                    pooled = to_coords(pooled, mean, basis, pooled_mask(mask, p))  # (B, n, r)
                out[hidden_array(j)] = pooled.half()
        return hook

    def on_projection(j: int, which: str, stash: dict) -> Callable:
        def hook(module, args, output):
            stash[which] = output
            if len(stash) == 2:  # query and key both seen, in whatever order the module runs them
                scores = _attention_scores(stash.pop("q"), stash.pop("k"), n_heads)
                if j in spec.attn_probs_layers and r:
                    left, right = low_rank_factors(scores, mask, r, center_rows=True)
                    for name, f in zip(attn_factor_arrays(attn_probs_array(j)), (left, right)):
                        out[name] = f.half()
                elif j in spec.attn_probs_layers:
                    probs = torch.softmax(scores.float().masked_fill(~mask[:, None, None, :], float("-inf")), dim=-1)
                    out[attn_probs_array(j)] = probs.masked_fill_(~mask[:, None, :, None], 0.0).half()
                if j in spec.attn_layers:
                    pooled = max_pool_scores(scores, mask, p, inplace=True)[0]  # (B, H, n, n)
                    if r:
                        left, right = low_rank_factors(pooled, pooled_mask(mask, p), r)
                        for name, f in zip(attn_factor_arrays(attn_scores_array(j)), (left, right)):
                            out[name] = f.half()
                    else:
                        out[attn_scores_array(j)] = pooled.half()
        return hook

    try:
        if spec.embedding_size:
            handles.append(base.embeddings.register_forward_hook(on_embeddings))
        if 0 in spec.hidden_layers:
            handles.append(layers[0].register_forward_pre_hook(on_layer_input, with_kwargs=True))
        for j in spec.hidden_layers:
            if j > 0:
                handles.append(hidden_module(base, layers, arch, j).register_forward_hook(on_hidden(j)))
        for j in sorted(set(spec.attn_layers) | set(spec.attn_probs_layers)):
            query, key, stash = *attention_projections(layers[j - 1], arch), {}
            handles.append(query.register_forward_hook(on_projection(j, "q", stash)))
            handles.append(key.register_forward_hook(on_projection(j, "k", stash)))
        if not (spec.task != "none" or spec.mlm_topk):
            deepest = max((*spec.hidden_layers, *spec.attn_layers, *spec.attn_probs_layers), default=0)
            if deepest < len(layers):
                def stop(module, *args):
                    raise _StopForward

                # registered last: runs after the capture hooks
                if deepest > 0:
                    handles.append(hidden_module(base, layers, arch, deepest).register_forward_hook(stop))
                else:  # only the embeddings or hidden/L0: stop as the first layer starts
                    handles.append(layers[0].register_forward_pre_hook(stop))
    except BaseException:
        for h in handles:
            h.remove()
        raise
    return handles


def _mlm_signals(model: nn.Module, seq: torch.Tensor, batch: Mapping[str, torch.Tensor],
                 k: int) -> dict[str, torch.Tensor]:
    if "masked_positions" not in batch:
        raise ValueError("mlm_topk > 0 but the batch has no masked_positions: collate MLM token rows")
    pos = batch["masked_positions"].to(seq.device, non_blocking=True)  # (B, M)
    unused = ~batch["masked_valid"].to(seq.device, non_blocking=True)  # (B, M)
    B, M = pos.shape
    hidden = seq.gather(1, pos[..., None].expand(B, M, seq.shape[-1]))  # (B, M, d)
    logits = mlm_logits(model, hidden).float()  # (B, M, V): the head at masked positions only
    top, ids = logits.topk(k, dim=-1)  # (B, M, k), sorted descending
    return {
        MLM_POSITIONS: pos.masked_fill(unused, -1).int(),
        MLM_TOPK_IDS: ids.masked_fill(unused[..., None], 0).int(),
        MLM_TOPK_LOGITS: top.masked_fill(unused[..., None], 0.0).half(),
        MLM_LOGSUMEXP: torch.logsumexp(logits, dim=-1).masked_fill(unused, 0.0),
    }


def _pad_to(name: str, t: torch.Tensor, seq_len: int, max_masked: int | None, p: int) -> torch.Tensor:
    B, shape = t.shape[0], list(t.shape[1:])
    L, n = seq_len, n_groups(seq_len, p)
    group = array_group(name)
    if name in (START_LOGITS, END_LOGITS):
        target = [L]
    elif group == HIDDEN:
        target = [n, shape[1]]
    elif dense_scores(name):
        target = [shape[0], n, n]
    elif group == ATTN_SCORES:  # factors (H, r, n)
        target = [shape[0], shape[1], n]
    elif group == ATTN_PROBS and name.count("/") == 1:
        target = [shape[0], L, L]
    elif group == ATTN_PROBS:  # factors (H, r, L)
        target = [shape[0], shape[1], L]
    elif group == MLM and max_masked is not None:
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


def to_host(signals: Mapping[str, torch.Tensor], *, check: bool = True) -> dict[str, np.ndarray]:
    """Copy captured signals to host numpy arrays (one device sync) and refuse nan or overflow.

    fp16 overflow (|x| > 65504) or a broken teacher shows up as inf/nan; ``attn_scores`` may hold
    -inf (masked) but never nan or +inf. ``check=False`` leaves that to the caller: the teacher cache's
    writer checks every array it stores, in its own thread, off the capture's critical path.
    """
    host = {k: v.to("cpu", non_blocking=True) for k, v in signals.items()}  # pinned, async from CUDA
    for v in signals.values():
        if v.is_cuda:
            torch.cuda.synchronize(v.device)
            break
    arrays = {k: v.numpy() for k, v in host.items()}
    for name, a in arrays.items() if check else ():
        if a.dtype.kind != "f":
            continue
        bad = (np.isnan(a) | np.isposinf(a)) if dense_scores(name) else ~np.isfinite(a)
        if bad.any():
            raise ValueError(f"captured {name} holds {int(bad.sum())} nan/inf values (float16 overflow or a "
                             "broken teacher); no row of this batch was written")
    return arrays


def signal_names(spec: SignalSpec) -> list[str]:
    """Names :func:`capture_batch` returns for ``spec``: the store's arrays but ``row_index``."""
    return signal_arrays(spec)


__all__ = ["capture_batch", "check_derived_embeddings", "check_spec", "embedding_constants", "fill_value",
           "signal_names", "teacher_head", "to_host"]
