"""What ``benchmarks/at_scale.py`` measures on this machine: per-step CPU time of the build, writer scaling, the
writers alone against the disk, the in-process build, the disk's bandwidth and the block loader."""

from __future__ import annotations

import mmap
import os
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from _scale_sets import ARGS, BATCH, SignalSet, make_teacher, new_store, set_constants

import distillpipe.store.writer as writer_mod
import distillpipe.teacher.shard as shard_mod
from distillpipe.store import reader as reader_mod
from distillpipe.store.loader import BlockLoader
from distillpipe.store.reader import open_store
from distillpipe.teacher.cache import run_shards


@dataclass
class Steps:
    cpu: dict = field(default_factory=lambda: defaultdict(float))
    wall: dict = field(default_factory=lambda: defaultdict(float))
    active: bool = False

    @contextmanager
    def step(self, name: str):
        if not self.active:
            yield
            return
        c, w = time.process_time(), time.perf_counter()
        try:
            yield
        finally:
            self.cpu[name] += time.process_time() - c
            self.wall[name] += time.perf_counter() - w


STEPS = Steps()
STEP_NAMES = {
    "capture": "capture + pooling (device work)",
    "to_host": "host copy + nan/inf checks",
    "assemble": "shard assembly (row order, padding)",
    "checks": "writer: shape/range checks, casts",
    "quantize": "writer: int8 codes and scales",
    "encode": "writer: encode (frames, lz4, crc32c)",
    "publish": "writer: O_DIRECT segments + rename",
    "marker": "writer: marker (fsync)",
}
MAIN_THREAD = ("to_host", "assemble")
WRITER = ("checks", "quantize", "encode", "publish", "marker")


def _timed(module, name: str, step: str) -> None:
    orig = getattr(module, name)

    def wrapper(*a, **k):
        with STEPS.step(step):
            return orig(*a, **k)

    setattr(module, name, wrapper)


_timed(shard_mod, "capture_batch", "capture")
_timed(shard_mod, "to_host", "to_host")
_timed(writer_mod, "_checked_arrays", "checks")
_timed(writer_mod, "_encoded", "quantize")
_timed(writer_mod, "_encode_shard", "encode")
_timed(writer_mod, "_publish", "publish")
_timed(writer_mod, "write_marker", "marker")

def measure_steps(sset: SignalSet, rows, shard_rows: int, tmp: Path, variant: str) -> dict:
    """Each step's CPU seconds per 1,000 rows, steps one at a time (compute a shard, then write it); and the
    subspace fit's (compact variant) CPU seconds per 1,000 fit rows."""
    spec = sset.spec(variant)
    model = make_teacher(sset, ARGS.teacher, ARGS.device)
    n = len(rows)
    store = tmp / f"{sset.name}-{variant}-steps.zarr"
    c = time.process_time()
    consts, constants = set_constants(sset, variant, model, rows)
    fit_s = time.process_time() - c
    fit_rows = min(spec.hidden_fit_rows, n) if spec.hidden_rank else 0
    with new_store(store, spec, n, shard_rows, sset.name, consts) as w:
        shard_mod.compute_shard(model, rows, 0, min(BATCH, n), spec, BATCH, 0, constants)  # warm-up, untimed
        STEPS.cpu.clear(), STEPS.wall.clear()
        STEPS.active = True
        captured = 0
        try:
            for i in w.pending_shards():
                start, stop = w.manifest.shard_rows_range(i)
                before = STEPS.cpu["capture"] + STEPS.cpu["to_host"]
                c = time.process_time()
                arrays = shard_mod.compute_shard(model, rows, start, stop, spec, BATCH, 0, constants)
                inner = STEPS.cpu["capture"] + STEPS.cpu["to_host"] - before
                STEPS.cpu["assemble"] += time.process_time() - c - inner  # what compute_shard does around them
                captured += sum(a.nbytes for a in arrays.values())
                w.record([writer_mod.write_shard(store, i, arrays)["shard"]])
        finally:
            STEPS.active = False
        summary = w.finalize()
    per_k = {k: 1000 * STEPS.cpu[k] / n for k in STEP_NAMES}
    writer_wall = sum(STEPS.wall[k] for k in WRITER)
    const_bytes = sum(p.stat().st_size for p in (store / "constants").rglob("*") if p.is_file()) \
        if (store / "constants").is_dir() else 0
    return {"cpu_s_per_1k": per_k, "writer_parallelism": sum(STEPS.cpu[k] for k in WRITER) / writer_wall,
            "captured_bytes_per_row": captured / n, "constants_bytes": const_bytes,
            "fit_cpu_s_per_1k_rows": 1000 * fit_s / fit_rows if fit_rows else 0.0,
            "stored_bytes_per_row": (summary.bytes_on_disk - const_bytes) / n, "store": str(store)}


def computed_shards(sset: SignalSet, rows, shard_rows: int, variant: str) -> tuple[list[dict], tuple]:
    """4 shards of the set's rows computed once (at most ``shard_rows`` rows each, the 4 filling the set's rows when
    they fill only one), and the constants they were computed with: what the writer measurements below write, again
    and again."""
    spec = sset.spec(variant)
    model = make_teacher(sset, ARGS.teacher, ARGS.device)
    consts, constants = set_constants(sset, variant, model, rows)
    shard_rows = max(1, min(shard_rows, len(rows) // 4))
    return [shard_mod.compute_shard(model, rows, s, s + shard_rows, spec, BATCH, 0, constants)
            for s in range(0, 4 * shard_rows, shard_rows)], consts


def writer_scaling(sset: SignalSet, shards: list[dict], tmp: Path, variant: str) -> tuple[float, float]:
    """Writers as threads, each on one core: the shards written by 1 and by 2 writer threads whose chunks are encoded
    in their own thread (no codec pool), best of 2. Returns (one writer's wall seconds per row, 2 writers' speed-up).

    Taking the codec pool out is what makes this a measure of how writer threads scale (the GIL-held part of a
    write is what stops them): with the pool, one writer already spreads its chunks over this machine's 2 cores and
    2 writers can only compete for them, which says nothing about 14 writers on 16 cores. The stores go to memory
    (/dev/shm, where there is one) so that the disk, measured on its own by ``writers_vs_disk``, does not decide."""
    spec = sset.spec(variant)
    ram = Path("/dev/shm")
    if ram.is_dir() and os.access(ram, os.W_OK):
        tmp = Path(tempfile.mkdtemp(dir=ram))
    shard_rows = len(shards[0]["row_index"])
    n = len(shards) * shard_rows
    times = {}
    real_pool = writer_mod.codec_pool
    writer_mod.codec_pool = lambda: None  # each writer encodes its chunks in its own thread
    try:
        for threads in (1, 2, 1, 2):
            store = tmp / f"{sset.name}-scaling-{threads}.zarr"
            with new_store(store, spec, n, shard_rows, sset.name) as w:
                t = time.perf_counter()
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(lambda i: writer_mod.write_shard(store, i, shards[i]), range(len(shards))))
                times.setdefault(threads, []).append(time.perf_counter() - t)
                w.close()
            _rm(store)
    finally:
        writer_mod.codec_pool = real_pool
        if tmp.parent == ram:
            _rm(tmp)
    return min(times[1]) / n, min(times[1]) / min(times[2])


def writers_vs_disk(sset: SignalSet, shards: list[dict], tmp: Path, variant: str, consts: tuple) -> dict:
    """The writers alone (capture left out, as on a GPU box, where the device computes the next shard meanwhile),
    as many as this machine's cores, writing the shards to a store, then ``sync``: rows/s and bytes/s on disk (to
    compare with the disk's fsync'd sequential write), CPU per row, bytes per row. Keeps the store (the loader reads
    it)."""
    spec = sset.spec(variant)
    shard_rows = len(shards[0]["row_index"])
    n = len(shards) * shard_rows
    store = tmp / f"{sset.name}-writers-{variant}.zarr"
    cores = len(os.sched_getaffinity(0))
    with new_store(store, spec, n, shard_rows, sset.name, consts) as w:
        os.sync()
        t, c = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(cores) as pool:
            list(pool.map(lambda i: writer_mod.write_shard(store, i, shards[i]), range(len(shards))))
        os.sync()
        dt, cpu = time.perf_counter() - t, time.process_time() - c
        w.finalize()
    data = sum(p.stat().st_size for p in store.rglob("*") if p.is_file() and "c" in p.relative_to(store).parts
               and p.relative_to(store).parts[0] != "constants")
    return {"rows_per_s": n / dt, "bytes_per_s": data / dt, "cpu_s_per_row": cpu / n, "stored_bytes_per_row": data / n,
            "writers": cores, "store": str(store)}


def _rm(p: Path) -> None:
    import shutil

    shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)


def measure_build(sset: SignalSet, rows, shard_rows: int, tmp: Path, writers: int | None, variant: str) -> float:
    """The in-process build as the stage runs it (writes overlapped with capture): rows/s (the fit left out)."""
    spec = sset.spec(variant)
    model = make_teacher(sset, ARGS.teacher, ARGS.device)
    consts, constants = set_constants(sset, variant, model, rows)
    store = tmp / f"{sset.name}-build-{variant}-{writers}.zarr"
    with new_store(store, spec, len(rows), shard_rows, sset.name, consts) as w:
        t = time.perf_counter()
        run_shards(lambda i: shard_mod.compute_shard(model, rows, *w.manifest.shard_rows_range(i), spec, BATCH, 0,
                                                     constants),
                   str(store), w.pending_shards(), lambda i, marker: w.record([i]), writers=writers)
        rate = len(rows) / (time.perf_counter() - t)
        w.finalize()
    return rate


def bare_rate(sset: SignalSet, rows, shard_rows: int) -> float:
    """The real teacher's bare forward on exactly the build's batches: rows/s (what the build is compared to)."""
    from teacher_cache import bare_forward

    model = make_teacher(sset, "real", ARGS.device)
    return bare_forward(model, rows, BATCH, ARGS.device, shard_rows)


def _drop_pages(path: Path) -> None:
    for p in ([path] if path.is_file() else [q for q in path.rglob("*") if q.is_file()]):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_bandwidth(tmp: Path, gb: float) -> tuple[float, float, float]:
    """Sequential write of one file, bytes/s: with O_DIRECT from an aligned buffer (the device's own; the number the
    writers are held against) and through the page cache with an fsync; then its read (pages dropped first)."""
    path, block = tmp / "disk.bin", np.random.default_rng(0).bytes(8 << 20)
    n = max(1, int(gb * 2**30 / len(block)))
    direct = 0.0
    if getattr(os, "O_DIRECT", 0):
        aligned = mmap.mmap(-1, len(block))
        aligned[:] = block
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        except OSError:
            fd = -1
        if fd >= 0:
            t = time.perf_counter()
            try:
                for _ in range(n):
                    os.write(fd, aligned)
                os.fsync(fd)
            finally:
                os.close(fd)
            direct = n * len(block) / (time.perf_counter() - t)
            path.unlink()
    t = time.perf_counter()
    with path.open("wb", buffering=0) as f:
        for _ in range(n):
            f.write(block)
        os.fsync(f.fileno())
    write = n * len(block) / (time.perf_counter() - t)
    _drop_pages(path)
    t = time.perf_counter()
    with path.open("rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    read = n * len(block) / (time.perf_counter() - t)
    path.unlink()
    return max(direct, write), write, read


def loader_rate(store: Path) -> tuple[float, float, float, float, float]:
    """Block loader reading every signal of a store whose pages were dropped: rows/s, stored bytes/s, CPU seconds
    (all threads) per row, cores used (CPU / wall), and the speed-up of reading a window's shard files in parallel
    (distillpipe.store.reader.read_blocks) over reading them one at a time, alternated, best of 2 each."""
    st = open_store(store)
    names = [a for a in st.arrays if a not in ("row_index", "length")]
    best: dict[bool, tuple] = {}
    for parallel in (False, True, False, True):
        _drop_pages(store)
        loader = BlockLoader(store, names, block_rows=64, buffer_blocks=4, seed=0, expected=None, streams=1,
                             batch_size=32)
        real = reader_mod.codec_threads
        if not parallel:
            reader_mod.codec_threads = lambda: 1 << 30  # one shard file at a time, its chunks decoded in parallel
        try:
            t, c = time.perf_counter(), time.process_time()
            n = sum(len(ri) for ri, _ in loader)
            dt, cpu = time.perf_counter() - t, time.process_time() - c
        finally:
            reader_mod.codec_threads = real
        if parallel not in best or dt < best[parallel][1]:
            best[parallel] = (n, dt, cpu)
    n, dt, cpu = best[True]
    info = st.info()
    return n / dt, (info["bytes_on_disk"] - info["constants"]["bytes_on_disk"]) / dt, cpu / n, cpu / dt, \
        best[False][1] / dt
