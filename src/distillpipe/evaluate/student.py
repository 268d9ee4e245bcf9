"""Scoring a student on a tokens split: the metric the training loop early-stops on and the
``evaluate`` stage reports. GLUE metrics come from scikit-learn/SciPy (evaluate/metrics.py), QA from
the official SQuAD v2 procedure (evaluate/squad.py); MLM corpora are scored by masked-token
cross-entropy and accuracy at the static masks. Also: parameter counts of a model (student or teacher).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from distillpipe.data.batching import length_batches
from distillpipe.runtime import autocast
from distillpipe.train.data import IGNORE, collate


def primary_metric(kind: str, dataset_meta: dict) -> str:
    """The dev metric to early-stop on and to plot (higher is better)."""
    if kind == "mlm":
        return "mlm_accuracy"
    if kind == "qa":
        return "f1"
    return "matthews" if str(dataset_meta.get("name", "")).lower() in ("cola",) else "accuracy"


@torch.inference_mode()
def _outputs(model, rows, *, kind: str, pad_id: int, device: torch.device, batch_size: int, pairs: bool):
    """Yield (row indices, batch, targets, output) over ``rows`` bucketed by length."""
    cols = [c for c in ("input_ids", "token_type_ids", "masked_positions", "masked_labels", "label",
                        "start_positions", "end_positions", "a_input_ids", "b_input_ids") if c in rows.column_names]
    if not pairs:
        cols = [c for c in cols if c not in ("a_input_ids", "b_input_ids")]
    table = rows.select_columns(cols)
    for idx in length_batches(np.asarray(rows["length"]), batch_size):
        batch, targets = collate(table[idx.tolist()], None, kind=kind, pad_id=pad_id, labeled=True, pairs=pairs,
                                 pool=1)
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(device):
            out = model(batch)
        yield idx, batch, targets, out


def evaluate_student(model, rows, *, kind: str, pad_id: int, device: torch.device, batch_size: int, pairs: bool,
                     dataset_meta: dict, prepared_dir: str | Path | None = None,
                     split: str = "dev", threshold: float | None = None) -> dict[str, float]:
    """Metrics of ``model`` on the token rows of one split (QA: ``prepared_dir`` gives the examples, and the
    no-answer ``threshold`` is tuned on this split when None: pass dev's when scoring test)."""
    from distillpipe.evaluate.metrics import classification_metrics

    was = model.training
    model.eval()
    try:
        if kind == "mlm":
            loss_sum, correct, count = 0.0, 0, 0
            for _, _, targets, out in _outputs(model, rows, kind=kind, pad_id=pad_id, device=device,
                                                batch_size=batch_size, pairs=False):
                labels = targets["mlm_labels"].to(device)  # (B, M)
                keep = labels != IGNORE
                logits = out.mlm_logits.float()[keep]  # (n, V)
                loss_sum += float(torch.nn.functional.cross_entropy(logits, labels[keep], reduction="sum"))
                correct += int((logits.argmax(-1) == labels[keep]).sum())
                count += int(keep.sum())
            return {"mlm_loss": loss_sum / max(count, 1), "mlm_accuracy": correct / max(count, 1)}
        if kind == "classification":
            preds = np.zeros(len(rows), dtype=np.int64)
            for idx, _, _, out in _outputs(model, rows, kind=kind, pad_id=pad_id, device=device,
                                            batch_size=batch_size, pairs=pairs):
                preds[idx] = out.logits.float().argmax(-1).cpu().numpy()
            labels = np.asarray(rows["label"])
            keep = labels >= 0  # unlabeled rows (-1, e.g. GLUE test) are not scored
            return classification_metrics(labels[keep], preds[keep])
        if kind == "qa":
            from datasets import load_from_disk

            from distillpipe.evaluate.squad import best_spans, squad_v2_scores

            if prepared_dir is None:
                raise ValueError("QA evaluation needs the prepared dataset (the examples' contexts and answers)")
            n = len(rows)
            starts: list = [None] * n
            ends: list = [None] * n
            lengths = rows["length"]
            for idx, _, _, out in _outputs(model, rows, kind=kind, pad_id=pad_id, device=device,
                                            batch_size=batch_size, pairs=False):
                s, e = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
                for j, r in enumerate(idx):
                    starts[r], ends[r] = s[j, : lengths[r]], e[j, : lengths[r]]
            examples = load_from_disk(str(prepared_dir))[split]
            windows = rows.select_columns(["example_id", "offset_mapping"])
            return squad_v2_scores(examples, best_spans(examples, windows, starts, ends), threshold=threshold)
        raise ValueError(f"cannot evaluate tokens of kind {kind!r}")
    finally:
        model.train(was)


def count_parameters(model: nn.Module) -> dict[str, int]:
    """``{"total": ..., "without_embeddings": ...}`` parameter counts (CMOW paper Tables XII-XIII).

    Embeddings are the parameters of ``nn.Embedding`` / ``nn.EmbeddingBag`` modules (token,
    position, type, CMOW matrix embeddings). Shared or tied parameters are counted once; a weight
    tied to an embedding (e.g. an MLM decoder) counts as embedding.
    """
    params = {id(p): p.numel() for p in model.parameters()}
    embedding = {
        id(p) for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for p in m.parameters()
    }
    total = sum(params.values())
    return {"total": total, "without_embeddings": total - sum(params[i] for i in embedding if i in params)}
