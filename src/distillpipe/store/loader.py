"""Block loader: shuffled, seeded, resumable training reads from a teacher-cache store.

Reading rows one at a time decodes a whole inner chunk per row; this loader instead reads whole
chunk-aligned blocks of ``block_rows`` rows and shuffles at three levels, all derived from
``(seed, epoch)``:

1. the order of the shards;
2. the order of the blocks within each shard (shards are visited one after another, so reads stay
   local to one shard file at a time);
3. the rows within a *window* of ``buffer_blocks`` consecutive blocks held in memory (a window
   is permuted with its own generator, seeded by ``(seed, epoch, window index)``).

Windows are dealt round-robin to DataLoader workers (window ``w`` goes to worker
``w % num_workers``, by worker id); each worker opens the store itself, lazily, inside ``__iter__`` (never at
pickle time), so it works with ``spawn``/``forkserver``. PyTorch returns the workers' batches
round-robin (skipping exhausted workers), so the sequence of batches is a pure function of
(seed, epoch, num_workers, batch_size, block_rows, buffer_blocks): with ``num_workers=0`` it is
the same as with one worker.

Position: :class:`BlockLoader` counts the batches it has handed out in the current epoch;
``state_dict()`` / ``load_state_dict()`` save and restore ``(epoch, batches_consumed)``. On
resume each worker works out its role and how many of its batches were consumed
(:func:`resume_plan`), skips the windows it had finished without reading them, re-reads and
re-permutes the current window and skips its consumed rows, so a resumed run continues with
exactly the batch an uninterrupted run would have produced next (resuming needs the same
num_workers and sizes; this is checked).

Memory per worker: ``buffer_blocks * block_rows`` rows of the requested arrays (plus one batch).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

from distillpipe.store.manifest import Manifest
from distillpipe.store.reader import TeacherStore, open_store

log = logging.getLogger(__name__)

Rows = dict[str, np.ndarray]
Batch = tuple[Any, Rows]
_CONFIG_KEYS = ("seed", "batch_size", "block_rows", "buffer_blocks", "num_workers", "names")


def block_windows(
    manifest: Manifest, block_rows: int, buffer_blocks: int, seed: int, epoch: int
) -> list[list[tuple[int, int]]]:
    """The epoch's windows: lists of up to ``buffer_blocks`` blocks ``(start, stop)`` (store rows),
    in reading order. Pure function of its arguments (no I/O)."""
    rng = np.random.default_rng([seed, epoch])
    blocks: list[tuple[int, int]] = []
    for s in rng.permutation(manifest.n_shards):
        start, stop = manifest.shard_rows_range(int(s))
        n_blocks = -(-(stop - start) // block_rows)
        for b in rng.permutation(n_blocks):
            lo = start + int(b) * block_rows
            blocks.append((lo, min(stop, lo + block_rows)))
    return [blocks[k : k + buffer_blocks] for k in range(0, len(blocks), buffer_blocks)]


def resume_plan(batches_per_worker: Sequence[int], consumed: int) -> tuple[list[int], int]:
    """Where a DataLoader stood after handing out ``consumed`` batches of an epoch.

    PyTorch returns the workers' batches round-robin (worker 0, 1, ..., skipping exhausted
    workers). Returns (batches each worker had delivered, the worker whose batch comes next). A
    resumed DataLoader starts its round-robin at worker 0 again, so a resumed worker ``s`` takes the
    role of worker ``(s + next) % num_workers``: the rotated round-robin then continues the
    original sequence exactly.
    """
    total = sum(batches_per_worker)
    if not 0 <= consumed <= total:
        raise ValueError(f"batches_consumed={consumed} is outside this epoch's {total} batches")
    lo, hi = 0, max(batches_per_worker, default=0)
    while lo < hi:  # largest number of full rounds r with sum(min(n, r)) <= consumed
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in batches_per_worker) <= consumed:
            lo = mid
        else:
            hi = mid - 1
    done = [min(n, lo) for n in batches_per_worker]
    live = [w for w, n in enumerate(batches_per_worker) if n > lo]  # workers with a batch in round lo
    rest = consumed - sum(done)
    for w in live[:rest]:
        done[w] += 1
    return done, (live[rest] if rest < len(live) else 0)


class BlockDataset(torch.utils.data.IterableDataset):
    """One epoch of shuffled rows from a store, as an IterableDataset (use with ``batch_size=None``
    in the DataLoader: it yields ready batches). Most users want :class:`BlockLoader`.

    Yields ``(row_index, arrays)``: with ``batch_size`` an int, ``row_index`` is the (B,) int64
    array of the store's ``row_index`` (rows of the tokens dataset) and ``arrays`` maps each name to
    a (B, ...) array; with ``batch_size=None`` single rows (an int and (...) arrays). Each worker's
    last batch of an epoch may be short.
    """

    def __init__(
        self,
        store_path: str | Path,
        names: Sequence[str],
        *,
        block_rows: int,
        buffer_blocks: int,
        batch_size: int | None,
        seed: int,
        expected: Manifest | Mapping[str, Any] | None,
    ):
        super().__init__()
        if block_rows < 1 or buffer_blocks < 1 or (batch_size is not None and batch_size < 1) or seed < 0:
            raise ValueError(
                f"need block_rows, buffer_blocks, batch_size >= 1 and seed >= 0, got {block_rows}, "
                f"{buffer_blocks}, {batch_size}, {seed}"
            )
        self.store_path = str(store_path)
        self.names = tuple(names)
        self.block_rows, self.buffer_blocks, self.batch_size, self.seed = block_rows, buffer_blocks, batch_size, seed
        self.expected = expected
        self.epoch = 0
        self.batches_consumed = 0
        self._store: TeacherStore | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None  # every process opens the store itself
        return state

    def set_position(self, epoch: int, batches_consumed: int) -> None:
        self.epoch, self.batches_consumed = epoch, batches_consumed

    def store(self) -> TeacherStore:
        if self._store is None:
            self._store = open_store(self.store_path, self.expected)
            self._check_alignment(self._store)
        return self._store

    def _check_alignment(self, store: TeacherStore) -> None:
        unknown = [n for n in self.names if n not in store.layout]
        if unknown:
            raise KeyError(f"{self.store_path} has no arrays {unknown}; it has {list(store.arrays)}")
        shard_rows = store.manifest.shard_rows
        chunk_rows = max(store.layout[n].chunk_rows for n in ("row_index", *self.names))
        if shard_rows % self.block_rows or self.block_rows % chunk_rows:
            raise ValueError(
                f"block_rows={self.block_rows} must divide shard_rows={shard_rows} and be a multiple of the "
                f"inner chunk rows ({chunk_rows}) of {list(self.names)}, so that blocks are chunk-aligned"
            )

    def batches_per_worker(self, num_workers: int, epoch: int) -> list[int]:
        """Batches each of ``num_workers`` workers yields in ``epoch`` (no data I/O)."""
        windows = block_windows(self.store().manifest, self.block_rows, self.buffer_blocks, self.seed, epoch)
        unit = self.batch_size or 1
        out = []
        for w in range(max(1, num_workers)):
            rows = sum(b - a for window in windows[w :: max(1, num_workers)] for a, b in window)
            out.append(-(-rows // unit))
        return out

    def __iter__(self) -> Iterator[Batch]:
        info = torch.utils.data.get_worker_info()
        slot, n_workers = (0, 1) if info is None else (info.id, info.num_workers)
        store = self.store()
        windows = block_windows(store.manifest, self.block_rows, self.buffer_blocks, self.seed, self.epoch)
        unit = self.batch_size or 1
        done, first = resume_plan(self.batches_per_worker(n_workers, self.epoch), self.batches_consumed)
        worker = (slot + first) % n_workers  # the role this process plays (see resume_plan)
        skip_rows = done[worker] * unit
        names = tuple(dict.fromkeys(("row_index", *self.names)))
        pending: list[dict[str, np.ndarray]] = []
        n_pending = 0
        for w in range(worker, len(windows), n_workers):
            window = windows[w]
            n_rows = sum(b - a for a, b in window)
            if skip_rows >= n_rows:
                skip_rows -= n_rows
                continue
            parts = [store.read(names, a, b) for a, b in window]
            data = {n: np.concatenate([p[n] for p in parts]) for n in names}
            order = np.random.default_rng([self.seed, self.epoch, w]).permutation(n_rows)[skip_rows:]
            skip_rows = 0
            data = {n: v[order] for n, v in data.items()}
            pending.append(data)
            n_pending += len(order)
            while n_pending >= unit:
                batch, pending, n_pending = _take(pending, unit)
                yield self._emit(batch)
        if n_pending:
            batch, pending, n_pending = _take(pending, n_pending)
            yield self._emit(batch)

    def _emit(self, batch: dict[str, np.ndarray]) -> Batch:
        rows = batch["row_index"]
        arrays = {n: batch[n] for n in self.names}
        if self.batch_size is None:
            return int(rows[0]), {n: v[0] for n, v in arrays.items()}
        return rows, arrays


def _take(pending: list[Rows], n: int) -> tuple[Rows, list[Rows], int]:
    """First n rows of the queued pieces, and what is left."""
    taken, left, need = [], [], n
    for piece in pending:
        size = len(piece["row_index"])
        if need >= size:
            taken.append(piece)
            need -= size
        elif need > 0:
            taken.append({k: v[:need] for k, v in piece.items()})
            left.append({k: v[need:] for k, v in piece.items()})
            need = 0
        else:
            left.append(piece)
    batch = taken[0] if len(taken) == 1 else {k: np.concatenate([p[k] for p in taken]) for k in taken[0]}
    return batch, left, sum(len(p["row_index"]) for p in left)


def _identity(x: Any) -> Any:
    return x


class BlockLoader:
    """Iterable over one epoch of batches per ``for`` loop, with a resumable position.

    ``for batch in loader`` runs the rest of the current epoch (from the restored position) and
    then advances ``loader.epoch``. Batches are numpy arrays (``torch.from_numpy`` them; zero-copy).
    With ``num_workers > 0`` a torch DataLoader runs :class:`BlockDataset` in worker processes
    started with ``multiprocessing_context`` ("spawn" when None, as DESIGN.md asks; "forkserver"
    works too); each worker opens the store itself.
    """

    def __init__(
        self,
        store_path: str | Path,
        names: Sequence[str],
        *,
        block_rows: int,
        buffer_blocks: int,
        seed: int,
        expected: Manifest | Mapping[str, Any] | None,
        batch_size: int | None,
        num_workers: int = 0,
        multiprocessing_context: str | None = None,
    ):
        self.dataset = BlockDataset(
            store_path, names, block_rows=block_rows, buffer_blocks=buffer_blocks, batch_size=batch_size,
            seed=seed, expected=expected,
        )  # fmt: skip
        self.dataset.store()  # validate manifest, names and alignment here, before spawning workers
        self.num_workers = num_workers
        self.multiprocessing_context = (multiprocessing_context or "spawn") if num_workers else None
        self.epoch = 0
        self.batches_consumed = 0

    def __len__(self) -> int:
        """Batches in the current epoch."""
        return sum(self.dataset.batches_per_worker(self.num_workers, self.epoch))

    def set_epoch(self, epoch: int) -> None:
        """Jump to the start of ``epoch``."""
        self.epoch, self.batches_consumed = epoch, 0

    def __iter__(self) -> Iterator[Batch]:
        self.dataset.set_position(self.epoch, self.batches_consumed)
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=None,
            num_workers=self.num_workers,
            multiprocessing_context=self.multiprocessing_context,
            collate_fn=_identity,
            # its own generator: a DataLoader iterator otherwise draws its base seed from the global torch
            # RNG, shifting the dropout stream of the training run by one draw per epoch (and resume)
            generator=torch.Generator().manual_seed(self.dataset.seed),
        )
        for batch in loader:
            self.batches_consumed += 1  # counted before the caller sees it: a state saved now includes it
            yield batch
        self.epoch += 1
        self.batches_consumed = 0

    def state_dict(self) -> dict[str, Any]:
        d = self.dataset
        return {
            "epoch": self.epoch,
            "batches_consumed": self.batches_consumed,
            "seed": d.seed,
            "batch_size": d.batch_size,
            "block_rows": d.block_rows,
            "buffer_blocks": d.buffer_blocks,
            "num_workers": self.num_workers,
            "names": list(d.names),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        mine = self.state_dict()
        differ = [
            f"{k}: checkpoint {state.get(k)!r}, loader {mine[k]!r}" for k in _CONFIG_KEYS if state.get(k) != mine[k]
        ]
        if differ:
            raise ValueError(
                "cannot resume the block loader exactly: its settings differ from the checkpoint's ("
                + "; ".join(differ) + "); use the checkpoint's settings or start a new epoch"
            )
        self.epoch, self.batches_consumed = int(state["epoch"]), int(state["batches_consumed"])
