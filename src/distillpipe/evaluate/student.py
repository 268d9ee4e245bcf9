"""Scoring a student on a tokens split: the metric the training loop early-stops on and the
``evaluate`` stage reports. GLUE metrics come from scikit-learn/SciPy (evaluate/metrics.py), QA from
the official SQuAD v2 procedure (evaluate/squad.py); MLM corpora are scored by masked-token
cross-entropy and accuracy at the static masks. Parameter counts: :mod:`distillpipe.evaluate.size`.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch

from distillpipe.data.batching import length_batches
from distillpipe.data.collate import IGNORE, collate
from distillpipe.evaluate.scoring import Scored, example_ids, score_classification, score_qa
from distillpipe.runtime import autocast


def primary_metric(kind: str, dataset_meta: dict, lm: bool = False) -> str:
    """The dev metric to early-stop on and to plot (higher is better). ``lm``: a language-model student (ELMo-C
    and baselines) on a corpus, scored by next/previous-token top-1 accuracy, comparable across output layers."""
    if kind == "mlm" and lm:
        return "lm_accuracy"
    if kind == "mlm":
        return "mlm_accuracy"
    if kind == "qa":
        return "f1"
    if dataset_meta.get("task_type") == "regression":
        return "pearson"
    return "matthews" if str(dataset_meta.get("name", "")).lower() in ("cola",) else "accuracy"


@torch.inference_mode()
def _outputs(model, rows, *, kind: str, pad_id: int, device: torch.device, batch_size: int, pairs: bool,
             bin_width: float | None = None):
    """Yield (row indices, batch, targets, output) over ``rows`` bucketed by length."""
    cols = [c for c in ("input_ids", "token_type_ids", "masked_positions", "masked_labels", "label",
                        "start_positions", "end_positions", "a_input_ids", "b_input_ids") if c in rows.column_names]
    if not pairs:
        cols = [c for c in cols if c not in ("a_input_ids", "b_input_ids")]
    table = rows.select_columns(cols)
    for idx in length_batches(np.asarray(rows["length"]), batch_size):
        batch, targets = collate(table[idx.tolist()], kind=kind, pad_id=pad_id, labeled=True, pairs=pairs,
                                 bin_width=bin_width)
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(device):
            out = model(batch)
        yield idx, batch, targets, out


def evaluate_student(model, rows, *, kind: str, pad_id: int, device: torch.device, batch_size: int, pairs: bool,
                     prepared_dir: str | Path | None = None, split: str = "dev",
                     threshold: float | None = None, bin_width: float | None = None) -> dict[str, float]:
    """Metrics of ``model`` on the token rows of one split (see :func:`score_student`)."""
    return score_student(model, rows, kind=kind, pad_id=pad_id, device=device, batch_size=batch_size, pairs=pairs,
                         prepared_dir=prepared_dir, split=split, threshold=threshold,
                         bin_width=bin_width).metrics


def score_student(model, rows, *, kind: str, pad_id: int, device: torch.device, batch_size: int, pairs: bool,
                  prepared_dir: str | Path | None = None, split: str = "dev",
                  threshold: float | None = None, bin_width: float | None = None) -> Scored:
    """Metrics and per-example records of ``model`` on the token rows of one split. QA: ``prepared_dir``
    gives the examples, and the no-answer ``threshold`` is tuned on this split when None (pass dev's when
    scoring test). ``bin_width``: a regression task cast to bins (scored by the expected value)."""
    was = model.training
    model.eval()
    try:
        if kind == "mlm":
            loss_sum, correct, count = 0.0, 0, 0
            outputs = _outputs(model, rows, kind=kind, pad_id=pad_id, device=device, batch_size=batch_size,
                               pairs=False)
            first = next(outputs, None)
            if first is not None and first[3].lm is not None:  # a language-model student (ELMo-C, baselines)
                return Scored(_score_lm([first], outputs))
            for _, _, targets, out in itertools.chain([first] if first is not None else [], outputs):
                labels = targets["mlm_labels"].to(device)  # (B, M)
                keep = labels != IGNORE
                logits = out.mlm_logits.float()[keep]  # (n, V)
                loss_sum += float(torch.nn.functional.cross_entropy(logits, labels[keep], reduction="sum"))
                correct += int((logits.argmax(-1) == labels[keep]).sum())
                count += int(keep.sum())
            return Scored({"mlm_loss": loss_sum / max(count, 1), "mlm_accuracy": correct / max(count, 1)})
        if kind == "classification":
            logits = None
            for idx, _, _, out in _outputs(model, rows, kind=kind, pad_id=pad_id, device=device,
                                            batch_size=batch_size, pairs=pairs, bin_width=bin_width):
                out_logits = out.logits.float().cpu().numpy()
                if logits is None:
                    logits = np.zeros((len(rows), out_logits.shape[-1]), dtype=np.float32)
                logits[idx] = out_logits
            return score_classification(example_ids(rows), rows["label"], logits, bin_width)
        if kind == "qa":
            from datasets import load_from_disk

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
            return score_qa(examples, windows, starts, ends, threshold)
        raise ValueError(f"cannot evaluate tokens of kind {kind!r}")
    finally:
        model.train(was)


def _score_lm(*outputs) -> dict[str, float]:
    """A language model on a corpus: ``lm_loss``, its training loss (cosine distance for continuous outputs,
    negative log-likelihood for softmax outputs: comparable only within one output type), and ``lm_accuracy``,
    the share of next/previous tokens that are the model's top-1 (the nearest vector by cosine for continuous
    outputs): comparable across output layers. Both directions' predictions count."""
    loss_sum, correct, count = 0.0, 0, 0
    for _, _, _, out in itertools.chain(*outputs):
        lm = out.lm
        n = int(lm.target_ids.numel())
        if lm.vectors is not None:
            cos = torch.nn.functional.cosine_similarity(lm.vectors.float(), lm.target_vectors.float(), dim=-1)
            loss_sum += float((1.0 - cos).sum())
        else:
            loss_sum += float(-lm.logprob.float().sum())
        correct += int((lm.top1 == lm.target_ids).sum())
        count += n
    return {"lm_loss": loss_sum / max(count, 1), "lm_accuracy": correct / max(count, 1)}
