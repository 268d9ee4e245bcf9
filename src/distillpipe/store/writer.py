"""Writing a teacher-cache store: write shards, finalize (opening it: :mod:`distillpipe.store.resume`).

Division of labour (so shards can be fanned out over processes or dask workers):

* the **driver** calls :func:`~distillpipe.store.resume.create_or_resume` once, before any shard is
  written: it creates the store, or resumes it (keeps verified shards, removes ``*.partial``
  leftovers, un-marks damaged shards), or rebuilds it when the params, inputs or code changed.
  It alone writes the manifest.
* a **shard writer** (the driver itself or any worker process) calls the self-contained
  :func:`write_shard` ``(store_path, shard_index, arrays)``: it writes that shard's file of every
  array and then its completion marker (:mod:`distillpipe.store.shards`). Writers of different
  shards never touch the same file, so they can run concurrently; two writers of the *same* shard
  must never run at once (Zarr would interleave their bytes).
* the driver folds markers into ``completed_shards`` (:meth:`StoreWriter.record` /
  :meth:`StoreWriter.refresh`) and finally calls :meth:`StoreWriter.finalize`.

One writer per store: :func:`~distillpipe.store.resume.create_or_resume` takes the store's lock
(:mod:`distillpipe.store.lock`) before it reads, deletes or creates anything, and the :class:`StoreWriter`
holds it until :meth:`~StoreWriter.finalize` or :meth:`~StoreWriter.close` (or until the process ends): a second
driver on the same store is refused with the owner named.

Every inner chunk ends with its crc32c (Zarr's ``crc32c`` codec, after Blosc or on the raw bytes), so a chunk whose
bytes changed on disk fails when it is read instead of decoding into wrong numbers.

A shard is written whole from memory (all its rows of all arrays are passed at once) and Zarr
encodes each shard file in one piece, so the bytes of a shard depend only on its data: a run that
was killed and resumed produces the same files as one that never stopped.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from distillpipe.store.codec import CHUNK_KEY_ENCODING, Encoded, codec_pool, layout_codec
from distillpipe.store.lock import StoreLock
from distillpipe.store.manifest import MANIFEST_KEY, Manifest, StoreIncomplete
from distillpipe.store.quant import encode
from distillpipe.store.schema import ArraySpec, SignalSpec, array_layout, dense_scores, stored_layout
from distillpipe.store.shards import (
    PARTIAL_SUFFIX,
    marked_shards,
    marker_path,
    remove_partials,
    shard_key,
    tree_bytes,
    write_marker,
)

log = logging.getLogger(__name__)

SAVE_EVERY_S = 10.0
"""How often a build rewrites its manifest's ``completed_shards`` (markers are the record in between)."""

__all__ = ["CHUNK_KEY_ENCODING", "StoreSummary", "StoreWriter", "store_manifest", "write_shard"]


@dataclass(frozen=True)
class StoreSummary:
    """One-line summary of a finished store."""

    rows: int
    shards: int
    bytes_on_disk: int
    bytes_per_row: float
    rows_written: int
    """Rows written since this writer was opened (the rest were kept from an earlier run)."""
    seconds: float
    """Seconds since this writer was opened."""

    @property
    def rows_per_s(self) -> float:
        return self.rows_written / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        return (
            f"{self.rows:,} rows in {self.shards} shards, {self.bytes_on_disk / 2**20:,.1f} MiB on disk, "
            f"{self.bytes_per_row:,.0f} bytes/row; {self.rows_written:,} rows written in {self.seconds:,.1f} s "
            f"({self.rows_per_s:,.0f} rows/s)"
        )


class StoreWriter:
    """Driver-side handle on a store being built. Create it with :func:`create_or_resume`.

    Not thread-safe: call ``record``/``refresh``/``finalize`` from one thread (shard writes
    themselves may run anywhere, see :func:`write_shard`)."""

    def __init__(self, root: Path, manifest: Manifest, lock: StoreLock):
        self.root = root
        self.lock = lock
        self.layout = stored_layout(manifest.signals, manifest.n_rows, manifest.shard_rows)
        self._group = zarr.open_group(str(root), mode="r+")
        self._opened = time.perf_counter()
        self._kept = set(manifest.completed_shards)
        self._manifest = manifest  # as last saved
        self._done = set(manifest.completed_shards)  # as recorded (saved every SAVE_EVERY_S)
        self._saved_at, self._dirty = time.monotonic(), False

    @property
    def manifest(self) -> Manifest:
        """The manifest with every shard recorded so far (saved to the store at most every ``SAVE_EVERY_S``)."""
        if len(self._done) != len(self._manifest.completed_shards):
            self._manifest = self._manifest.with_completed(self._done)
        return self._manifest

    @property
    def path(self) -> Path:
        return self.root

    def pending_shards(self) -> list[int]:
        """Shards not yet recorded as complete, ascending."""
        return [i for i in range(self._manifest.n_shards) if i not in self._done]

    def write_shard(
        self,
        i: int,
        arrays: Mapping[str, np.ndarray],
        *,
        on_array_written: Callable[[str, int], None] | None = None,
    ) -> None:
        """Write shard ``i`` in this process (see :func:`write_shard`) and record it complete."""
        write_shard(self.root, i, arrays, on_array_written=on_array_written)
        self.record([i])

    def record(self, shards: list[int]) -> None:
        """Add ``shards`` (whose markers a writer has written) to the manifest's completed shards.

        O(1) per shard: the manifest (which lists every completed shard) is rewritten at most every
        ``SAVE_EVERY_S`` seconds and at :meth:`finalize`/:meth:`close`, not per shard (that was quadratic: 48 s of
        the driver's thread for 8,000 shards). Nothing is lost by the delay: the markers are what a resume and
        a reader trust (:func:`~distillpipe.store.shards.marked_shards`)."""
        n = self._manifest.n_shards
        for i in shards:
            if not 0 <= int(i) < n:
                raise IndexError(f"shard {i} out of range: the store has {n} shards")
            self._done.add(int(i))
        self._dirty = True
        if time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self._save(self.manifest)

    def refresh(self) -> list[int]:
        """Fold every marker on disk into the manifest (after remote writers finished shards);
        returns the shards newly recorded. Markers are trusted here: they are only written after
        their data, and they are checked against the files at the next resume."""
        found = marked_shards(self.root, self.manifest.n_shards)
        new = sorted(set(found) - self._done)
        if new:
            self.record(new)
        return new

    def drop_unmarked(self) -> list[int]:
        """Un-record completed shards whose marker is gone (a lost worker's late attempt at a shard removes
        its marker first and may die before writing its own); returns them, now pending again."""
        marked = set(marked_shards(self.root, self.manifest.n_shards))
        gone = sorted(self._done - marked)
        if gone:
            self._done -= set(gone)
            self._save(self.manifest)
        return gone

    def finalize(self) -> StoreSummary:
        """Check that every shard is complete (recorded and marked), remove leftovers of killed writes,
        write the final manifest, release the lock, log and return a summary."""
        self.refresh()
        self.drop_unmarked()
        remove_partials(self.root)
        if not self.manifest.complete:
            raise StoreIncomplete(str(self.root), len(self.manifest.completed_shards), self.manifest.n_shards)
        self._save(self.manifest)
        size = tree_bytes(self.root)
        summary = StoreSummary(
            rows=self.manifest.n_rows,
            shards=self.manifest.n_shards,
            bytes_on_disk=size,
            bytes_per_row=size / max(1, self.manifest.n_rows),
            rows_written=sum(b - a for i in range(self.manifest.n_shards) if i not in self._kept
                             for a, b in [self.manifest.shard_rows_range(i)]),
            seconds=time.perf_counter() - self._opened,
        )  # fmt: skip
        log.info("teacher cache %s complete: %s", self.root, summary)
        self.close()
        return summary

    def close(self) -> None:
        """Save the shards recorded so far and release the store's lock (finalize does; call it when a build
        stops early)."""
        try:
            if self._dirty:
                self._save(self.manifest)
        finally:
            self.lock.release()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _save(self, manifest: Manifest) -> None:
        self._group.attrs[MANIFEST_KEY] = manifest.to_dict()
        self._manifest, self._done = manifest, set(manifest.completed_shards)
        self._saved_at, self._dirty = time.monotonic(), False


def write_shard(
    store_path: str | Path,
    shard_index: int,
    arrays: Mapping[str, np.ndarray],
    *,
    on_array_written: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """Write every array of shard ``shard_index`` and then its completion marker; returns the marker.

    Self-contained (needs only the path), so it can run in any process, e.g. one dask task per
    shard. ``arrays`` maps each array name of the store's layout to that shard's rows
    ``[i * shard_rows, min(N, (i + 1) * shard_rows))``; floats are cast to the stored float dtype
    (float32 -> float16), integers to the stored integer dtype when every value fits (int32 ids ->
    uint16), anything else is refused, and so are nan and inf (``attn_scores``: -inf marks
    masked blocks). Signals of a compressed precision are then encoded here, in the writer's thread
    (:mod:`distillpipe.store.quant`), never in the thread that feeds the teacher. ``on_array_written(name,
    nbytes)`` is called after each stored array (progress bars).

    Safe against a kill at any point and against a second attempt at the same shard running at once
    (a lost dask worker that comes back): the shard's marker is removed first, each array's shard file
    is encoded in memory with the store's own metadata and published with ``os.replace`` (a reader sees
    the old file or the new one, never a mix), and the marker is written last, from the bytes
    published. Two attempts compute the same bytes (same code, inputs and compute settings, which the
    manifest pins), so whichever file lands last, the files and the marker agree. Holds the shard in
    memory twice at most (the input and its encoded files).
    """
    root = Path(store_path)
    group = zarr.open_group(str(root), mode="r")
    manifest = Manifest.from_dict(group.attrs[MANIFEST_KEY])
    layout = array_layout(manifest.signals, manifest.n_rows, manifest.shard_rows)
    start, stop = manifest.shard_rows_range(int(shard_index))
    data = _encoded(manifest.signals, _checked_arrays(layout, arrays, start, stop, manifest.signals.max_seq_len,
                                                      shard_index))
    marker_path(root, shard_index).unlink(missing_ok=True)  # a kill from here on leaves the shard pending
    files: dict[str, dict[str, Any] | None] = {}
    for spec in stored_layout(manifest.signals, manifest.n_rows, manifest.shard_rows):
        key = shard_key(spec, shard_index)
        encoded = _encode_shard(group[spec.name].metadata, spec, data[spec.name], start, stop, key)
        files[key] = _publish(root / key, encoded)
        if on_array_written is not None:
            on_array_written(spec.name, data[spec.name].nbytes)
    marker = {"shard": int(shard_index), "rows": [start, stop], "files": files}
    write_marker(root, marker)
    log.debug("shard %d (rows %d-%d) written", shard_index, start, stop)
    return marker


def _encoded(signals: SignalSpec, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stored arrays of a shard's checked float16 arrays: each compressed one replaced by its values and scales."""
    out = dict(data)
    for name, e in signals.encodings().items():
        out[e.values], out[e.scale] = encode(e.kind, out.pop(name))
    return out


def _encode_shard(metadata: Any, spec: ArraySpec, rows: np.ndarray, start: int, stop: int, key: str) -> Encoded | None:
    """The bytes Zarr stores for one shard of one array (None: every inner chunk is the fill value, so
    Zarr writes no file), encoded by :class:`~distillpipe.store.codec.ShardCodec` (Zarr's bytes, without
    Zarr's per-shard cost), after checking that the store's metadata are this code's layout."""
    expected, codec = layout_codec(spec)
    if expected != metadata.to_dict():  # never encode with codecs the store was not made with
        raise RuntimeError(f"{spec.name}: the store's array metadata differ from this code's layout")
    return codec.encode_parts(rows, start, spec.shape[0], None if codec.blosc is None else codec_pool())


def _publish(path: Path, data: Encoded | None) -> dict[str, Any] | None:
    """Put ``data`` at ``path`` atomically (temp file + ``os.replace``), or remove ``path`` for None;
    return the file's marker record ({size, crc32c: the file digest} or None).

    Written with ``O_DIRECT`` where the filesystem takes it (:func:`_write_file`): the bytes go from reused, aligned
    buffers to the device, so the kernel neither copies them into the page cache nor writes them back later (on this
    project's VMs, filling fresh page cache cost ~4 CPU-ms a MB, 10x the write itself: docs/at-scale.md), and a build
    of hundreds of GB does not push everything else out of memory. Elsewhere (tmpfs, some FUSE mounts, macOS) the
    same segments are written through the page cache."""
    if data is None:
        path.unlink(missing_ok=True)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
    try:
        _write_file(tmp, data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return {"size": data.nbytes, "crc32c": data.digest}


_ALIGN = 4096
"""O_DIRECT's alignment of buffer addresses, file offsets and lengths (the largest logical block size in use)."""
_SEGMENT = 8 * 2**20
"""Bytes per O_DIRECT write: the reused buffer of each writer thread."""
_DIRECT = threading.local()
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def _write_file(path: Path, data: Encoded) -> None:
    """Write ``data`` to the new file ``path`` in aligned segments copied into this thread's buffers (the last one
    padded to the alignment, the file then cut back to its size), with O_DIRECT unless the filesystem refuses it.
    Through ``open`` (a file object), as every writer of the project: a full disk raises the same ``OSError``
    (ENOSPC) wherever it is met."""
    if getattr(_DIRECT, "bufs", None) is None:
        # page-aligned and reused (their pages stay warm); two, so that one is filled while the other is written; each
        # twice a segment, as a group of frames may overflow one
        _DIRECT.bufs = [memoryview(mmap.mmap(-1, 2 * _SEGMENT)) for _ in range(2)]
        _DIRECT.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-direct-io")
    direct = bool(_O_DIRECT) and not getattr(_DIRECT, "refused", False)
    while True:
        try:
            with open(path, "wb", buffering=0, opener=_direct_opener if direct else None) as f:
                _Segments(f, _DIRECT.bufs, _DIRECT.io).write(data)
                os.ftruncate(f.fileno(), data.nbytes)
            return
        except OSError as e:
            if not direct or e.errno != errno.EINVAL:
                raise
            # this filesystem has no O_DIRECT, or wants another alignment: through the page cache from now on (for
            # this thread; a process writes one store, on one filesystem)
            _DIRECT.refused, direct = True, False


def _direct_opener(path: str, flags: int) -> int:
    return os.open(path, flags | _O_DIRECT, 0o644)


class _Segments:
    """Fills an aligned buffer with a file's bytes and writes it out ``_SEGMENT`` bytes at a time, on ``io``'s thread
    while the next segment is filled in the other buffer (so one writer keeps its core and the disk busy at once); the
    last piece is padded to the alignment (the caller cuts the file back). Raw frames are copied in groups with numpy,
    chunks and crc32c values side by side in one step per group: no Python per chunk."""

    def __init__(self, f: Any, bufs: list[memoryview], io: ThreadPoolExecutor):
        self.f, self.bufs, self.io = f, bufs, io
        self.cur, self.at = 0, 0
        self.pending: list[Future | None] = [None, None]
        self.view, self.array = bufs[0], np.frombuffer(bufs[0], dtype=np.uint8)

    def write(self, data: Encoded) -> None:
        try:
            if data.raw:
                cb = data.chunks.shape[1]
                step = cb + 4
                per = max(1, _SEGMENT // step)
                for k in range(0, len(data.order), per):
                    which = data.order[k:k + per]
                    frames = self.array[self.at:self.at + len(which) * step].reshape(len(which), step)
                    frames[:, :cb] = data.chunks[which]
                    frames[:, cb:] = data.crcs[k:k + per]
                    self.at += len(which) * step
                    self._flush()
            else:
                for blob, crc in zip(data.chunks, data.crcs):
                    self._put(memoryview(blob).cast("B"))
                    self._put(memoryview(crc))
            self._put(memoryview(data.tail))
        finally:
            for f in self.pending:  # every write done (or failed) before the buffers are reused or the fd closed
                if f is not None:
                    f.result()
        if self.at:
            _write_all(self.f, self.view[:-(-self.at // _ALIGN) * _ALIGN])

    def _put(self, piece: memoryview) -> None:
        while len(piece):
            n = min(len(piece), _SEGMENT - self.at)
            self.view[self.at:self.at + n] = piece[:n]
            piece, self.at = piece[n:], self.at + n
            self._flush()

    def _flush(self) -> None:
        if self.at < _SEGMENT:
            return
        other = 1 - self.cur
        if self.pending[other] is not None:
            self.pending[other].result()  # its previous segment is on disk: the buffer is free
        rest = self.at - _SEGMENT
        nxt = np.frombuffer(self.bufs[other], dtype=np.uint8)
        nxt[:rest] = self.array[_SEGMENT:self.at]
        self.pending[self.cur] = self.io.submit(_write_all, self.f, self.view[:_SEGMENT])  # one thread: in order
        self.cur, self.view, self.array, self.at = other, self.bufs[other], nxt, rest


def _write_all(f: Any, view: memoryview) -> None:
    done = 0
    while done < len(view):
        done += f.write(view[done:])


def store_manifest(store_path: str | Path) -> Manifest:
    """The manifest of the store at ``store_path`` as it is now, unchecked: for shard writers in other
    processes while the driver holds the lock (readers use :func:`distillpipe.store.reader.open_store`)."""
    return Manifest.from_dict(zarr.open_group(str(store_path), mode="r").attrs[MANIFEST_KEY])


def _checked_arrays(
    layout: list[ArraySpec], arrays: Mapping[str, np.ndarray], start: int, stop: int, max_len: int, i: int
) -> dict[str, np.ndarray]:
    names = [s.name for s in layout]
    missing, extra = sorted(set(names) - set(arrays)), sorted(set(arrays) - set(names))
    if missing or extra:
        raise ValueError(f"shard {i}: arrays missing {missing}, not in the store's layout {extra}")
    out = {}
    for spec in layout:
        a = np.asarray(arrays[spec.name])
        want = (stop - start, *spec.row_shape)
        if a.shape != want:
            raise ValueError(f"shard {i}: {spec.name} has shape {a.shape}, expected {want} (rows {start}-{stop})")
        if a.dtype != spec.dtype:
            a = _cast(a, spec.dtype, f"shard {i}: {spec.name}")
        if a.dtype.kind == "f":
            _refuse_nonfinite(a, spec.name, allow_neg_inf=dense_scores(spec.name), i=i)
        out[spec.name] = np.ascontiguousarray(a)
    length = out["length"]
    if length.size and (length.min() < 0 or length.max() > max_len):
        raise ValueError(f"shard {i}: length must lie in [0, {max_len}], got {length.min()}..{length.max()}")
    return out


_F16_POS_INF, _F16_NEG_INF = 0x7C00, 0xFC00


def _refuse_nonfinite(a: np.ndarray, name: str, *, allow_neg_inf: bool, i: int) -> None:
    """Refuse nan and inf (``attn_scores``: nan and +inf; -inf marks masked blocks): float16 overflow or a broken
    teacher must not reach the store. Checked here, in the writer's thread, so it costs the capture nothing.

    float16 is checked with two reductions over its bits, no temporary array (~10 GB/s a core, and numpy releases
    the GIL): as int16, +inf is 0x7C00 and positive nans above it, while finite values and every negative lie below
    it; as uint16, -inf is 0xFC00, negative nans above it, and all else below."""
    if a.dtype == np.float16:
        if not a.size:
            return
        pos_bad = int(a.view(np.int16).max()) >= _F16_POS_INF
        neg_bad = int(a.view(np.uint16).max()) >= _F16_NEG_INF + allow_neg_inf
        if not (pos_bad or neg_bad):
            return
        bits = a.view(np.uint16)
        bad = (bits & _F16_POS_INF) == _F16_POS_INF
        if allow_neg_inf:
            bad &= bits != _F16_NEG_INF
    else:
        bad = ~np.isfinite(a)
        if allow_neg_inf:
            bad &= ~np.isneginf(a)
    if bad.any():
        raise ValueError(f"shard {i}: {name} holds {int(bad.sum())} nan/inf values (float16 overflow or a broken "
                         "teacher); the shard was not written")


def _cast(a: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """Floats to the stored float dtype (float32 -> float16); integers to the stored integer dtype
    (int32 ids -> uint16) only when every value fits, so nothing wraps around silently."""
    if a.dtype.kind in "iu" and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise ValueError(f"{what} has values {a.min()}..{a.max()} that do not fit the stored {dtype}")
        return a.astype(dtype)
    if a.dtype.kind == "f" and dtype.kind == "f":
        return a.astype(dtype)
    raise TypeError(f"{what} has dtype {a.dtype}, the store holds {dtype}")
