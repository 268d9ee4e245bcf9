"""Teacher architectures: where each family keeps the modules the capture hooks, and which signals it cannot give.

One table (:data:`ARCHS`, keyed by ``config.model_type``) that the capture follows (:mod:`.capture`) and that
``teacher_import``, ``plan`` and ``new-task`` check a params file against (:func:`refusal`), from ``config.json``
alone, before any fine-tuning: the capture and the refusal cannot disagree.

What each family needs (transformers 5.x, read from its ``modeling_*.py``):

* BERT, RoBERTa, ELECTRA: ``encoder.layer[i].attention.self.{query,key}``; the eager kernel's scores are
  ``(Q K^T) * head_dim**-0.5`` plus the additive mask, so recomputing ``Q K^T`` from the hooked projections is exact.
  RoBERTa counts positions from ``pad_id + 1``. ELECTRA's embedding module has ``embedding_size`` columns and, when
  that differs from ``hidden_size`` (ELECTRA-small), ``embeddings_project`` maps it to the encoder's width: the
  encoder's input (``output_hidden_states[0]``, our ``hidden/L0``) is the projected one.
* DistilBERT: ``transformer.layer[i].attention.{q_lin,k_lin}``, ``scaling = head_dim**-0.5``: BERT's attention
  semantics under other names. No token types (its forward takes no ``token_type_ids``), no pooler. MLM head:
  ``vocab_transform`` -> activation -> ``vocab_layer_norm`` -> ``vocab_projector``.
* DeBERTa-v2/v3: ``encoder.layer[i]``; layer 1's hidden state is ``encoder.conv``'s output when the config has a
  convolution (``conv_kernel_size``). Attention is disentangled (c2c + c2p + p2c relative-position terms, scaled by
  ``1/sqrt(head_dim * (1 + len(pos_att_type)))``) and computed inside ``DisentangledSelfAttention`` with its own
  kernel: Q K^T of the hooked projections would be silently wrong, so attention signals are refused. No sdpa kernel:
  loaded eager. MLM head: ``lm_predictions(h, word_embeddings)`` (``cls`` in legacy checkpoints).
* ModernBERT: ``layers[i]``, ``final_norm`` after the last layer (``output_hidden_states[-1]`` is its output); no
  token types. Rotary position encoding is applied to Q and K after the fused ``Wqkv`` projection and 2 of 3
  layers attend in a local window: attention signals are refused. MLM head: ``decoder(head(h))``.

The embedding output (signal ``embeddings``) is derived from the teacher's tables (:mod:`distillpipe.compact`:
``LayerNorm(word + position + token type)``), so it is given only where the embedding module computes exactly that
at the encoder's width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn

from distillpipe.errors import UserError

SIGNALS = ("logits", "hidden", "embeddings", "attn_scores", "attn_probs", "mlm_topk")
"""The signal kinds, as the refusals name them (params: ``logits``, ``hidden_layers``, ``embeddings``,
``attn_layers`` (scores; with ``attn_probs: true`` the probabilities), ``mlm_topk``)."""

_PARAM = {"logits": "logits: false", "hidden": "hidden_layers: []", "embeddings": "embeddings: false",
          "attn_scores": "attn_layers: []", "attn_probs": "attn_layers: [] (or attn_probs: false)",
          "mlm_topk": "mlm_topk: 0"}


class ArchitectureError(UserError, ValueError):
    """A teacher's architecture cannot give a signal the params ask for (or is not one distillpipe knows)."""


@dataclass(frozen=True)
class Arch:
    """Where one family keeps what the capture hooks (paths relative to ``model.base_model``)."""

    name: str
    layers: str
    """The encoder's ModuleList: ``hidden/L{j}`` is layer j's output."""
    attention: tuple[str, str, str] | None
    """(self-attention module in a layer, query projection, key projection); None: no Q K^T-recomputable scores."""
    token_types: bool
    """Whether the forward takes ``token_type_ids``."""
    tables: tuple[str, str | None, str | None, str] | None
    """The embedding module's (word, position, token type, LayerNorm) attributes; None: not derivable."""
    mlm_head: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    """(model, (..., d) hidden states) -> (..., V) MLM logits, as the family's ``*ForMaskedLM.forward`` computes."""
    kernel: str = "sdpa"
    """The attention implementation the build loads the teacher with (the capture never needs eager's maps)."""
    final_norm: str | None = None
    """A norm after the last layer whose output ``output_hidden_states[-1]`` is (ModernBERT)."""
    refused: Mapping[str, str] = field(default_factory=dict)
    """signal -> why this family cannot give it."""


def _bert_head(model, h):
    return model.cls(h)


def _roberta_head(model, h):
    return model.lm_head(h)


def _electra_head(model, h):  # ElectraForMaskedLM: the generator's head, (d) -> (e) -> (V)
    return model.generator_lm_head(model.generator_predictions(h))


def _distilbert_head(model, h):  # DistilBertForMaskedLM.forward
    return model.vocab_projector(model.vocab_layer_norm(model.activation(model.vocab_transform(h))))


def _deberta_head(model, h):  # DebertaV2ForMaskedLM.forward: the decoder is the tied word embedding, passed in
    if getattr(model.config, "legacy", True):
        return model.cls(h)
    return model.lm_predictions(h, model.deberta.embeddings.word_embeddings)


def _modernbert_head(model, h):  # ModernBertForMaskedLM.forward
    return model.decoder(model.head(h))


_BERT_TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm")
_DEBERTA_ATTN = ("disentangled attention (c2c + c2p + p2c relative-position terms at scale 1/sqrt(d_head x (1 + "
                 "#pos_att_type)), computed inside DisentangledSelfAttention) is not Q K^T of its projections")
_MODERNBERT_ATTN = ("its scores are taken after rotary encoding of Q and K (fused Wqkv) and 2 of 3 layers attend in a "
                    "local window, which Q K^T of the projections does not reproduce")

ARCHS: dict[str, Arch] = {
    "bert": Arch("BERT", "encoder.layer", ("attention.self", "query", "key"), True, _BERT_TABLES, _bert_head),
    "roberta": Arch("RoBERTa", "encoder.layer", ("attention.self", "query", "key"), True, _BERT_TABLES, _roberta_head),
    "electra": Arch("ELECTRA", "encoder.layer", ("attention.self", "query", "key"), True, _BERT_TABLES, _electra_head),
    "distilbert": Arch("DistilBERT", "transformer.layer", ("attention", "q_lin", "k_lin"), False,
                       ("word_embeddings", "position_embeddings", None, "LayerNorm"), _distilbert_head),
    # DeBERTa-v3: no position table (position_biased_input false) and no token types (type_vocab_size 0); the
    # output is multiplied by the attention mask, which the derived layer's 0 at padding is
    "deberta-v2": Arch("DeBERTa-v2/v3", "encoder.layer", None, True, _BERT_TABLES, _deberta_head, kernel="eager",
                       refused={"attn_scores": _DEBERTA_ATTN, "attn_probs": _DEBERTA_ATTN}),
    # ModernBertEmbeddings: norm(tok_embeddings(ids)), positions only by rotary encoding inside attention
    "modernbert": Arch("ModernBERT", "layers", None, False, ("tok_embeddings", None, None, "norm"), _modernbert_head,
                       final_norm="final_norm", refused={"attn_scores": _MODERNBERT_ATTN,
                                                         "attn_probs": _MODERNBERT_ATTN}),
}


def _get(config: Any, key: str, default: Any = None) -> Any:
    return config.get(key, default) if isinstance(config, Mapping) else getattr(config, key, default)


def arch_of(config: Any) -> Arch:
    """The :class:`Arch` of a teacher's config (a ``PretrainedConfig`` or ``config.json`` as a dict)."""
    model_type = _get(config, "model_type")
    if model_type not in ARCHS:
        archs = _get(config, "architectures") or []
        raise ArchitectureError(
            f"teacher architecture {model_type!r} ({', '.join(archs) or 'no architectures in its config'}) is not one "
            f"distillpipe captures signals from; supported model types: {', '.join(ARCHS)} (docs/teachers.md)")
    return ARCHS[model_type]


def refusals(config: Any) -> dict[str, str]:
    """signal -> why a teacher of ``config`` cannot give it (the family's refusals and those of this config)."""
    arch = arch_of(config)
    out = dict(arch.refused)
    pos_type = _get(config, "position_embedding_type", "absolute")
    if arch.attention is not None and pos_type not in (None, "absolute"):
        why = f"position_embedding_type={pos_type!r} adds relative-position terms that Q K^T does not have"
        out.update(attn_scores=why, attn_probs=why)
    e, d = _get(config, "embedding_size"), _get(config, "hidden_size")
    if "embeddings" not in out and e is not None and d is not None and int(e) != int(d):
        out["embeddings"] = (f"its embedding output is {e} wide, not the encoder's {d} (a projection follows it); "
                             "hidden_layers [0] is the projected embedding output, as the encoder sees it")
    return out


def requested(*, logits: bool, mlm_topk: int, hidden_layers, attn_layers, attn_probs: bool,
              embeddings: bool) -> list[str]:
    """The signal kinds a selection asks for, in :data:`SIGNALS` order."""
    asked = {"logits": logits, "hidden": bool(hidden_layers), "embeddings": embeddings,
             "attn_scores": bool(attn_layers) and not attn_probs, "attn_probs": bool(attn_layers) and attn_probs,
             "mlm_topk": bool(mlm_topk)}
    return [s for s in SIGNALS if asked[s]]


def config_signals(s: Any) -> list[str]:
    """The signal kinds a ``teacher_cache`` dataset's ``signals`` section asks for."""
    return requested(logits=s.logits, mlm_topk=s.mlm_topk, hidden_layers=s.hidden_layers, attn_layers=s.attn_layers,
                     attn_probs=s.attn_probs, embeddings=s.embeddings)


def spec_signals(spec: Any) -> list[str]:
    """The signal kinds a store's :class:`~distillpipe.store.schema.SignalSpec` holds."""
    asked = {"logits": spec.task != "none", "hidden": bool(spec.hidden_layers), "embeddings": bool(spec.embedding_size),
             "attn_scores": bool(spec.attn_layers), "attn_probs": bool(spec.attn_probs_layers),
             "mlm_topk": bool(spec.mlm_topk)}
    return [s for s in SIGNALS if asked[s]]


def refusal(config: Any, signals: list[str], where: str) -> str | None:
    """One line refusing the first of ``signals`` a teacher of ``config`` cannot give, naming the architecture, the
    signal, why, and the nearest signal set that works; None when every one can be given."""
    try:
        arch = arch_of(config)
    except ArchitectureError as e:
        return f"{where}: {e}"
    no = refusals(config)
    bad = [s for s in signals if s in no]
    if not bad:
        return None
    keep = [s for s in signals if s not in no]
    change = ", ".join(_PARAM[s] for s in bad)
    return (f"{where}: a {arch.name} teacher cannot give {bad[0]}: {no[bad[0]]}. Nearest signal set that works: "
            f"{{{', '.join(keep)}}} (set {change}; docs/teachers.md)")


def check_signals(config: Any, signals: list[str], where: str) -> None:
    """Raise :class:`ArchitectureError` with :func:`refusal`'s line when a signal cannot be given."""
    line = refusal(config, signals, where)
    if line is not None:
        raise ArchitectureError(line)


# ---------------------------------------------------------------------------------------------------------------
# the modules of a loaded model
# ---------------------------------------------------------------------------------------------------------------


def _path(root: nn.Module, path: str, arch: Arch, what: str) -> nn.Module:
    m = root
    for part in path.split("."):
        m = getattr(m, part, None)
        if m is None:
            raise ArchitectureError(f"{type(root).__name__} has no {path} ({what} of a {arch.name} teacher as "
                                    "transformers 5 builds it): a transformers version this table was not written for")
    return m


def encoder_layers(model: nn.Module) -> tuple[nn.Module, nn.ModuleList, Arch]:
    """(base model, its encoder layers, its :class:`Arch`)."""
    arch = arch_of(model.config)
    base = model.base_model
    return base, _path(base, arch.layers, arch, "the encoder layers"), arch


def hidden_module(base: nn.Module, layers: nn.ModuleList, arch: Arch, j: int) -> nn.Module:
    """The module whose output is ``output_hidden_states[j]`` (1 <= j <= n)."""
    if j == len(layers) and arch.final_norm:
        return _path(base, arch.final_norm, arch, "the final norm")
    conv = getattr(getattr(base, "encoder", None), "conv", None) if arch.layers == "encoder.layer" else None
    if j == 1 and isinstance(conv, nn.Module) and arch.name.startswith("DeBERTa"):
        return conv  # DebertaV2Encoder: layer 1's output goes through the convolution before layer 2
    return layers[j - 1]


def attention_projections(layer: nn.Module, arch: Arch) -> tuple[nn.Linear, nn.Linear]:
    """(query, key) projections of one layer's self-attention."""
    if arch.attention is None:
        raise ArchitectureError(f"a {arch.name} teacher cannot give attention scores: {arch.refused['attn_scores']}")
    path, q, k = arch.attention
    attn = _path(layer, path, arch, "the self-attention")
    return _path(attn, q, arch, "the query projection"), _path(attn, k, arch, "the key projection")


def model_inputs(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``inputs`` as ``model``'s forward takes them (no ``token_type_ids`` for DistilBERT and ModernBERT)."""
    arch = arch_of(model.config)
    return {k: v for k, v in inputs.items() if k != "token_type_ids" or arch.token_types}


def mlm_logits(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The MLM head of a ``*ForMaskedLM`` teacher applied to (..., d) last-layer states: (..., V) logits."""
    arch = arch_of(model.config)
    try:
        return arch.mlm_head(model, hidden)
    except AttributeError as e:
        raise ArchitectureError(f"{type(model).__name__}: no {arch.name} MLM head found ({e}); load the teacher "
                                "with head mlm (a *ForMaskedLM class)") from None


def embedding_tables(model: nn.Module) -> dict[str, nn.Parameter | torch.Tensor]:
    """The (word, position, token_type) tables and LayerNorm (``norm_weight``, ``norm_bias``) of the embedding
    module; an absent table as zeros, so its term is 0 as in the model (DistilBERT and ModernBERT have no token
    types, DeBERTa-v3 neither, DeBERTa-v3 and ModernBERT no position table: ``max_position_embeddings`` zero rows,
    which a Zarr store keeps as no chunk at all)."""
    arch = arch_of(model.config)
    why = refusals(model.config).get("embeddings")
    if why is not None or arch.tables is None:
        raise ArchitectureError(f"a {arch.name} teacher cannot give embeddings: {why}")
    emb = model.base_model.embeddings
    word, position, token_type, norm_name = arch.tables
    w = getattr(emb, word).weight
    pos = getattr(emb, position, None) if position else None
    types = getattr(emb, token_type, None) if token_type else None
    tables = {"word": w, "position": pos.weight if pos is not None else
              torch.zeros(int(_get(model.config, "max_position_embeddings")), w.shape[1], device=w.device),
              "token_type": types.weight if types is not None else torch.zeros(2, w.shape[1], device=w.device)}
    norm = getattr(emb, norm_name)
    tables["norm_weight"] = norm.weight
    tables["norm_bias"] = norm.bias if norm.bias is not None else torch.zeros_like(norm.weight)
    return tables


def normalized_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config.json`` with BERT's key names (DistilBERT's ``dim``/``n_layers``/``n_heads``/``hidden_dim``; a
    missing ``type_vocab_size`` as 0), for the sizes ``plan`` computes."""
    out = dict(config)
    for bert, other in (("hidden_size", "dim"), ("num_hidden_layers", "n_layers"), ("num_attention_heads", "n_heads"),
                        ("intermediate_size", "hidden_dim")):
        if bert not in out and other in out:
            out[bert] = out[other]
    out.setdefault("type_vocab_size", 0)
    return out


# ---------------------------------------------------------------------------------------------------------------
# a params file against a teacher's config: before any fine-tuning
# ---------------------------------------------------------------------------------------------------------------


def teacher_signals(params: Mapping[str, Any], teacher: str) -> dict[str, list[str]]:
    """``teacher_cache.datasets.<name>`` -> the signal kinds it asks for, for each dataset of the params file's
    ``params`` (as YAML loads it: teacher_import reads no other stage's config classes) whose teacher is ``teacher``
    (an imported model's name) or, for ``base`` (the model teacher_finetune starts from), a teacher fine-tuned from
    it (a key of ``teacher_finetune.tasks``): they all have ``teacher``'s architecture."""
    derived = set((params.get("teacher_finetune") or {}).get("tasks") or ()) if teacher == "base" else set()
    datasets = (params.get("teacher_cache") or {}).get("datasets") or {}
    keys = ("logits", "mlm_topk", "hidden_layers", "attn_layers", "attn_probs", "embeddings")
    return {f"teacher_cache.datasets.{name}": requested(**{k: (d.get("signals") or {}).get(k) for k in keys})
            for name, d in datasets.items() if d.get("teacher") == teacher or d.get("teacher") in derived}


def check_teacher_signals(config: Any, asked: Mapping[str, list[str]]) -> None:
    """Raise :class:`ArchitectureError` with one line for the first dataset (of :func:`teacher_signals`) asking a
    teacher of ``config`` for a signal it cannot give."""
    for where, signals in asked.items():
        check_signals(config, signals, where)
