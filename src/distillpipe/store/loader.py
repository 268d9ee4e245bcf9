"""Block loader: shuffled, seeded, resumable training reads from a teacher-cache store, split into streams
so that data-parallel processes each read only their own blocks.

Reading rows one at a time decodes a whole inner chunk per row; this loader instead reads whole
chunk-aligned blocks of ``block_rows`` rows and shuffles at three levels, all derived from
``(seed, epoch)``:

1. the order of the shards;
2. the order of the blocks within each shard (shards are visited one after another, so reads stay
   local to one shard file at a time);
3. the rows within a *window* of ``buffer_blocks`` consecutive blocks held in memory (a window
   is permuted with its own generator, seeded by ``(seed, epoch, window index)``).

**Streams.** The epoch's windows are dealt round-robin to ``streams`` streams (window ``w`` to stream
``w % streams``); each stream cuts its permuted rows into sub-batches of ``batch_size / streams`` rows.
Global batch ``t`` is the concatenation of every stream's ``t``-th sub-batch, in stream order. So the
batches are a pure function of (seed, epoch, streams, batch_size, block_rows, buffer_blocks), and NOT of
how many processes read them (:func:`stream_share`): with ``world`` data-parallel processes and ``streams`` a
multiple of ``world``, process ``r`` reads only streams ``[r * streams / world, (r + 1) * streams / world)``,
i.e. only their blocks, and its local batch is its streams' part of the global batch; with ``streams`` a
divisor of ``world``, the ``world / streams`` processes of a stream each read all its blocks and take their
equal slice of each of its sub-batches (each block is then read that many times: the price of running a
params file written for fewer processes, such as the embedded one's ``streams: 1``). An epoch ends when a
stream runs out: with one stream read by one process after its last (possibly short) batch; otherwise after
the last step at which every stream still has a full sub-batch (the few rows left over are a different few
each epoch; a short batch cannot be split equally over processes).

DataLoader workers only add parallelism inside a process: worker ``j`` of ``num_workers`` reads the
process's streams ``j, j + num_workers, ...`` (so ``num_workers`` must divide the process's number of
streams) and the process puts the sub-batches back in stream order: the batches are the same whatever
``num_workers``. Each worker opens the store itself, lazily, inside ``__iter__`` (never at pickle time),
so it works with ``spawn``/``forkserver``.

Position: :class:`BlockLoader` counts the batches it has handed out in the current epoch;
``state_dict()`` / ``load_state_dict()`` save and restore ``(epoch, batches_consumed)``. Streams move in
lock step, so on resume each one skips ``batches_consumed`` sub-batches: it passes the windows it had
finished without reading them, re-reads and re-permutes the current one and skips its consumed rows,
so a resumed run continues with exactly the batch an uninterrupted run would have produced next
(resuming needs the same seed, sizes and streams; this is checked).

Memory per process: two windows (``buffer_blocks * block_rows`` rows of the requested arrays: the one served and
the next, read meanwhile; allocated once an epoch and reused) per stream it reads, plus one batch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

from distillpipe.store.manifest import Manifest
from distillpipe.store.reader import TeacherStore, open_store

log = logging.getLogger(__name__)


class RowTable:
    """The rows a run reads when no store holds their targets (a live teacher computes them), laid out as a store of
    them would be: ``row_index`` (the tokens rows) and ``length`` in shards of ``shard_rows``. The block loader reads
    it as it reads a store, so a run's batches are the same rows in the same order whether its targets come from a
    cache of these rows or from the teacher run on each batch."""

    def __init__(self, row_index: np.ndarray, length: np.ndarray, shard_rows: int):
        self.row_index = np.ascontiguousarray(row_index, dtype=np.int64)
        self.length = np.ascontiguousarray(length, dtype=np.int32)
        if self.row_index.shape != self.length.shape or self.row_index.ndim != 1 or shard_rows < 1:
            raise ValueError(f"a row table needs row_index and length of one shape and shard_rows >= 1, got "
                             f"{self.row_index.shape}, {self.length.shape}, {shard_rows}")
        self.n_rows, self.shard_rows = len(self.row_index), int(shard_rows)
        self.layout = {"row_index": self.row_index[:0], "length": self.length[:0]}
        """Per name, an empty array of its row shape and dtype (as a store's layout gives them)."""

    @property
    def manifest(self) -> RowTable:
        return self  # what block_windows reads of a manifest: n_shards, shard_rows_range

    @property
    def n_shards(self) -> int:
        return -(-self.n_rows // self.shard_rows)

    def shard_rows_range(self, i: int) -> tuple[int, int]:
        return i * self.shard_rows, min(self.n_rows, (i + 1) * self.shard_rows)

    def read_blocks(self, names, blocks, out=None) -> dict[str, np.ndarray]:
        idx = np.concatenate([np.arange(a, b) for a, b in blocks]) if blocks else np.zeros(0, np.int64)
        return {n: getattr(self, n)[idx] for n in names}


Rows = dict[str, np.ndarray]
Batch = tuple[np.ndarray, Rows]
_CONFIG_KEYS = ("seed", "batch_size", "block_rows", "buffer_blocks", "streams", "names")


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


def stream_windows(windows: list[list[tuple[int, int]]], streams: int) -> list[list[tuple[int, list]]]:
    """Each stream's windows, as ``(window index, blocks)``: window ``w`` goes to stream ``w % streams``."""
    return [[(w, windows[w]) for w in range(k, len(windows), streams)] for k in range(streams)]


def steps_per_epoch(stream_rows: Sequence[int], sub_batch: int, *, shared: bool = False) -> int:
    """Global batches in an epoch whose streams hold ``stream_rows`` rows (see the module docstring); ``shared``:
    several processes split each sub-batch, so a short last one is left out."""
    if len(stream_rows) == 1 and not shared:
        return -(-stream_rows[0] // sub_batch)
    return min(n // sub_batch for n in stream_rows)


def check_processes(streams: int, world: int, batch_size: int, *, streams_key: str = "loader.streams",
                    batch_key: str = "optim.batch_size") -> None:
    """Raise ValueError, naming the value to set, unless ``world`` processes can read ``streams`` streams of
    ``batch_size``-row batches: ``streams`` a multiple of ``world`` (each process reads its own streams) or a divisor
    of it whose sub-batches split equally (the processes of a stream share it)."""
    if streams % world == 0:
        return
    if world % streams:
        fits = sorted({world, math.gcd(streams, world)})
        raise ValueError(
            f"{streams_key}={streams} does not fit {world} training processes: the streams must be a multiple of "
            f"the process count (each process reads its own streams) or divide it (the processes of a stream share "
            f"it). Set {streams_key} to {' or '.join(map(str, fits))} in params.yaml (the batches follow the "
            f"streams), or run a number of processes that {streams} is a multiple or a divisor of")
    if batch_size % world:
        size = -(-batch_size // world) * world
        raise ValueError(
            f"{batch_key}={batch_size} cannot be split equally over {world} training processes: with "
            f"{streams_key}={streams} the {world // streams} processes of a stream share its "
            f"{batch_size // streams}-row sub-batches. Set {batch_key} to a multiple of {world} (e.g. {size}), or "
            f"{streams_key} to a multiple of {world}")


def stream_share(streams: int, world: int, rank: int) -> tuple[list[int], int, int]:
    """(the streams process ``rank`` of ``world`` reads, its slice of each of their sub-batches, the slices a
    sub-batch is cut into): a contiguous share of whole streams when ``streams`` is a multiple of ``world``, else
    (``streams`` divides ``world``) one stream shared by ``world / streams`` processes."""
    if streams % world == 0:
        per = streams // world
        return list(range(rank * per, (rank + 1) * per)), 0, 1
    parts = world // streams
    return [rank // parts], rank % parts, parts


class BlockDataset(torch.utils.data.IterableDataset):
    """One epoch of one process's part of the global batches, as an IterableDataset (use with
    ``batch_size=None`` in the DataLoader). Most users want :class:`BlockLoader`.

    Yields, per step, the list of this worker's sub-batches (one per stream it reads, in stream order),
    each a dict of ``row_index`` (the tokens rows) and the requested arrays.
    """

    def __init__(
        self,
        store_path: str | Path | RowTable,
        names: Sequence[str],
        *,
        block_rows: int,
        buffer_blocks: int,
        batch_size: int,
        seed: int,
        expected: Manifest | Mapping[str, Any] | None,
        streams: int,
        rank: int = 0,
        world: int = 1,
    ):
        super().__init__()
        if min(block_rows, buffer_blocks, batch_size, streams, world) < 1 or seed < 0 or not 0 <= rank < world:
            raise ValueError(
                f"need block_rows, buffer_blocks, batch_size, streams, world >= 1, seed >= 0 and 0 <= rank < world, "
                f"got {block_rows}, {buffer_blocks}, {batch_size}, {streams}, {world}, {seed}, {rank}"
            )
        if batch_size % streams:
            raise ValueError(f"batch_size={batch_size} must be a multiple of loader.streams={streams}: every stream "
                             "gives the same number of rows to a batch")
        check_processes(streams, world, batch_size, batch_key="batch_size")
        self.table = store_path if isinstance(store_path, RowTable) else None
        self.store_path = None if self.table is not None else str(store_path)
        self.names = tuple(names)
        self.block_rows, self.buffer_blocks, self.batch_size, self.seed = block_rows, buffer_blocks, batch_size, seed
        self.streams, self.rank, self.world = streams, rank, world
        self.sub_batch = batch_size // streams
        self.mine, self.part, self.parts = stream_share(streams, world, rank)
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

    def store(self) -> TeacherStore | RowTable:
        if self.table is not None:
            unknown = [n for n in self.names if n not in self.table.layout]
            if unknown:
                raise KeyError(f"a row table has no arrays {unknown}: only row_index and length")
            return self.table
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

    def plan(self, epoch: int) -> tuple[list[list[tuple[int, list]]], int]:
        """(each stream's windows, global batches) of ``epoch``: no data I/O."""
        windows = block_windows(self.store().manifest, self.block_rows, self.buffer_blocks, self.seed, epoch)
        if len(windows) < self.streams:
            raise ValueError(f"loader.streams={self.streams} is more than the {len(windows)} windows of "
                             f"buffer_blocks x block_rows = {self.buffer_blocks * self.block_rows} rows in "
                             f"{self.store_path or 'the rows'}: lower streams or buffer_blocks")
        per_stream = stream_windows(windows, self.streams)
        rows = [sum(b - a for _, blocks in ws for a, b in blocks) for ws in per_stream]
        return per_stream, steps_per_epoch(rows, self.sub_batch, shared=self.world > self.streams)

    def __len__(self) -> int:
        return self.plan(self.epoch)[1]

    def __iter__(self) -> Iterator[list[Rows]]:
        info = torch.utils.data.get_worker_info()
        slot, n_workers = (0, 1) if info is None else (info.id, info.num_workers)
        mine = self.mine[slot::n_workers]
        per_stream, steps = self.plan(self.epoch)
        skip = self.batches_consumed
        iters = [self._sub_batches(per_stream[k], skip) for k in mine]
        n = self.sub_batch // self.parts  # this process's slice of a sub-batch (all of it unless shared)
        lo = self.part * n
        for _ in range(skip, steps):
            subs = [next(it) for it in iters]
            yield subs if self.parts == 1 else [{k: v[lo:lo + n] for k, v in sub.items()} for sub in subs]

    def _sub_batches(self, windows: list[tuple[int, list]], skip: int) -> Iterator[Rows]:
        """One stream's sub-batches from the ``skip``-th on: windows already consumed are passed unread, and the next
        window is read (in a background thread: file reads and chunk checks release the GIL) while the current one is
        served, so the student does not wait for the disk between windows."""
        store = self.store()
        names = tuple(dict.fromkeys(("row_index", *self.names)))
        size = self.sub_batch
        todo, skip_rows = [], skip * size
        for w, blocks in windows:
            n_rows = sum(b - a for a, b in blocks)
            if skip_rows >= n_rows:
                skip_rows -= n_rows
                continue
            todo.append((w, blocks, n_rows, skip_rows))
            skip_rows = 0
        pending: list[tuple[Rows, np.ndarray]] = []  # (a window's rows, the positions in it still to yield)
        n_pending = 0
        prefetch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-prefetch")
        capacity = self.buffer_blocks * self.block_rows
        buffers = [{n: np.empty((capacity, *store.layout[n].shape[1:]), dtype=store.layout[n].dtype) for n in names}
                   for _ in range(min(2, len(todo)))]  # windows k and k + 1; window k + 2 reuses k's, by then served

        def read(k: int) -> Rows:
            return store.read_blocks(names, todo[k][1], out=buffers[k % 2])

        try:
            ahead = prefetch.submit(read, 0) if todo else None
            for k, (w, _, n_rows, skip_rows) in enumerate(todo):
                data = ahead.result()  # the window, read once into one array per name
                ahead = prefetch.submit(read, k + 1) if k + 1 < len(todo) else None
                order = np.random.default_rng([self.seed, self.epoch, w]).permutation(n_rows)[skip_rows:]
                pending.append((data, order))  # rows are gathered batch by batch: no permuted copy of the window
                n_pending += len(order)
                while n_pending >= size:
                    batch, pending, n_pending = _take(pending, size)
                    yield batch
                # the few rows left (fewer than a batch) are copied out, so the window is freed before the next
                pending = [({k: v[idx] for k, v in rows.items()}, np.arange(len(idx))) for rows, idx in pending]
                del data
            if n_pending:  # the short last sub-batch (used only when there is one stream)
                yield _take(pending, n_pending)[0]
        finally:
            prefetch.shutdown(wait=True, cancel_futures=True)


def _take(pending: list[tuple[Rows, np.ndarray]], n: int) -> tuple[Rows, list[tuple[Rows, np.ndarray]], int]:
    """The next n rows of the queued windows (gathered: each row is copied once, into its batch), and what is left."""
    taken, left, need = [], [], n
    for data, idx in pending:
        if need > 0:
            rows = idx[:need]
            taken.append({k: v[rows] for k, v in data.items()})
            need -= len(rows)
            if len(rows) < len(idx):
                left.append((data, idx[len(rows):]))
        else:
            left.append((data, idx))
    batch = taken[0] if len(taken) == 1 else {k: np.concatenate([p[k] for p in taken]) for k in taken[0]}
    return batch, left, sum(len(idx) for _, idx in left)


def _identity(x: Any) -> Any:
    return x


class BlockLoader:
    """Iterable over one epoch of this process's batches per ``for`` loop, with a resumable position.

    ``for rows, arrays in loader`` runs the rest of the current epoch (from the restored position) and
    then advances ``loader.epoch``. ``rows`` is the (B,) int64 array of the store's ``row_index`` (rows of
    the tokens dataset), ``arrays`` maps each name to a (B, ...) numpy array (``torch.from_numpy`` them;
    zero-copy); B is ``batch_size * (streams this process reads) / streams``, or ``batch_size / world`` when processes
    share streams. With ``num_workers > 0`` a
    torch DataLoader runs :class:`BlockDataset` in worker processes started with ``multiprocessing_context``
    ("spawn" when None, as DESIGN.md asks; "forkserver" works too); each worker opens the store itself.
    """

    def __init__(
        self,
        store_path: str | Path | RowTable,
        names: Sequence[str],
        *,
        block_rows: int,
        buffer_blocks: int,
        seed: int,
        expected: Manifest | Mapping[str, Any] | None,
        batch_size: int,
        streams: int = 1,
        num_workers: int = 0,
        rank: int = 0,
        world: int = 1,
        multiprocessing_context: str | None = None,
    ):
        self.dataset = BlockDataset(
            store_path, names, block_rows=block_rows, buffer_blocks=buffer_blocks, batch_size=batch_size,
            seed=seed, expected=expected, streams=streams, rank=rank, world=world,
        )  # fmt: skip
        mine = len(self.dataset.mine)
        if num_workers < 0 or (num_workers and mine % num_workers):
            raise ValueError(f"loader.num_workers={num_workers} must be 0 or divide the {mine} stream(s) each "
                             f"training process reads (streams {streams} / {world} processes)")
        if self.dataset.parts > 1 and rank == 0:
            log.warning("loader.streams=%d for %d training processes: the %d processes of a stream each read all its "
                        "blocks (%dx the reads of one process); set loader.streams to a multiple of %d to read each "
                        "block once (it changes the batches)", streams, world, self.dataset.parts,
                        self.dataset.parts, world)
        self.dataset.plan(0)  # validate manifest, names, alignment and streams here, before spawning workers
        self.num_workers = num_workers
        self.multiprocessing_context = (multiprocessing_context or "spawn") if num_workers else None
        self.epoch = 0
        self.batches_consumed = 0

    def __len__(self) -> int:
        """Batches in the current epoch (the same in every process)."""
        return self.dataset.plan(self.epoch)[1]

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
        n = max(1, self.num_workers)
        parts: list[list[Rows]] = []
        for part in loader:  # the workers' parts of one step arrive round-robin, worker 0 first
            parts.append(part)
            if len(parts) < n:
                continue
            subs = [parts[i % n][i // n] for i in range(sum(len(p) for p in parts))]  # back in stream order
            parts = []
            batch = subs[0] if len(subs) == 1 else {k: np.concatenate([s[k] for s in subs]) for k in subs[0]}
            self.batches_consumed += 1  # counted before the caller sees it: a state saved now includes it
            yield batch["row_index"], {name: batch[name] for name in self.dataset.names}
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
            "streams": d.streams,
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
