"""A store's constants, computed from the teacher before any shard: each cached layer's principal subspace (fitted on
a sample of the cached rows) and the teacher's embedding tables (:mod:`distillpipe.compact`,
:mod:`distillpipe.store.constants`).

The fit runs the teacher over ``hidden_fit_rows`` rows evenly spaced over the cached ones (length-bucketed as the
shards are), pools each cached layer as the capture does, and accumulates the first and second moments of the
pooled states of the real positions in float64; each layer's basis is the top-r eigenvectors of their covariance,
centred and not standardised (measured on the embedded MiniLM: standardising keeps less of the variance at every r,
and the WaLDORf loss is an MSE in the teacher's own coordinates). A function of the teacher, the rows, the spec and
the compute settings, as the shards are: the driver computes it once, writes it into the store, and a resume reuses
it.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from distillpipe.compact import CovarianceSum, fit_subspace, variance_kept
from distillpipe.data.subset import row_subset
from distillpipe.pooling import pooled_mask
from distillpipe.store.schema import SignalSpec, hidden_array, subspace_arrays
from distillpipe.teacher.batching import TokenColumns, length_buckets
from distillpipe.teacher.capture import capture_batch, embedding_constants

log = logging.getLogger(__name__)

SPECTRUM_RANKS = (16, 32, 64, 128, 256, 512, 1024)
"""The ranks at which a fit reports the share of each layer's variance kept (``inspect`` and ``plan`` print it)."""


def fit_constants(model: torch.nn.Module, rows: Any, spec: SignalSpec, batch_size: int,
                  pad_id: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """({constant name: array}, info) for a store of ``spec`` over ``rows`` (the cached rows, a tokens ``Dataset``):
    the embedding tables when the spec keeps the embeddings, the subspaces when it has a ``hidden_rank``."""
    arrays: dict[str, np.ndarray] = {}
    info: dict[str, Any] = {}
    if spec.embedding_size:
        tables, how = embedding_constants(model, pad_id)
        arrays.update(tables)
        info["embeddings"] = how
    if spec.hidden_rank:
        subspaces, report = fit_subspaces(model, rows, spec, batch_size, pad_id)
        for j, (mean, basis) in subspaces.items():
            m, u = subspace_arrays(j)
            arrays[m], arrays[u] = mean, basis
        info["hidden"] = report
    return arrays, info


def fit_subspaces(model: torch.nn.Module, rows: Any, spec: SignalSpec, batch_size: int,
                  pad_id: int) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], dict[str, Any]]:
    """({layer: (mean (d,), basis (d, r)) float32}, {``L{j}``: the fit's sample and the variance it keeps}) for the
    cached hidden layers of ``spec``, from ``spec.hidden_fit_rows`` evenly spaced rows of ``rows``."""
    subset = row_subset(len(rows), spec.hidden_fit_rows)
    sample = rows if subset is None else rows.select(subset)
    columns = TokenColumns(sample, 0, len(sample))
    states = SignalSpec(max_seq_len=spec.max_seq_len, pool=spec.pool, task="none", n_classes=0,
                        vocab_size=spec.vocab_size, mlm_topk=0, mlm_max_masked=0, hidden_layers=spec.hidden_layers,
                        hidden_size=spec.hidden_size, attn_layers=(), n_heads=spec.n_heads, attn_probs_layers=(),
                        embedding_size=0)  # the pooled states themselves, and nothing else
    sums = {j: CovarianceSum(spec.hidden_size) for j in spec.hidden_layers}
    for idx in length_buckets(columns.lengths, batch_size):
        batch = columns.collate(idx, pad_id)
        out = capture_batch(model, batch, states)
        device = out[hidden_array(spec.hidden_layers[0])].device
        valid = pooled_mask(batch["attention_mask"].bool(), spec.pool).to(device)
        for j in spec.hidden_layers:
            sums[j].add(out[hidden_array(j)][valid])
    subspaces, report = {}, {}
    for j, acc in sums.items():
        mean, basis, values = fit_subspace(acc, spec.hidden_rank)
        subspaces[j] = (mean.float().numpy(), basis.float().numpy())
        spectrum = variance_kept(values, [r for r in SPECTRUM_RANKS if r < spec.hidden_size] + [spec.hidden_size])
        kept = variance_kept(values, [spec.hidden_rank])[spec.hidden_rank]
        report[f"L{j}"] = {"rank": spec.hidden_rank, "rows": len(sample), "positions": acc.n, "variance_kept": kept,
                           "spectrum": {str(r): v for r, v in spectrum.items()}}
        log.info("hidden/L%d: the top %d of %d principal components keep %.1f%% of the variance (%d positions of %d "
                 "rows)", j, spec.hidden_rank, spec.hidden_size, 100 * kept, acc.n, len(sample))
    return subspaces, report
