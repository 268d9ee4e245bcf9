"""An MLM prediction head for a teacher that has none (``teacher_finetune`` on an MLM corpus).

General distillation in the CMOW paper (sec. III-B, IV-A) needs the teacher's MLM distribution at the
masked positions. A checkpoint without an MLM head (the embedded MiniLM, a sentence encoder) gets a BERT
prediction head: transform (dense + GELU + LayerNorm), decoder tied to the input embeddings, and a
per-token bias (``BertOnlyMLMHead``). Only the head's own parameters train, on the corpus's static
masks; the encoder and the embeddings (hence the tied decoder) stay frozen, so the teacher's hidden
states and attention are the ones it had, and its cached MLM targets describe that same encoder.

The head is each family's own (:func:`distillpipe.teacher.arch.mlm_logits`: BERT ``cls``, RoBERTa ``lm_head``,
DistilBERT ``vocab_transform``/``vocab_layer_norm``/``vocab_projector``, ELECTRA the generator's
``generator_predictions``/``generator_lm_head``, DeBERTa-v2/v3 ``lm_predictions``, ModernBERT ``head``/``decoder``);
an architecture outside that table is refused with its name.

A checkpoint that has its MLM head (bert-base-uncased, bert-large-uncased-whole-word-masking) is kept as
it is: no step is taken, and the stage only scores it and saves it.

The head is applied at the masked positions only, (n, d) -> (n, V), never to every position: the (B, T, V)
logits of a 30k vocabulary would cost T/M (~7x) more for nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from distillpipe.data.batching import collate_tokens, pad_sequences
from distillpipe.runtime import autocast
from distillpipe.teacher.arch import mlm_logits, model_inputs

log = logging.getLogger(__name__)
COLUMNS = ["input_ids", "token_type_ids", "masked_positions", "masked_labels"]
TOPK_MASS = (8, 16, 32, 64, 128, 256)
"""k whose mean top-k probability mass :func:`score_mlm` reports: the measurement that sizes teacher_cache's
``mlm_topk`` (what the k cached logits keep of the distribution; the rest is one tail bucket)."""


def build_mlm_model(base_dir: Path) -> tuple[nn.Module, bool]:
    """``(model, head_is_new)``: ``base_dir`` loaded as a masked LM; when its checkpoint has no MLM head the head
    is freshly initialised and everything else is frozen (``head_is_new``), otherwise nothing is frozen and
    nothing will train."""
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the new head is reported as MISSING, which reads like an error here
    model, info = AutoModelForMaskedLM.from_pretrained(base_dir, output_loading_info=True)
    prefix = model.base_model_prefix + "."
    missing = [k for k in info["missing_keys"] if not k.startswith(prefix)]
    if not missing:
        log.info("%s has its MLM head: kept as it is (no training)", base_dir)
        return model, False
    log.info("initialising a BERT MLM head on %s (new: %s); the encoder and embeddings stay frozen", base_dir,
             ", ".join(sorted(missing)[:4]) + (" ..." if len(missing) > 4 else ""))
    for p in model.base_model.parameters():
        p.requires_grad_(False)  # the tied decoder weight is the input embedding: frozen with it
    return model, True


def masked_logits(model: nn.Module, inputs: dict[str, torch.Tensor], positions: torch.Tensor,
                  valid: torch.Tensor) -> torch.Tensor:
    """(n, V) head logits at the ``valid`` entries of ``positions`` (B, M); the encoder runs without gradients."""
    with torch.no_grad():
        seq = model.base_model(**model_inputs(model, inputs)).last_hidden_state  # (B, T, d)
    B, M = positions.shape
    hidden = seq.gather(1, positions.clamp(min=0)[..., None].expand(B, M, seq.shape[-1]))  # (B, M, d)
    return mlm_logits(model, hidden[valid])  # (n, V): each family's own head (arch.py)


def mlm_batch(rows: dict[str, list], pad_id: int, device: torch.device):
    """(encoder inputs, positions (B, M), valid (B, M), labels (n,)) of a columnar batch of MLM token rows."""
    inputs = {k: v.to(device) for k, v in collate_tokens(rows, pad_id).items()}
    positions = pad_sequences(rows["masked_positions"], -1).to(device)
    valid = positions >= 0
    labels = pad_sequences(rows["masked_labels"], -1).to(device)[valid]
    return inputs, positions, valid, labels


def mlm_loss(model: nn.Module, rows: dict[str, list], pad_id: int, device: torch.device) -> torch.Tensor:
    """Mean cross-entropy of the masked tokens of a batch."""
    inputs, positions, valid, labels = mlm_batch(rows, pad_id, device)
    with autocast(device):
        logits = masked_logits(model, inputs, positions, valid)
    return nn.functional.cross_entropy(logits.float(), labels)
