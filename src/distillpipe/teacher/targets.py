"""What a dataset's teacher targets are, whether a store caches them or a run computes them live: the teacher's
facts (its sizes and how it computes), the rows of a ``teacher_cache.datasets`` entry, and the signal spec that
entry makes. The build (:mod:`distillpipe.teacher.cache`), a live run (:mod:`distillpipe.teacher.live`) and
``distillpipe plan`` all decide them here, so a live run's targets are the cache's by construction; and a student
stage that runs its teacher live holds this module, not the build's driver, writer and cluster code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import torch

from distillpipe.config.teacher_cache import SignalsConfig, TeacherCacheDatasetConfig
from distillpipe.data.schema import longest_list
from distillpipe.data.subset import row_subset
from distillpipe.errors import UserError
from distillpipe.store.schema import SignalPrecision, SignalSpec
from distillpipe.teacher.capture import teacher_head


class TeacherCacheError(UserError, ValueError):
    """The teacher, the tokens and the requested signals do not fit together."""


def compute_settings(model: torch.nn.Module, batch_size: int, cpu_threads: int) -> dict[str, object]:
    """How the values are computed (the manifest's ``compute``): the precision (bf16 autocast on CUDA, fp32 on
    CPU: :func:`distillpipe.runtime.autocast`), the attention kernel and weight dtype the teacher was loaded
    with, the batch size (padding and kernel choice follow it) and, on CPU, the threads of one computation
    (a matmul split over other thread counts can round differently: measured on the tiny test teacher)."""
    param = next(model.parameters())
    cuda = param.device.type == "cuda"
    return {"precision": "bf16-autocast" if cuda else "fp32",
            "attn_implementation": str(model.config._attn_implementation), "weights_dtype": str(param.dtype),
            "batch_size": int(batch_size), "cpu_threads": None if cuda else int(cpu_threads)}



@dataclass(frozen=True)
class TeacherSizes:
    """What a signal spec needs to know about the teacher (:func:`spec_for`)."""

    head: str
    """``base``, ``mlm``, ``classification`` or ``qa``."""
    num_labels: int
    vocab_size: int
    hidden_size: int
    n_heads: int


@dataclass(frozen=True)
class TeacherFacts:
    """What the store's manifest and signal spec need to know about the teacher, as a worker loads it."""

    config: dict[str, Any]
    head: str
    num_labels: int
    vocab_size: int
    hidden_size: int
    n_heads: int
    compute: dict[str, Any]
    device: str

    @property
    def sizes(self) -> TeacherSizes:
        return TeacherSizes(head=self.head, num_labels=self.num_labels, vocab_size=self.vocab_size,
                            hidden_size=self.hidden_size, n_heads=self.n_heads)


def describe(model: torch.nn.Module, batch_size: int, cpu_threads: int) -> TeacherFacts:
    """What the manifest and the signal spec need to know of a loaded teacher."""
    mc = model.config
    return TeacherFacts(config=mc.to_diff_dict(), head=teacher_head(model), num_labels=int(mc.num_labels),
                        vocab_size=int(mc.vocab_size), hidden_size=int(mc.hidden_size),
                        n_heads=int(mc.num_attention_heads), compute=compute_settings(model, batch_size, cpu_threads),
                        device=str(next(model.parameters()).device))



def split_rows(name: str, tokens_dir: str | Path, split: str, max_rows: int | None) -> tuple[Any, np.ndarray | None]:
    """The tokens split item ``name`` caches (``split`` of ``tokens_dir``) and the rows of it that are kept
    (:func:`row_subset`; None: all): for the driver, its workers and ``distillpipe plan`` alike."""
    from datasets import load_from_disk

    data = load_from_disk(str(tokens_dir))
    if split not in data:
        raise TeacherCacheError(f"teacher_cache.datasets.{name}.split={split!r}: {tokens_dir} has splits {list(data)}")
    rows = data[split]
    return rows, row_subset(len(rows), max_rows)



def signal_spec(cfg: TeacherCacheDatasetConfig, facts: TeacherFacts, tokens_meta: dict, rows) -> SignalSpec:
    """The store's signal spec for ``cfg`` on this teacher and these tokens (:func:`spec_for` with the most masked
    positions of any of ``rows``)."""
    max_masked = max_masked_positions(rows, tokens_meta) if cfg.signals.mlm_topk else 0
    return spec_for(cfg.signals, facts.sizes, int(tokens_meta["max_seq_len"]), max_masked)


def spec_for(s: SignalsConfig, teacher: TeacherSizes, max_seq_len: int, max_masked: int) -> SignalSpec:
    """The one place where the user's :class:`~distillpipe.config.teacher_cache.SignalsConfig` becomes a
    :class:`~distillpipe.store.schema.SignalSpec`: the selection from ``s``, the sizes from the teacher, the
    tokens' ``max_seq_len`` and ``max_masked`` (M, the most masked positions of any row; ignored without
    ``mlm_topk``). The build passes what it reads from the model and the tokens (:func:`signal_spec`);
    ``distillpipe plan`` what it reads from ``config.json`` and the tokens folder, or a bound on M."""
    task = "none"
    if s.logits:
        task = "qa" if teacher.head == "qa" else "classification"
    p = s.precision
    # a precision for a signal the store does not keep is float16 in the spec: it must not change the identity
    attention = bool(s.attn_layers) and (not s.attn_probs or bool(s.attn_rank))  # dense probabilities stay float16
    precision = SignalPrecision(hidden=p.hidden if s.hidden_layers else "float16",
                                attention=p.attention if attention else "float16",
                                mlm_topk=p.mlm_topk if s.mlm_topk else "float16")
    hidden_rank = min(s.hidden_rank or 0, teacher.hidden_size) if s.hidden_layers else 0
    return SignalSpec(
        max_seq_len=int(max_seq_len), pool=s.pool, task=task,
        n_classes=teacher.num_labels if task == "classification" else 0,
        vocab_size=teacher.vocab_size, mlm_topk=s.mlm_topk, mlm_max_masked=int(max_masked) if s.mlm_topk else 0,
        hidden_layers=tuple(s.hidden_layers), hidden_size=teacher.hidden_size,
        # attn_probs: the attention layers are kept as unpooled probabilities INSTEAD of pooled scores
        attn_layers=() if s.attn_probs else tuple(s.attn_layers), n_heads=teacher.n_heads,
        attn_probs_layers=tuple(s.attn_layers) if s.attn_probs else (),
        embedding_size=teacher.hidden_size if s.embeddings else 0, precision=precision,
        # a rank of at least the width keeps every dimension: the full states, no subspace
        hidden_rank=hidden_rank if hidden_rank < teacher.hidden_size else 0,
        hidden_fit_rows=s.hidden_fit_rows if 0 < hidden_rank < teacher.hidden_size else 0,
        attn_rank=(s.attn_rank or 0) if s.attn_layers else 0,
    )


def max_masked_positions(rows, tokens_meta: dict) -> int:
    """M: the most masked positions of any of ``rows`` (a ``datasets.Dataset`` of MLM tokens), read from Arrow
    (no Python list per row, so it stays fast on millions of rows)."""
    if "masked_positions" not in rows.column_names:
        raise TeacherCacheError(f"signals.mlm_topk needs MLM tokens (with masked_positions); "
                                f"{tokens_meta['name']} is {tokens_meta['kind']}")
    return longest_list(rows, "masked_positions")  # in Arrow batches: memory flat in rows


def masked_counts(rows) -> np.ndarray:
    """(n,) the number of masked positions of each of ``rows`` (the dataset's row selection applied)."""
    column = rows.with_format("arrow")["masked_positions"]  # a pyarrow array over the selected rows
    return np.asarray(pc.list_value_length(column).to_numpy(zero_copy_only=False), dtype=np.int64)
