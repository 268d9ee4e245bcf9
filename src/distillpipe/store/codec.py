"""Encoding and decoding one shard file of the store, directly with the codec libraries, in the Zarr v3 format.

Why not through Zarr: for a shard of MBs, Zarr 3's sharded write and read paths cost far more than their
codecs (measured on one core: ~0.3-0.5 GB/s through ``array[a:b] = x`` / ``array[a:b]`` against ~0.65 GB/s
to encode and ~12 GB/s to decode lz4, and ~3 GB/s for crc32c; ``benchmarks/at_scale.py``): the ceiling of
a teacher-cache build on a GPU box and of a student's block loader. The files are exactly Zarr's (the
sharding_indexed codec of the Zarr v3 specification, as this store's arrays declare it): inner chunks
along rows, each ``bytes`` (little-endian) -> ``blosc`` (the store's cname, clevel and shuffle; typesize the
item size) -> ``crc32c`` (4 bytes appended, little-endian); chunks that hold only the fill value are left
out (Zarr's ``write_empty_chunks=False``); then the index, (offset, nbytes) as little-endian uint64 per
inner chunk in row order (2**64-1 twice for a missing one), with its own crc32c, at the end. A shard
with no chunk at all is no file. ``tests/store/test_store_codec.py`` checks byte for byte that
:func:`encode_shard` writes what Zarr writes, and that Zarr reads back what :func:`decode_rows` reads, so
any Zarr reader reads these stores, and Zarr stays the reference.

Only the layout this store uses is handled (sharded along rows only, every other axis whole, C order,
the codecs of :func:`distillpipe.store.writer.compressors`); :func:`check_supported` refuses anything
else rather than write a file Zarr would read differently.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
from numcodecs import Blosc

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
MISSING = np.uint64(2**64 - 1)
"""Index entry of an inner chunk that is not stored."""
_SHUFFLE = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}


class ShardCodec:
    """The codec chain of one array of the store: rows per inner chunk, per shard, dtype, fill value, Blosc."""

    def __init__(self, metadata: Any):
        check_supported(metadata)
        meta = metadata.to_dict()
        self.dtype = np.dtype(metadata.dtype.to_native_dtype())
        sharding = meta["codecs"][0]["configuration"]
        self.shard_rows = int(meta["chunk_grid"]["configuration"]["chunk_shape"][0])
        self.chunk_rows = int(sharding["chunk_shape"][0])
        self.row_shape = tuple(int(s) for s in meta["shape"][1:])
        self.n_chunks = self.shard_rows // self.chunk_rows
        self.fill = np.asarray(metadata.fill_value, dtype=self.dtype)
        blosc = sharding["codecs"][1]["configuration"]
        self.blosc = Blosc(cname=blosc["cname"], clevel=int(blosc["clevel"]), shuffle=_SHUFFLE[blosc["shuffle"]],
                           blocksize=int(blosc["blocksize"]), typesize=self.dtype.itemsize)
        self.index_bytes = 16 * self.n_chunks + 4

    # -- encoding ----------------------------------------------------------------------------------------------

    def _encode_chunk(self, chunk: np.ndarray) -> bytes | None:
        """One inner chunk (chunk_rows rows, padded with the fill value), or None when it is all fill value."""
        if _all_fill(chunk, self.fill):
            return None
        data = self.blosc.encode(np.ascontiguousarray(chunk).view(np.uint8).reshape(-1))
        return data + _crc(data)

    def encode(self, rows: np.ndarray, first_row: int, n_rows: int, pool: Executor | None = None) -> bytes | None:
        """The shard file holding ``rows`` (this shard's rows of the array, dtype and row shape as stored), whose
        first row is row ``first_row`` of an array of ``n_rows``; None when Zarr would write no file."""
        n = len(rows)
        assert rows.shape[1:] == self.row_shape and rows.dtype == self.dtype, (rows.shape, rows.dtype)
        assert n == min(self.shard_rows, n_rows - first_row), (n, first_row, n_rows)
        chunks = []
        for c in range(self.n_chunks):
            a, b = c * self.chunk_rows, min(n, (c + 1) * self.chunk_rows)
            if a >= n:
                break  # beyond the array's last row: Zarr never writes it
            part = rows[a:b]
            if b - a < self.chunk_rows:  # the array's last rows: the chunk is padded with the fill value
                part = np.concatenate([part, np.broadcast_to(self.fill, (self.chunk_rows - (b - a), *self.row_shape))])
            chunks.append(part)
        encoded = list(pool.map(self._encode_chunk, chunks) if pool is not None else map(self._encode_chunk, chunks))
        index = np.full((self.n_chunks, 2), MISSING, dtype="<u8")
        offset, pieces = 0, []
        for c, data in enumerate(encoded):
            if data:
                index[c] = (offset, len(data))
                offset += len(data)
                pieces.append(data)
        if not pieces:
            return None
        raw = index.tobytes()
        return b"".join(pieces) + raw + _crc(raw)

    # -- decoding ----------------------------------------------------------------------------------------------

    def read_index(self, fd: int, size: int) -> np.ndarray:
        """The (n_chunks, 2) index of the open shard file ``fd`` of ``size`` bytes, checked."""
        if size < self.index_bytes:
            raise ValueError(f"shard file of {size} bytes is shorter than its index ({self.index_bytes} bytes)")
        raw = os.pread(fd, self.index_bytes, size - self.index_bytes)
        body, crc = raw[:-4], raw[-4:]
        if _crc(body) != crc:
            raise ValueError("shard index fails its crc32c")
        index = np.frombuffer(body, dtype="<u8").reshape(self.n_chunks, 2)
        stored = index[:, 0] != MISSING
        if (index[stored, 0] + index[stored, 1] > size - self.index_bytes).any():
            raise ValueError("shard index points past the end of the file (truncated?)")
        return index

    def decode_rows(self, path: Path, start: int, stop: int, out: np.ndarray,
                    pool: Executor | None = None) -> None:
        """Rows ``[start, stop)`` of this shard (positions within the shard) into ``out`` ((stop - start, ...)).
        A missing file or chunk reads as the fill value; a chunk whose crc32c fails raises ValueError."""
        first, last = start // self.chunk_rows, -(-stop // self.chunk_rows)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            out[...] = self.fill
            return
        try:
            index = self.read_index(fd, os.fstat(fd).st_size)[first:last]
            stored = index[:, 0] != MISSING
            if stored.any():  # one read covering every stored chunk needed
                lo = int(index[stored, 0].min())
                hi = int((index[stored, 0] + index[stored, 1]).max())
                blob = os.pread(fd, hi - lo, lo)
                if len(blob) != hi - lo:
                    raise ValueError("shard file ends inside a chunk (truncated?)")
        finally:
            os.close(fd)

        def one(c: int) -> None:
            a, b = max(start, (first + c) * self.chunk_rows), min(stop, (first + c + 1) * self.chunk_rows)
            dst = out[a - start:b - start]
            if not stored[c]:
                dst[...] = self.fill
                return
            off, nbytes = int(index[c, 0]) - lo, int(index[c, 1])
            data, crc = blob[off:off + nbytes - 4], blob[off + nbytes - 4:off + nbytes]
            if _crc(data) != crc:
                raise ValueError(f"inner chunk {first + c} fails its crc32c")
            chunk = np.frombuffer(self.blosc.decode(data), dtype=self.dtype)
            chunk = chunk.reshape(self.chunk_rows, *self.row_shape)
            dst[...] = chunk[a - (first + c) * self.chunk_rows:b - (first + c) * self.chunk_rows]

        _run(one, range(last - first), pool)


def codec_threads() -> int:
    """Threads of :func:`codec_pool`: this process's cores."""
    return len(os.sched_getaffinity(0))


def codec_pool() -> ThreadPoolExecutor:
    """This process's threads for encoding and decoding inner chunks (Blosc and crc32c release the GIL), one per
    core: a shard's chunks are (de)compressed in parallel, so one writer or one loader uses every core."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=codec_threads(), thread_name_prefix="store-codec")
        return _POOL


def _run(fn: Callable[[int], None], items: Iterable[int], pool: Executor | None) -> None:
    if pool is None:
        for i in items:
            fn(i)
    else:
        for _ in pool.map(fn, items):  # re-raises a chunk's error here
            pass


def _crc(data: bytes) -> bytes:
    return int(google_crc32c.value(data)).to_bytes(4, "little")


def _all_fill(chunk: np.ndarray, fill: np.ndarray) -> bool:
    if fill.dtype.kind == "f" and np.isnan(fill):
        return bool(np.isnan(chunk).all())
    return bool((chunk == fill).all())


def check_supported(metadata: Any) -> None:
    """Refuse array metadata this module does not encode exactly as Zarr does (see the module docstring)."""
    meta = metadata.to_dict()
    codecs = meta.get("codecs", [])
    ok = (len(codecs) == 1 and codecs[0]["name"] == "sharding_indexed"
          and meta["chunk_grid"]["name"] == "regular" and meta.get("chunk_key_encoding", {}).get("name") == "default")
    if ok:
        cfg = codecs[0]["configuration"]
        inner = [c["name"] for c in cfg["codecs"]]
        index = [c["name"] for c in cfg["index_codecs"]]
        shard_shape, chunk_shape = meta["chunk_grid"]["configuration"]["chunk_shape"], cfg["chunk_shape"]
        ok = (inner == ["bytes", "blosc", "crc32c"] and index == ["bytes", "crc32c"]
              and cfg.get("index_location", "end") == "end"
              and all(c.get("configuration", {}).get("endian", "little") == "little"  # none for 1-byte types
                      for c in cfg["codecs"] + cfg["index_codecs"] if c["name"] == "bytes")
              and list(shard_shape[1:]) == list(meta["shape"][1:]) == list(chunk_shape[1:])
              and shard_shape[0] % chunk_shape[0] == 0)
    if not ok:
        raise ValueError(f"array layout not supported by distillpipe.store.codec: {meta.get('codecs')}")
