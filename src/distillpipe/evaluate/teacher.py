"""Scoring a teacher: the code that scores students (:mod:`distillpipe.evaluate.scoring`) applied to a
transformers model's outputs. ``teacher_finetune`` selects its checkpoint with it on dev, the ``evaluate``
stage reads the scores it recorded (``metrics.json``, ``predictions.json`` in the teacher's folder).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from distillpipe.data.batching import collate_tokens, length_batches
from distillpipe.evaluate.scoring import Scored, example_ids, score_classification, score_qa
from distillpipe.runtime import autocast
from distillpipe.teacher.arch import model_inputs
from distillpipe.teacher.mlm_head import COLUMNS, TOPK_MASS, masked_logits, mlm_batch

METRICS_FILE = "metrics.json"
PREDICTIONS_FILE = "predictions.json"
"""Per-example records of the scored splits (evaluate/scoring.py), for the report's intervals and paired tests."""


@torch.inference_mode()
def predict(model, rows, pad_id: int, device: torch.device, batch_size: int) -> tuple[np.ndarray, ...]:
    """Run ``model`` over token rows (length-bucketed), returning outputs in row order."""
    was_training = model.training
    model.eval()
    order = length_batches(np.asarray(rows["length"]), batch_size)
    outs: list[list[np.ndarray]] = []
    cols = rows.select_columns(["input_ids", "token_type_ids"])
    for idx in order:
        inputs = {k: v.to(device) for k, v in collate_tokens(cols[idx.tolist()], pad_id).items()}
        with autocast(device):
            out = model(**model_inputs(model, inputs))  # DistilBERT, ModernBERT: no token types
        parts = [out.start_logits, out.end_logits] if hasattr(out, "start_logits") else [out.logits]
        for i, t in enumerate(parts):
            t = t.float().cpu().numpy()  # (B, C) or (B, T)
            if len(outs) <= i:
                outs.append([None] * len(rows))
            for j, r in enumerate(idx):
                outs[i][r] = t[j]
    model.train(was_training)
    return tuple(outs)


def score_teacher(model, rows, task_type: str, pad_id: int, device: torch.device, batch_size: int,
                  bin_width: float | None, prepared_dir: str | Path, split: str = "dev",
                  threshold: float | None = None) -> Scored:
    """Scores and per-example records of a fine-tuned teacher on the token ``rows`` of ``split``, by the code that
    scores students (:mod:`distillpipe.evaluate.scoring`): QA from ``prepared_dir``'s examples, the no-answer
    ``threshold`` tuned on these rows when None (pass dev's when scoring test); regression by the expected value
    over the bins."""
    if task_type == "corpus":
        return score_mlm(model, rows, pad_id, device, batch_size)
    outs = predict(model, rows, pad_id, device, batch_size)
    if task_type == "qa":
        from datasets import load_from_disk

        examples = load_from_disk(str(prepared_dir))[split]
        lengths = rows["length"]
        starts = [s[:n] for s, n in zip(outs[0], lengths)]
        ends = [e[:n] for e, n in zip(outs[1], lengths)]
        return score_qa(examples, rows.select_columns(["example_id", "offset_mapping"]), starts, ends, threshold)
    return score_classification(example_ids(rows), rows["label"], np.stack(outs[0]),
                                bin_width if task_type == "regression" else None)


@torch.inference_mode()
def score_mlm(model: nn.Module, rows, pad_id: int, device: torch.device, batch_size: int) -> Scored:
    """Masked-token accuracy, mean cross-entropy and perplexity (exp of it) at the static masks of ``rows``, and
    ``top<k>_mass``: the mean probability the k most likely tokens hold (for k in :data:`TOPK_MASS`)."""
    was = model.training
    model.eval()
    cols = rows.select_columns(COLUMNS)
    loss_sum, correct, count = 0.0, 0, 0
    mass = dict.fromkeys(TOPK_MASS, 0.0)
    for idx in length_batches(np.asarray(rows["length"]), batch_size):
        inputs, positions, valid, labels = mlm_batch(cols[idx.tolist()], pad_id, device)
        with autocast(device):
            logits = masked_logits(model, inputs, positions, valid).float()
        loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
        correct += int((logits.argmax(-1) == labels).sum())
        count += int(labels.numel())
        top = logits.softmax(-1).topk(min(max(TOPK_MASS), logits.shape[-1]), dim=-1).values.cumsum(-1)  # (n, K)
        for k in TOPK_MASS:
            mass[k] += float(top[:, min(k, top.shape[-1]) - 1].sum())
    model.train(was)
    loss = loss_sum / max(count, 1)
    return Scored({"mlm_accuracy": correct / max(count, 1), "mlm_loss": loss, "perplexity": math.exp(loss),
                   "masked_tokens": count, **{f"top{k}_mass": v / max(count, 1) for k, v in mass.items()}})
