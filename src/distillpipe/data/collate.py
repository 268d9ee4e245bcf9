"""Student batches: token rows collated for a student, with their ground-truth targets.

Used by training (:mod:`distillpipe.train.data` yields the rows), evaluation and ``predict``. :func:`collate` pads
to the batch's longest row; labels without ground truth (augmented rows, GLUE's -1 test labels) become
:data:`IGNORE`. The teacher's targets, which only training reads, are
:func:`distillpipe.train.data.teacher_targets`: so this module, and evaluation with it, holds no code of the
teacher cache's layout or of pooling (docs/code-deps.md).
"""

from __future__ import annotations

import numpy as np
import torch

from distillpipe.data.batching import length_mask, pad_sequences
from distillpipe.data.schema import regression_bins
from distillpipe.errors import UserError

IGNORE = -100  # label value ignored by the cross-entropy losses


class TrainDataError(UserError, ValueError):
    """Tokens, teacher cache and run params do not fit together."""


def collate(rows: dict[str, list], *, kind: str, pad_id: int, labeled: bool, pairs: bool,
            bin_width: float | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(batch for the student, ground-truth targets for the losses). Targets: ``attention_mask`` (B, T) and
    ``labels`` (B,) / ``start_positions``, ``end_positions`` (B,) / ``mlm_labels`` (B, M) with IGNORE for no
    ground truth (a training step adds the teacher's: :func:`distillpipe.train.data.teacher_targets`).
    ``bin_width``: regression labels become the index of their bin, ``round(label / bin_width)``, as the
    teacher was fine-tuned on them (:func:`distillpipe.data.schema.regression_bins`)."""
    ids = rows["input_ids"]
    input_ids = pad_sequences(ids, pad_id)  # (B, T)
    B, T = input_ids.shape
    lengths = torch.tensor([len(s) for s in ids])
    batch = {
        "input_ids": input_ids,
        "token_type_ids": pad_sequences(rows["token_type_ids"], 0),
        "attention_mask": length_mask(lengths, T),  # (B, T) bool
    }
    if pairs:
        for side in ("a", "b"):
            seqs = rows[f"{side}_input_ids"]
            if any(len(s) == 0 for s in seqs):
                raise TrainDataError("DiffCat encoding needs two sentences per row, but this dataset has rows "
                                     "without a second sentence: use encoding: joint")
            t = pad_sequences(seqs, pad_id)
            n = torch.tensor([len(s) for s in seqs])
            batch[f"{side}_input_ids"] = t
            batch[f"{side}_attention_mask"] = length_mask(n, t.shape[1])
    targets: dict[str, torch.Tensor] = {"attention_mask": batch["attention_mask"]}
    has_truth = torch.full((B,), labeled)  # (B,) rows with ground truth
    if "labeled" in rows:
        has_truth &= torch.as_tensor(np.asarray(rows["labeled"], dtype=bool))
    if kind == "mlm":
        batch["mlm_positions"] = pad_sequences(rows["masked_positions"], -1)  # (B, M)
        # the static masks undone, for causal language models (ELMo-C): they must read the real tokens
        unmasked = input_ids.clone()
        labels = pad_sequences(rows["masked_labels"], pad_id)  # (B, M) the original ids at the masked positions
        slots = batch["mlm_positions"] >= 0
        unmasked[torch.arange(B)[:, None].expand_as(slots)[slots], batch["mlm_positions"][slots]] = labels[slots]
        batch["unmasked_input_ids"] = unmasked  # (B, T)
        targets["mlm_positions"] = batch["mlm_positions"]
        targets["mlm_labels"] = pad_sequences(rows["masked_labels"], IGNORE).masked_fill(~has_truth[:, None], IGNORE)
    elif kind == "classification":
        labels = torch.as_tensor(np.asarray(rows["label"]))
        unlabeled = (labels < 0) | ~has_truth  # GLUE test rows carry -1
        if labels.is_floating_point():
            if bin_width is None:
                raise TrainDataError("regression labels reached the student loop without the teacher's bin width")
            labels = torch.from_numpy(regression_bins(labels.numpy(), bin_width))
        targets["labels"] = labels.long().masked_fill(unlabeled, IGNORE)
    elif kind == "qa":
        for k in ("start_positions", "end_positions"):
            targets[k] = torch.as_tensor(np.asarray(rows[k]), dtype=torch.long).masked_fill(~has_truth, IGNORE)
    return batch, targets
