"""One shard of the ``teacher_cache`` stage: the code that decides a store's bytes.

:func:`compute_shard` is a self-contained function of (teacher, tokens, row range): it buckets the
shard's rows by length, captures the requested signals batch by batch (pooled on the device) and
returns the shard's arrays, padded to the store's fixed shapes, put back in dataset order by the store's
writer's thread when it reads them (:class:`ShardArrays`); the writer
(:func:`distillpipe.store.writer.write_shard`) checks and encodes them.

This module's import closure is part of the store manifest's ``code``, which is the whole
``teacher_cache`` stage's closure (:func:`distillpipe.teacher.cache.producer_code`): an edit that can
change a stored byte (capture, pooling, batching, layout, codecs, row selection, loading) rebuilds the
store. Everything else the bytes depend on is an
argument here and a manifest field there (teacher, tokens, split, signals, compute settings), so this
module reads no config.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, MutableMapping

import numpy as np
import torch

from distillpipe.compact import Constants
from distillpipe.store.schema import ROW_INDEX, SignalSpec
from distillpipe.teacher.batching import TokenColumns, length_buckets
from distillpipe.teacher.capture import capture_batch, to_host


class ShardArrays(MutableMapping):
    """A shard's arrays as the capture produced them, batch by batch in length order; each array is put in row
    order (one copy) when it is first read. The store's writer reads them in its own thread
    (:func:`distillpipe.store.writer.write_shard`), so that copy, a shard's worth of bytes, is off the capture's
    path: on a GPU the device would otherwise wait for it. Holds about one shard: a batch's piece is dropped once
    its array is assembled."""

    def __init__(self, n: int):
        self.n = n
        self._pieces: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def add(self, idx: np.ndarray, batch: dict[str, np.ndarray]) -> None:
        """The arrays of the rows ``idx`` (positions in the shard) of one batch."""
        for name, a in batch.items():
            self._pieces.setdefault(name, []).append((idx, a))

    def __getitem__(self, name: str) -> np.ndarray:
        with self._lock:
            if name not in self._arrays:
                pieces = self._pieces.pop(name)  # KeyError for an unknown name, as a dict
                first = pieces[0][1]
                out = np.empty((self.n, *first.shape[1:]), dtype=first.dtype)
                for idx, a in pieces:
                    out[idx] = a
                self._arrays[name] = out
            return self._arrays[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        with self._lock:
            self._pieces.pop(name, None)
            self._arrays[name] = value

    def __delitem__(self, name: str) -> None:
        with self._lock:
            self._pieces.pop(name, None)
            self._arrays.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._arrays) + [k for k in self._pieces if k not in self._arrays])

    def __len__(self) -> int:
        return len(set(self._arrays) | set(self._pieces))


def compute_shard(model: torch.nn.Module, rows, start: int, stop: int, spec: SignalSpec, batch_size: int,
                  pad_id: int, constants: Constants | None = None) -> ShardArrays:
    """The teacher signals of rows [start, stop) of ``rows`` (a tokens ``Dataset``), in row order.

    Rows are length-bucketed into batches (little padding), captured and copied to host; sequence axes are
    padded to the store's shapes with the fill values. Each array is put back in dataset order when it is read
    (:class:`ShardArrays`). nan/inf are refused by the writer, which checks every array it stores. ``constants``: the
    store's subspaces and derived embedding layer, on the model's device (:mod:`distillpipe.store.constants`).
    """
    columns = TokenColumns(rows, start, stop)
    out = ShardArrays(stop - start)
    out[ROW_INDEX] = np.arange(start, stop, dtype=np.int64)
    buckets = length_buckets(columns.lengths, batch_size)
    batch = columns.collate(buckets[0], pad_id) if buckets else None
    for k, idx in enumerate(buckets):
        signals = capture_batch(model, batch, spec, seq_len=spec.max_seq_len, max_masked=spec.mlm_max_masked or None,
                                constants=constants)
        # on a GPU the capture is only queued here: cut the next batch while it runs, then wait for its copy
        batch = columns.collate(buckets[k + 1], pad_id) if k + 1 < len(buckets) else None
        out.add(np.asarray(idx), to_host(signals, check=False))
    return out
