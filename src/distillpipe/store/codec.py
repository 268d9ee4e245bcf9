"""Encoding and decoding one shard file of the store, directly with the codec libraries, in the Zarr v3 format.

Why not through Zarr: for a shard of MBs, Zarr 3's sharded write and read paths cost far more than their
codecs (measured on one core: ~0.3-0.5 GB/s through ``array[a:b] = x`` / ``array[a:b]`` against ~14 GB/s for
crc32c; ``benchmarks/at_scale.py``): the ceiling of a teacher-cache build on a GPU box and of a student's block
loader. The files are exactly Zarr's (the sharding_indexed codec of the Zarr v3 specification, as this store's
arrays declare it): inner chunks, each ``bytes`` (little-endian) -> [``blosc`` (cname, clevel and shuffle of the
array's codec chain, :data:`distillpipe.store.schema.CODECS`; typesize the item size)] -> ``crc32c`` (4 bytes
appended, little-endian); chunks that hold only the fill value are left out (Zarr's ``write_empty_chunks=False``);
the chunks lie in the file in Zarr's (compressed) Morton order of the shard's chunk grid (rows, blocks of axis 1:
for row-aligned reads of 2^k rows a contiguous range of the file); then the index, (offset, nbytes) as
little-endian uint64 per inner chunk in C order of the chunk grid (2**64-1 twice for a missing one), with its own
crc32c, at the end. A shard with no chunk at all is no file.
``tests/store/test_store_codec.py`` checks byte for byte that :meth:`ShardCodec.encode` writes what Zarr writes, and
that Zarr reads back what :meth:`ShardCodec.decode_rows` reads, so any Zarr reader reads these stores, and Zarr stays
the reference.

Only the layouts this store uses are handled: sharded along rows only; inner chunks of whole rows (``lz4+shuffle``)
or of one row and a block of positions (``raw``), every later axis whole; C order. Either way every inner chunk is
one contiguous run of a shard's C-order rows, so a shard's chunks are a ``(chunks, chunk bytes)`` view of its rows:
a raw shard file's frames are gathered from that view in one numpy step per write segment (the writer's
``_Segments``), and read back with one read, one crc32c pass (:func:`frames_check`) and one gather.
:func:`check_supported` refuses anything else rather than write a file Zarr would read differently.

The **file digest** (:attr:`Encoded.digest`, recorded in the shard's completion marker) is the crc32c of the
inner chunks' crc32c values (4 bytes each, in file order) followed by the index and its crc32c: it changes with
any chunk's bytes (through its crc32c) and with the layout, costs nothing when writing (the crc32c values are
computed anyway), and :meth:`ShardCodec.file_digest` checks a file against it by reading it once, checking every
chunk's crc32c on the way (~14 GB/s a core; sha256 ran at ~1.5).
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import zarr
from numcodecs import Blosc
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.storage import MemoryStore

from distillpipe.store.schema import CODECS, ArraySpec

CHUNK_KEY_ENCODING = {"name": "default", "separator": "/"}

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_BUFFERS = threading.local()
MISSING = np.uint64(2**64 - 1)
"""Index entry of an inner chunk that is not stored."""
_SHUFFLE = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class Encoded:
    """One encoded shard file: its frames (each inner chunk stored, then its crc32c, in file order) and its tail (the
    index and its crc32c); raw frames are views of the caller's rows (keep them alive until written)."""

    chunks: Any
    """Raw: the ``(chunks, chunk_bytes)`` uint8 view of the rows, indexed by ``order``; compressed: the list of the
    compressed chunks, in file order."""
    order: np.ndarray | None
    """Raw: the stored chunks' indices in file order; None when compressed."""
    crcs: np.ndarray
    """(stored chunks, 4) uint8: each stored chunk's crc32c, little-endian, in file order."""
    tail: bytes
    nbytes: int
    digest: str

    @property
    def raw(self) -> bool:
        return self.order is not None

    def pieces(self) -> list[Any]:
        """The file as a list of buffers, in order (for :meth:`to_bytes`)."""
        data = (self.chunks[k] for k in self.order) if self.raw else self.chunks
        out: list[Any] = []
        for d, c in zip(data, self.crcs):
            out += (d, c)
        out.append(self.tail)
        return out

    def to_bytes(self) -> bytes:
        return b"".join(bytes(p) for p in self.pieces())


class ShardCodec:
    """The codec chain of one array of the store: chunk shape, rows per shard, dtype, fill value, Blosc or none."""

    def __init__(self, metadata: Any):
        check_supported(metadata)
        meta = metadata.to_dict()
        self.dtype = np.dtype(metadata.dtype.to_native_dtype())
        sharding = meta["codecs"][0]["configuration"]
        self.shard_rows = int(meta["chunk_grid"]["configuration"]["chunk_shape"][0])
        self.chunk_shape = tuple(int(s) for s in sharding["chunk_shape"])
        self.chunk_rows = self.chunk_shape[0]
        self.row_shape = tuple(int(s) for s in meta["shape"][1:])
        self.per_row = self.row_shape[0] // self.chunk_shape[1] if len(self.row_shape) else 1
        """Inner chunks along axis 1 (1 for chunks of whole rows)."""
        self.n_chunks = self.shard_rows // self.chunk_rows * self.per_row
        self.chunk_items = math.prod(self.chunk_shape)
        self.chunk_bytes = self.chunk_items * self.dtype.itemsize
        self.fill = np.asarray(metadata.fill_value, dtype=self.dtype)
        inner = [c for c in sharding["codecs"] if c["name"] == "blosc"]
        self.blosc = None
        if inner:
            b = inner[0]["configuration"]
            self.blosc = Blosc(cname=b["cname"], clevel=int(b["clevel"]), shuffle=_SHUFFLE[b["shuffle"]],
                               blocksize=int(b["blocksize"]), typesize=self.dtype.itemsize)
        self.index_bytes = 16 * self.n_chunks + 4
        self._fill_test = _fill_test(self.fill)
        self.file_order = morton_order((self.shard_rows // self.chunk_rows, self.per_row))
        """The C-order indices of the inner chunks in the order Zarr lays them out in a shard file."""

    # -- encoding ----------------------------------------------------------------------------------------------

    def chunks_of(self, rows: np.ndarray) -> np.ndarray:
        """The ``(chunks, chunk_bytes)`` uint8 view of C-contiguous shard ``rows`` (whole row chunks only)."""
        return rows.reshape(-1).view(np.uint8).reshape(-1, self.chunk_bytes)

    def encode_parts(self, rows: np.ndarray, first_row: int, n_rows: int,
                     pool: Executor | None = None) -> Encoded | None:
        """The shard file holding ``rows`` (this shard's rows of the array, dtype and row shape as stored, C order),
        whose first row is row ``first_row`` of an array of ``n_rows``; None when Zarr would write no file."""
        n = len(rows)
        assert rows.shape[1:] == self.row_shape and rows.dtype == self.dtype, (rows.shape, rows.dtype)
        assert n == min(self.shard_rows, n_rows - first_row), (n, first_row, n_rows)
        rows = np.ascontiguousarray(rows)
        if n % self.chunk_rows:  # the array's last rows: the last chunk is padded with the fill value
            pad = np.broadcast_to(self.fill, (self.chunk_rows - n % self.chunk_rows, *self.row_shape))
            rows = np.concatenate([rows, pad])
        chunks = self.chunks_of(rows)
        keep = ~self._fill_test(chunks.view(_UINT[self.dtype.itemsize]).reshape(len(chunks), -1))
        order = self.file_order[self.file_order < len(chunks)]
        kept = order[keep[order]]  # in file order
        if not len(kept):
            return None
        if self.blosc is None:
            data = [chunks[k] for k in kept]
        else:  # in as many groups as threads: a task per chunk cost more than lz4 itself (~30 us vs ~6 us a chunk)
            groups = np.array_split(kept, min(len(kept), codec_threads() if pool is not None else 1))
            data = [d for group in (pool.map(self._compress_all, [(chunks, g) for g in groups]) if pool is not None
                                    else map(self._compress_all, [(chunks, g) for g in groups])) for d in group]
        crcs = np.fromiter((crc32c.crc32c(d) for d in data), dtype="<u4", count=len(data))
        sizes = np.fromiter((len(d) + 4 for d in data), dtype="<u8", count=len(data)) if self.blosc is not None \
            else np.full(len(data), self.chunk_bytes + 4, dtype="<u8")
        index = np.full((self.n_chunks, 2), MISSING, dtype="<u8")
        index[kept, 0] = np.cumsum(sizes) - sizes
        index[kept, 1] = sizes
        tail = _with_crc(index.tobytes())
        return Encoded(chunks if self.blosc is None else data, kept if self.blosc is None else None,
                       crcs.view(np.uint8).reshape(-1, 4), tail, int(sizes.sum()) + len(tail),
                       _digest(crcs.tobytes(), tail))

    def encode(self, rows: np.ndarray, first_row: int, n_rows: int, pool: Executor | None = None) -> bytes | None:
        """:meth:`encode_parts` as one ``bytes`` (tests, small arrays)."""
        enc = self.encode_parts(rows, first_row, n_rows, pool)
        return None if enc is None else enc.to_bytes()

    def _compress_all(self, job: tuple[np.ndarray, np.ndarray]) -> list[bytes]:
        chunks, which = job
        return [self.blosc.encode(chunks[k]) for k in which]

    # -- decoding ----------------------------------------------------------------------------------------------

    def read_index(self, fd: int, size: int) -> np.ndarray:
        """The (n_chunks, 2) index of the open shard file ``fd`` of ``size`` bytes, checked."""
        if size < self.index_bytes:
            raise ValueError(f"shard file of {size} bytes is shorter than its index ({self.index_bytes} bytes)")
        return self._parse_index(os.pread(fd, self.index_bytes, size - self.index_bytes), size)

    def _parse_index(self, raw: bytes, size: int) -> np.ndarray:
        body, crc = raw[:-4], raw[-4:]
        if _crc(body) != crc:
            raise ValueError("shard index fails its crc32c")
        index = np.frombuffer(body, dtype="<u8").reshape(self.n_chunks, 2)
        stored = index[:, 0] != MISSING
        if (index[stored, 0] + index[stored, 1] > size - self.index_bytes).any():
            raise ValueError("shard index points past the end of the file (truncated?)")
        if (index[stored, 1] < 4).any():
            raise ValueError("shard index holds a chunk shorter than its crc32c")
        return index

    def decode_rows(self, path: Path, start: int, stop: int, out: np.ndarray,
                    pool: Executor | None = None) -> None:
        """Rows ``[start, stop)`` of this shard (positions within the shard) into ``out`` ((stop - start, ...)).
        A missing file or chunk reads as the fill value; a chunk whose crc32c fails raises ValueError.

        Raw chunks of whole rows are read straight into ``out`` (``os.preadv``: each chunk's bytes into its place,
        its crc32c beside), then checked: no buffer, no copy. Compressed ones are read in one piece and decoded on
        ``pool``'s threads."""
        r0, r1 = start // self.chunk_rows, -(-stop // self.chunk_rows)  # row chunks touched
        first, last = r0 * self.per_row, r1 * self.per_row  # inner chunks touched
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            out[...] = self.fill
            return
        try:
            index = self.read_index(fd, os.fstat(fd).st_size)[first:last]
            stored = index[:, 0] != MISSING
            if not stored.any():
                out[...] = self.fill
                return
            aligned = self.chunk_rows == 1 or (start % self.chunk_rows == 0 and stop % self.chunk_rows == 0)
            if self.blosc is None and aligned and out.flags.c_contiguous:
                self._read_raw(fd, index, stored, self.chunks_of(out), first)
                return
            lo = int(index[stored, 0].min())  # one read covering every stored chunk needed
            hi = int((index[stored, 0] + index[stored, 1]).max())
            blob = np.empty(hi - lo, dtype=np.uint8)
            if os.preadv(fd, [blob], lo) != hi - lo:
                raise ValueError("shard file ends inside a chunk (truncated?)")
        finally:
            os.close(fd)
        offsets, sizes = index[:, 0].astype(np.int64) - lo, index[:, 1].astype(np.int64)  # in the blob

        def one(c: int) -> None:
            rc = (first + c) // self.per_row  # its row chunk
            a, b = max(start, rc * self.chunk_rows), min(stop, (rc + 1) * self.chunk_rows)
            block = (first + c) % self.per_row
            dst = out[a - start:b - start]
            if dst.ndim > 1 and self.per_row > 1:
                dst = dst[:, block * self.chunk_shape[1]:(block + 1) * self.chunk_shape[1]]
            if not stored[c]:
                dst[...] = self.fill
                return
            data = blob[offsets[c]:offsets[c] + sizes[c] - 4]
            if crc32c.crc32c(data) != int(blob[offsets[c] + sizes[c] - 4:offsets[c] + sizes[c]].view("<u4")[0]):
                raise ValueError(f"inner chunk {first + c} fails its crc32c")
            whole = b - a == self.chunk_rows and self.per_row == 1 and dst.flags.c_contiguous
            if self.blosc is not None and whole:  # straight into the caller's rows
                self.blosc.decode(data, out=dst.reshape(-1).view(np.uint8))
                return
            raw = data if self.blosc is None else self.blosc.decode(data)
            chunk = np.frombuffer(raw, dtype=self.dtype).reshape(self.chunk_shape)
            dst[...] = chunk[a - rc * self.chunk_rows:b - rc * self.chunk_rows]

        if pool is None or last - first < 2:
            for c in range(last - first):
                one(c)
            return
        groups = np.array_split(np.arange(last - first), min(last - first, codec_threads()))
        for _ in pool.map(lambda g: [one(c) for c in g], groups):  # re-raises a chunk's error here
            pass

    def _read_raw(self, fd: int, index: np.ndarray, stored: np.ndarray, out: np.ndarray, first: int) -> None:
        """Raw chunks into ``out`` ((chunks, chunk_bytes) view of the caller's rows): the span of the file holding
        them (a raw shard file is a sequence of equal frames, chunk + crc32c; for row-aligned reads the frames needed
        lie together, in Morton order) is read in one call, checked in one crc32c pass (:func:`frames_check`: no
        Python per chunk), then gathered into place in one numpy copy; missing chunks get the fill value."""
        step = self.chunk_bytes + 4
        where = np.flatnonzero(stored)
        offsets = index[where, 0].astype(np.int64)
        lo, hi = int(offsets.min()), int(offsets.max()) + step
        if (index[where, 1] != step).any() or ((offsets - lo) % step).any():
            raise ValueError(f"a raw shard file whose chunks are not frames of {self.chunk_bytes} bytes + crc32c")
        blob = _read_buffer(hi - lo)
        if os.preadv(fd, [blob], lo) != hi - lo:
            raise ValueError("shard file ends inside a chunk (truncated?)")
        frames = blob.reshape(-1, step)  # every frame of the span: those of other rows are checked too
        if crc32c.crc32c(blob) != frames_check(len(frames), step):
            crcs = np.ascontiguousarray(frames[:, -4:]).view("<u4").reshape(-1)
            slot_of = dict(zip((offsets - lo) // step, where))
            for slot in range(len(frames)):  # find the chunk that fails, to name it
                if crc32c.crc32c(frames[slot, :-4]) != crcs[slot]:
                    raise ValueError(f"inner chunk {first + slot_of.get(slot, -1 - first)} fails its crc32c"
                                     if slot in slot_of else "an inner chunk beside the ones read fails its crc32c")
            raise ValueError("the inner chunks fail their crc32c together")
        slots = (offsets - lo) // step
        if len(where) == len(out) and (slots == np.arange(len(slots))).all():
            out[...] = frames[:, :-4]  # every chunk, in C order: one strided copy
        else:
            out[where] = frames[slots, :-4]
            missing = np.flatnonzero(~stored)
            if len(missing):
                out[missing] = np.frombuffer(np.full(self.chunk_items, self.fill).tobytes(), dtype=np.uint8)

    def file_digest(self, path: Path) -> str:
        """Read the shard file at ``path`` once, check its index and every chunk's crc32c, and return its digest
        (see the module docstring). Raises ValueError naming what is wrong."""
        with open(path, "rb") as f:
            raw = f.read()
        size = len(raw)
        if size < self.index_bytes:
            raise ValueError(f"shard file of {size} bytes is shorter than its index ({self.index_bytes} bytes)")
        tail = raw[size - self.index_bytes:]
        index = self._parse_index(tail, size)
        order = np.argsort(index[:, 0], kind="stable")
        order = order[index[order, 0] != MISSING]
        crcs = bytearray()
        view = memoryview(raw)
        for k in order:
            o, s = int(index[k, 0]), int(index[k, 1])
            if crc32c.crc32c(view[o:o + s - 4]) != int.from_bytes(view[o + s - 4:o + s], "little"):
                raise ValueError(f"inner chunk {k} fails its crc32c")
            crcs += view[o + s - 4:o + s]
        return _digest(bytes(crcs), tail)


def compressors(spec: ArraySpec) -> tuple[Any, ...]:
    """Zarr's bytes-to-bytes codecs of ``spec``'s chain (:data:`~distillpipe.store.schema.CODECS`): Blosc or nothing,
    then a crc32c of the stored bytes (checked whenever the chunk is read)."""
    blosc = CODECS[spec.codec]
    if blosc is None:
        return (Crc32cCodec(),)
    cname, clevel, shuffle = blosc
    return (BloscCodec(cname=cname, clevel=clevel, shuffle=shuffle), Crc32cCodec())


def create_array(store: Any, spec: ArraySpec) -> Any:
    """The Zarr array of ``spec`` in ``store`` (a group or a store): the one place that turns the layout into Zarr
    metadata."""
    kwargs = dict(shape=spec.shape, chunks=spec.chunks, shards=spec.shards, dtype=spec.dtype,
                  compressors=compressors(spec), fill_value=spec.fill_value, chunk_key_encoding=CHUNK_KEY_ENCODING,
                  dimension_names=spec.dimension_names)
    if isinstance(store, zarr.Group):
        return store.create_array(spec.name, **kwargs)
    return zarr.create_array(store, name=spec.name, **kwargs)


@functools.lru_cache(maxsize=512)
def layout_codec(spec: ArraySpec) -> tuple[dict, ShardCodec]:
    """The Zarr metadata this code gives ``spec`` and its codec, once per process (Zarr builds them in ms: per array
    per shard, that was the writer's largest cost for small rows)."""
    array = create_array(MemoryStore({}), spec)  # metadata only: nothing is written
    return array.metadata.to_dict(), ShardCodec(array.metadata)


@functools.lru_cache(maxsize=64)
def morton_order(grid: tuple[int, ...]) -> np.ndarray:
    """The C-order indices of a chunk grid's chunks sorted by their compressed Morton code, the order in which Zarr
    writes a shard's inner chunks: bits are interleaved from the lowest up, each axis dropping out once its own bits
    (``(size - 1).bit_length()``) are used up."""
    axes = [np.arange(n, dtype=np.int64) for n in grid]
    coords = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(grid))
    bits = [(n - 1).bit_length() for n in grid]
    code, out_bit = np.zeros(len(coords), dtype=np.int64), 0
    for bit in range(max(bits, default=0)):
        for axis, b in enumerate(bits):
            if bit < b:
                code |= ((coords[:, axis] >> bit) & 1) << out_bit
                out_bit += 1
    order = np.argsort(code, kind="stable")
    order.flags.writeable = False
    return order


_CHECKS: dict[int, list[int]] = {}
_CHECKS_LOCK = threading.Lock()


def frames_check(n: int, step: int) -> int:
    """The crc32c of any ``n`` consecutive frames of ``step`` bytes whose last 4 bytes are the crc32c (little-endian)
    of the rest. The crc32c of such a frame is the same for every frame (CRC-32C's residue), and the crc32c of a
    concatenation is a function of its parts' crc32c values and lengths; so this one number checks every frame of a
    span in one pass over its bytes (a damaged frame changes it; two damaged frames cancel with odds of 2^-32),
    computed once from frames of zeros."""
    with _CHECKS_LOCK:
        done = _CHECKS.setdefault(step, [0])  # done[k]: the crc32c of k frames (0 for none)
        if len(done) <= n:
            zeros = bytes(step - 4)
            frame = zeros + crc32c.crc32c(zeros).to_bytes(4, "little")
            while len(done) <= n:
                done.append(crc32c.crc32c(frame, done[-1]))
        return done[n]


def _read_buffer(n: int) -> np.ndarray:
    """A buffer of ``n`` bytes: this thread's reused one up to 64 MiB (fresh pages cost page faults each read), else
    a new one."""
    if n > 64 * 2**20:
        return np.empty(n, dtype=np.uint8)
    buf = getattr(_BUFFERS, "buf", None)
    if buf is None or len(buf) < n:
        buf = _BUFFERS.buf = np.empty(max(n, 2**20), dtype=np.uint8)
    return buf[:n]


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


def _crc(data: Any) -> bytes:
    return crc32c.crc32c(data).to_bytes(4, "little")


def _with_crc(data: bytes) -> bytes:
    return data + _crc(data)


def _digest(chunk_crcs: bytes, tail: bytes) -> str:
    return f"{crc32c.crc32c(tail, crc32c.crc32c(chunk_crcs)):08x}"


def _fill_test(fill: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A function of a ``(chunks, items)`` unsigned-integer view of chunks -> bool per chunk: all fill value, bit for
    bit (as Zarr compares: -0.0 is not a fill value of 0.0). Vectorized, and cheap: only chunks whose first item is
    the fill value (padding, mostly) are compared whole."""
    if fill.dtype.kind == "f" and np.isnan(fill):
        raise ValueError("a NaN fill value is not supported by distillpipe.store.codec")
    bits = int(np.frombuffer(fill.tobytes(), dtype=_UINT[fill.dtype.itemsize])[0])

    def test(chunks: np.ndarray) -> np.ndarray:
        out = chunks[:, 0] == bits
        candidates = np.flatnonzero(out)
        if len(candidates):  # compared whole, all at once
            out[candidates] = ~(chunks[candidates] != bits).any(axis=1)
        return out

    return test


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
        shape, shard_shape, chunk_shape = meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"], \
            cfg["chunk_shape"]
        whole_rows = list(chunk_shape[1:]) == list(shape[1:])
        one_row = (chunk_shape[0] == 1 and len(shape) >= 2 and list(chunk_shape[2:]) == list(shape[2:])
                   and shape[1] % chunk_shape[1] == 0)
        ok = (inner in (["bytes", "blosc", "crc32c"], ["bytes", "crc32c"]) and index == ["bytes", "crc32c"]
              and cfg.get("index_location", "end") == "end"
              and all(c.get("configuration", {}).get("endian", "little") == "little"  # none for 1-byte types
                      for c in cfg["codecs"] + cfg["index_codecs"] if c["name"] == "bytes")
              and list(shard_shape[1:]) == list(shape[1:]) and (whole_rows or one_row)
              and shard_shape[0] % chunk_shape[0] == 0)
    if not ok:
        raise ValueError(f"array layout not supported by distillpipe.store.codec: {meta.get('codecs')}")
