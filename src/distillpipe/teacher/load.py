"""Loading a teacher for signal capture: the right head, eval mode, a fused attention kernel.

Attention kernel: ``sdpa`` (fused; flash attention on CUDA), not ``eager``, where the architecture has one
(:data:`distillpipe.teacher.arch.ARCHS`; DeBERTa-v2/v3 has none and loads eager). The capture never asks
the model for attention maps: its hooks recompute the pre-softmax scores of the *selected* layers
from their query/key projections (``capture.py``), which works under any kernel and is tested
against ``output_attentions`` of an eager run. Eager attention would only add cost: it
materialises every layer's (B, H, L, L) probabilities, selected or not, and is the slowest kernel
(on CPU the whole capture measured 0.80 of a bare eager forward, against 0.97 with sdpa).

``load_teacher`` refuses a head the checkpoint does not have instead of letting transformers
initialise it randomly (which it does with only a log line): random MLM or task logits would be
cached, shared through DVC and distilled from without anyone noticing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import torch

from distillpipe.assets import AssetError, resolve_model
from distillpipe.runtime import resolve_device
from distillpipe.teacher.arch import arch_of

log = logging.getLogger(__name__)

Head = Literal["base", "mlm", "classification", "qa"]
HEADS: tuple[str, ...] = ("base", "mlm", "classification", "qa")

_HEAD_ADVICE = {
    "mlm": "it has no MLM head, so it cannot give MLM logits; use hidden-state and attention signals only "
           "(mlm_topk: 0) or a teacher checkpoint that includes its MLM head (e.g. bert-base-uncased)",
    "classification": "it has no fine-tuned classification head; run the teacher_finetune stage for this task "
                      "or point the teacher at a fine-tuned checkpoint",
    "qa": "it has no fine-tuned question-answering (start/end) head; run the teacher_finetune stage for this task "
          "or point the teacher at a fine-tuned checkpoint",
    "base": "its encoder weights are incomplete; check that the folder holds the full checkpoint",
}


def _auto_class(head: str):
    import transformers

    return {
        "base": transformers.AutoModel,
        "mlm": transformers.AutoModelForMaskedLM,
        "classification": transformers.AutoModelForSequenceClassification,
        "qa": transformers.AutoModelForQuestionAnswering,
    }[head]


def load_teacher(spec_or_dir: str | Path, head: Head, device: str | torch.device):
    """Load ``(model, tokenizer)`` from a model spec (see :func:`distillpipe.assets.resolve_model`).

    The model uses sdpa attention (see the module docstring), is in ``eval()`` mode, fp32 (autocast decides the compute
    dtype at capture time) and on ``device`` (``auto``, ``cpu``, ``cuda``, ``cuda:1``...). Raises
    :class:`AssetError` when the checkpoint lacks the requested head or part of the encoder.
    """
    from transformers import AutoTokenizer

    if head not in HEADS:
        raise ValueError(f"unknown teacher head {head!r}; choose one of {HEADS}")
    model_dir = resolve_model(str(spec_or_dir))
    dev = resolve_device(str(device)) if not isinstance(device, torch.device) else device
    from transformers import AutoConfig

    kernel = arch_of(AutoConfig.from_pretrained(model_dir)).kernel  # DeBERTa-v2 has no sdpa: eager (arch.py)
    model, info = _auto_class(head).from_pretrained(
        model_dir, attn_implementation=kernel, output_loading_info=True
    )
    # The pooler only feeds sequence classification; a checkpoint saved without it (e.g. from a
    # *ForMaskedLM) is complete for every other head.
    missing = sorted(k for k in info["missing_keys"] if head == "classification" or "pooler" not in k)
    if missing:
        shown = ", ".join(missing[:6]) + (f" (+{len(missing) - 6} more)" if len(missing) > 6 else "")
        raise AssetError(
            f"teacher {spec_or_dir} ({model_dir}) cannot be loaded with head {head!r}: "
            f"{_HEAD_ADVICE[head]}. Weights missing from the checkpoint: {shown}"
        )
    model.eval().to(dev)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    log.info("teacher %s: %s, head %s, %d layers, %s", spec_or_dir, type(model).__name__, head,
             model.config.num_hidden_layers, dev)
    return model, tokenizer
