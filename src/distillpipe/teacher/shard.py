"""One shard of the ``teacher_cache`` stage: the code that decides a store's bytes.

:func:`compute_shard` is a self-contained function of (teacher, tokens, row range): it buckets the
shard's rows by length, captures the requested signals batch by batch (pooled on the device) and
returns the shard's arrays in dataset order, padded to the store's fixed shapes; the store's writer
(:func:`distillpipe.store.writer.write_shard`) encodes them.

This module's import closure is part of the store manifest's ``code``, which is the whole
``teacher_cache`` stage's closure (:func:`distillpipe.teacher.cache.producer_code`): an edit that can
change a stored byte (capture, pooling, batching, layout, codecs, row selection, loading) rebuilds the
store. Everything else the bytes depend on is an
argument here and a manifest field there (teacher, tokens, split, signals, compute settings), so this
module reads no config.
"""

from __future__ import annotations

import numpy as np
import torch

from distillpipe.store.schema import ROW_INDEX, SignalSpec
from distillpipe.teacher.batching import collate, length_buckets
from distillpipe.teacher.capture import capture_batch, to_host

# Token columns the teacher needs, per kind of tokens (MLM rows also carry their masked positions).
_INPUT_COLUMNS = ["input_ids", "token_type_ids", "length"]


def compute_shard(model: torch.nn.Module, rows, start: int, stop: int, spec: SignalSpec, batch_size: int,
                  pad_id: int) -> dict[str, np.ndarray]:
    """The teacher signals of rows [start, stop) of ``rows`` (a tokens ``Dataset``), in row order.

    Rows are length-bucketed into batches (little padding), captured, copied to host and put back
    in dataset order; sequence axes are padded to the store's shapes with the fill values.
    """
    cols = [c for c in _INPUT_COLUMNS + ["masked_positions"] if c in rows.column_names]
    shard = rows.select(range(start, stop)).select_columns(cols)
    n = stop - start
    out: dict[str, np.ndarray] = {ROW_INDEX: np.arange(start, stop, dtype=np.int64)}
    for idx in length_buckets(shard["length"], batch_size):
        batch = collate(shard[idx], pad_id)
        signals = to_host(capture_batch(model, batch, spec, seq_len=spec.max_seq_len,
                                        max_masked=spec.mlm_max_masked or None))
        for name, a in signals.items():
            if name not in out:
                out[name] = np.empty((n, *a.shape[1:]), dtype=a.dtype)
            out[name][idx] = a
    return out
