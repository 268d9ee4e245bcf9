"""The teacher-cache path at the seeds' scale: what each step costs, and what would bound a real run.

A BERT-Large-shaped (or BERT-base) stand-in teacher (:mod:`distillpipe.teacher.standin`: real hooks, a
forward that costs nothing) runs the real path: capture and pooling, host copy and checks, shard
assembly, the writer's checks, encoding (Blosc + crc32c: :mod:`distillpipe.store.codec`), publishing
(file + rename + sha256), markers and manifest. For each signal set of the seed papers it measures, on this
machine:

  1. CPU-seconds per 1,000 rows of each step, run one after the other in one process (so each step's
     CPU time, all threads included, is its own), and bytes per row captured and on disk;
  2. how many cores one shard writer keeps busy (its CPU time over its wall time: a shard's inner chunks are
     encoded on a thread per core, outside the GIL); writers with one core each, 2 against 1 (how writer
     threads scale); and the whole in-process build, writes overlapped with capture, as the stage runs it;
  3. the disk's own sequential write (fsync'd) and read (pages dropped first) bandwidth;
  4. the block loader's rows/s, bytes/s and CPU per row reading the built store from disk (pages dropped), and
     its window's shard files read in parallel against one at a time.

Then it PROJECTS, for a box of ``--cores`` cores with one H100 (a BERT-Large L 384 forward at
``--gpu-seq-s`` sequences/s in bf16, scaled to other shapes by FLOPs, and the capture's extra Q K^T
FLOPs), the rows/s each resource allows: GPU (forward + capture), device-to-host copy (at
``--pcie-gb-s``), the driver's main thread (which cuts the next batch while the GPU runs the current one,
then takes its copy), the shard writers (one writer's rate on one core, times Amdahl's speed-up over the cores
left from the 2-writer speed-up measured in 2; as many writer threads as cores, ``threads_per_worker``), and
the disk. The smallest is the bound. And for a student's loader on that box: its CPU per row over the cores left
against the disk's read.
Measured vs projected: steps 1-4 are measured here; the GPU rate, the PCIe rate and the 16-core
scaling are projections from them.

Writes ``benchmarks/results/at_scale.json`` (read by ``distillpipe plan``).

Usage: python benchmarks/at_scale.py [--sets logits,cmow,waldorf,minialbert] [--rows N] [--shard-rows N]
       [--disk-gb 2] [--cores 16] [--device cuda --teacher real]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

import distillpipe.store.writer as writer_mod
import distillpipe.teacher.shard as shard_mod
from distillpipe.runtime import resolve_device
from distillpipe.store import reader as reader_mod
from distillpipe.store.loader import BlockLoader
from distillpipe.store.manifest import Manifest, TeacherInfo
from distillpipe.store.reader import open_store
from distillpipe.store.resume import create_or_resume
from distillpipe.store.schema import SignalSpec
from distillpipe.teacher.cache import producer_code, run_shards
from distillpipe.teacher.plan import forward_flops
from distillpipe.teacher.standin import SHAPES, standin_teacher

RESULTS = Path(__file__).resolve().parent / "results" / "at_scale.json"
ARGS = argparse.Namespace(teacher="standin", device=torch.device("cpu"))  # set by main()
BATCH = 64


@dataclass(frozen=True)
class SignalSet:
    """One seed paper's teacher signals, on its teacher's shape."""

    name: str
    paper: str
    shape: str
    head: str
    seq_len: int
    signals: dict
    masked: int = 0
    """MLM positions per row (15% of the tokens)."""
    rows: int = 1024
    shard_rows: int = 1024
    """The stage's default for small rows; for rows of MBs, smaller here (a shard is held twice while written, and
    the CPU capture of the stand-in's 8 attention layers is slow): per-shard costs then weigh more, not less."""

    def spec(self) -> SignalSpec:
        cfg = SHAPES[self.shape]
        s = self.signals
        task = {"qa": "qa", "classification": "classification"}.get(self.head, "none") if s.get("logits") else "none"
        probs = s.get("attn_probs", False)
        return SignalSpec(max_seq_len=self.seq_len, pool=s.get("pool", 1), task=task,
                          n_classes=2 if task == "classification" else 0, vocab_size=cfg["vocab_size"],
                          mlm_topk=s.get("mlm_topk", 0), mlm_max_masked=self.masked if s.get("mlm_topk") else 0,
                          hidden_layers=tuple(s.get("hidden_layers", ())), hidden_size=cfg["hidden_size"],
                          attn_layers=() if probs else tuple(s.get("attn_layers", ())),
                          n_heads=cfg["num_attention_heads"],
                          attn_probs_layers=tuple(s.get("attn_layers", ())) if probs else (),
                          embedding_size=cfg["hidden_size"] if s.get("embeddings") else 0)


EIGHT = [3, 6, 9, 12, 15, 18, 21, 24]
SETS = {s.name: s for s in (
    SignalSet("logits", "task logits (SQuAD v2 start/end)", "bert-large", "qa", 384, {"logits": True}),
    SignalSet("cmow", "CMOW: MLM top-64", "bert-base", "mlm", 128, {"mlm_topk": 64}, masked=20, rows=4096),
    SignalSet("waldorf", "WaLDORf: logits + embeddings + hidden and scores of 8 layers, pooled 4x", "bert-large",
              "qa", 384, {"logits": True, "embeddings": True, "hidden_layers": EIGHT, "attn_layers": EIGHT,
                          "pool": 4}, rows=256, shard_rows=128),
    SignalSet("minialbert", "MiniALBERT: MLM top-64 + hidden and attention probabilities of 3 layers", "bert-base",
              "mlm", 128, {"mlm_topk": 64, "hidden_layers": [4, 8, 12], "attn_layers": [4, 8, 12],
                           "attn_probs": True}, masked=20, rows=1024, shard_rows=256),
)}

# -- steps: CPU time per step, all threads of the process, while steps run one at a time ----------------------


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
    "encode": "writer: Zarr encode (Blosc + crc32c)",
    "publish": "writer: file write + rename + sha256",
    "marker": "writer: marker (fsync)",
}
MAIN_THREAD = ("to_host", "assemble")
WRITER = ("checks", "encode", "publish", "marker")


def _timed(module, name: str, step: str) -> None:
    orig = getattr(module, name)

    def wrapper(*a, **k):
        with STEPS.step(step):
            return orig(*a, **k)

    setattr(module, name, wrapper)


_timed(shard_mod, "capture_batch", "capture")
_timed(shard_mod, "to_host", "to_host")
_timed(writer_mod, "_checked_arrays", "checks")
_timed(writer_mod, "_encode_shard", "encode")
_timed(writer_mod, "_publish", "publish")
_timed(writer_mod, "write_marker", "marker")

# -- teachers --------------------------------------------------------------------------------------------------


def make_teacher(sset: SignalSet, kind: str, device: torch.device) -> torch.nn.Module:
    """The stand-in (a forward that costs nothing) or a real BERT of the set's shape with random weights (the
    forward included: what a GPU run measures), in eval mode on ``device``."""
    if kind == "standin":
        return standin_teacher(sset.shape, sset.head, max_batch=BATCH, max_seq_len=sset.seq_len,
                               max_masked=sset.masked).to(device)
    import transformers

    cfg = transformers.BertConfig(**SHAPES[sset.shape], max_position_embeddings=512, num_labels=2)
    cls = {"qa": transformers.BertForQuestionAnswering, "mlm": transformers.BertForMaskedLM,
           "classification": transformers.BertForSequenceClassification, "base": transformers.BertModel}[sset.head]
    torch.manual_seed(0)
    return cls(cfg, attn_implementation="sdpa").eval().to(device)


# -- inputs ----------------------------------------------------------------------------------------------------


def make_rows(n: int, seq_len: int, masked: int, seed: int = 0):
    """Token rows of 50-100% of L (length variety as in real corpora), MLM positions when asked."""
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    lengths = rng.integers(seq_len // 2, seq_len + 1, size=n)
    cols = {"input_ids": [[101] + rng.integers(1000, 29000, size=k - 2).tolist() + [102] for k in lengths],
            "token_type_ids": [[0] * k for k in lengths], "length": lengths.tolist()}
    if masked:
        cols["masked_positions"] = [np.sort(rng.choice(np.arange(1, k - 1), size=min(masked, k - 2),
                                                       replace=False)).tolist() for k in lengths]
    return Dataset.from_dict(cols)


def new_store(path: Path, spec: SignalSpec, n: int, shard_rows: int, name: str):
    manifest = Manifest(teacher=TeacherInfo(name=f"stand-in {name}", weights_sha256="stand-in",
                                            tokenizer_sha256="stand-in", config={}),
                        tokens_fingerprint=f"at-scale-{n}", split="train", signals=spec,
                        compute={"precision": "fp32", "batch_size": BATCH}, code=producer_code(), n_rows=n,
                        shard_rows=shard_rows)
    return create_or_resume(path, manifest)


# -- measurements ------------------------------------------------------------------------------------------------


def measure_steps(sset: SignalSet, rows, shard_rows: int, tmp: Path) -> dict:
    """Each step's CPU seconds per 1,000 rows, steps one at a time (compute a shard, then write it)."""
    spec = sset.spec()
    model = make_teacher(sset, ARGS.teacher, ARGS.device)
    n = len(rows)
    store = tmp / f"{sset.name}-steps.zarr"
    with new_store(store, spec, n, shard_rows, sset.name) as w:
        shard_mod.compute_shard(model, rows, 0, min(BATCH, n), spec, BATCH, 0)  # warm-up, untimed
        STEPS.cpu.clear(), STEPS.wall.clear()
        STEPS.active = True
        captured = 0
        try:
            for i in w.pending_shards():
                start, stop = w.manifest.shard_rows_range(i)
                before = STEPS.cpu["capture"] + STEPS.cpu["to_host"]
                c = time.process_time()
                arrays = shard_mod.compute_shard(model, rows, start, stop, spec, BATCH, 0)
                inner = STEPS.cpu["capture"] + STEPS.cpu["to_host"] - before
                STEPS.cpu["assemble"] += time.process_time() - c - inner  # what compute_shard does around them
                captured += sum(a.nbytes for a in arrays.values())
                w.record([writer_mod.write_shard(store, i, arrays)["shard"]])
        finally:
            STEPS.active = False
        summary = w.finalize()
    per_k = {k: 1000 * STEPS.cpu[k] / n for k in STEP_NAMES}
    writer_wall = sum(STEPS.wall[k] for k in WRITER)
    return {"cpu_s_per_1k": per_k, "writer_parallelism": sum(STEPS.cpu[k] for k in WRITER) / writer_wall,
            "captured_bytes_per_row": captured / n,
            "stored_bytes_per_row": summary.bytes_on_disk / n, "store": str(store)}


def writer_scaling(sset: SignalSet, rows, shard_rows: int, tmp: Path) -> tuple[float, float]:
    """Writers as threads, each on one core: 4 shards written by 1 and by 2 writer threads whose chunks are encoded
    in their own thread (no codec pool), best of 2. Returns (one writer's wall seconds per row, 2 writers' speed-up).

    Taking the codec pool out is what makes this a measure of how writer threads scale (the GIL-held part of a
    write is what stops them): with the pool, one writer already spreads its chunks over this machine's 2 cores and
    2 writers can only compete for them, which says nothing about 14 writers on 16 cores."""
    spec = sset.spec()
    model = make_teacher(sset, ARGS.teacher, ARGS.device)
    shard_rows = max(1, min(shard_rows, len(rows) // 4))  # 4 shards, even when the set's rows fill only one
    n = 4 * shard_rows
    shards = [shard_mod.compute_shard(model, rows, s, s + shard_rows, spec, BATCH, 0) for s in range(0, n, shard_rows)]
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
    return min(times[1]) / n, min(times[1]) / min(times[2])


def measure_build(sset: SignalSet, rows, shard_rows: int, tmp: Path, writers: int | None) -> float:
    """The in-process build as the stage runs it (writes overlapped with capture): rows/s."""
    spec = sset.spec()
    model = make_teacher(sset, ARGS.teacher, ARGS.device)
    store = tmp / f"{sset.name}-build-{writers}.zarr"
    with new_store(store, spec, len(rows), shard_rows, sset.name) as w:
        t = time.perf_counter()
        run_shards(lambda i: shard_mod.compute_shard(model, rows, *w.manifest.shard_rows_range(i), spec, BATCH, 0),
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


def disk_bandwidth(tmp: Path, gb: float) -> tuple[float, float]:
    """Sequential write (with fsync) and read (pages dropped first) of one file, bytes/s."""
    path, block = tmp / "disk.bin", np.random.default_rng(0).bytes(8 << 20)
    n = max(1, int(gb * 2**30 / len(block)))
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
    return write, read


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
    return n / dt, st.info()["bytes_on_disk"] / dt, cpu / n, cpu / dt, best[False][1] / dt


# -- projection --------------------------------------------------------------------------------------------------


def capture_flops(sset: SignalSet) -> float:
    """Device FLOPs the capture adds to a forward, per row: Q K^T of each selected attention layer."""
    spec, L, d = sset.spec(), sset.seq_len, SHAPES[sset.shape]["hidden_size"]
    return 2.0 * L * L * d * len(set(spec.attn_layers) | set(spec.attn_probs_layers))


def project(sset: SignalSet, m: dict, disk_write: float, disk_read: float, args) -> dict:
    """Rows/s each resource of a ``--cores`` box with one GPU allows, and the bound."""
    cfg = SHAPES[sset.shape]
    ref = forward_flops(SHAPES["bert-large"], 384, "qa")
    flops = forward_flops(cfg, sset.seq_len, sset.head, masked=sset.masked) + capture_flops(sset)
    gpu = args.gpu_seq_s * ref / flops
    cpu = m["cpu_s_per_1k"]
    main_s = sum(cpu[k] for k in MAIN_THREAD) / 1000
    writer_s = sum(cpu[k] for k in WRITER) / 1000
    # Writers are threads (threads_per_worker - 1), each encoding on one core when there are as many writers as
    # cores: one such writer's wall time per row (measured), times Amdahl's speed-up across writers from the measured
    # 2-writer speed-up (writer_scaling), projected to the cores left on the GPU box.
    spare = max(1, args.cores - 2)  # one core drives the GPU, one is the OS's and DVC's
    parallel = min(1.0, max(0.0, 2 * (1 - 1 / m["writer_speedup_2"])))
    writers_speedup = 1 / ((1 - parallel) + parallel / spare)
    writer_wall_s = m["writer_s_per_row_1core"]
    rates = {
        "gpu": gpu,
        "pcie": args.pcie_gb_s * 1e9 / m["captured_bytes_per_row"],
        # the driver's host work (cutting the next batch, taking the copy) overlaps the GPU's work on the current one
        # (distillpipe.teacher.shard.compute_shard): the slower of the two sets the pace
        "main thread": 1 / max(1 / gpu, main_s),
        "writers": writers_speedup / writer_wall_s if writer_s else float("inf"),
        "disk": disk_write / m["stored_bytes_per_row"],
    }
    bound = min(rates, key=rates.get)
    # A student's loader on the same box: its decoding spreads a block's chunks over the cores (the codec pool; how
    # many of this machine's cores it used is printed); bounded by the disk's sequential read.
    loader = {"cpu": spare / m["loader_cpu_s_per_row"], "disk": disk_read / m["stored_bytes_per_row"]}
    return {"rates": rates, "bound": bound, "rows_per_s": rates[bound], "of_gpu": rates[bound] / gpu,
            "writer_parallel_fraction": parallel, "writers": round(writers_speedup, 2),
            "loader_rates": loader, "loader_bound": min(loader, key=loader.get),
            "loader_of_disk": min(loader.values()) / loader["disk"]}


# -- main --------------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="rows per signal set (default: the set's own)")
    ap.add_argument("--shard-rows", type=int, default=None, help="rows per shard (default: the set's own)")
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    ap.add_argument("--disk-gb", type=float, default=2.0)
    ap.add_argument("--cores", type=int, default=16, help="cores of the projected GPU box")
    ap.add_argument("--gpu-seq-s", type=float, default=3200.0,
                    help="BERT-Large L 384 sequences/s of the projected GPU (H100, bf16)")
    ap.add_argument("--pcie-gb-s", type=float, default=20.0, help="device-to-host GB/s of the projected GPU")
    ap.add_argument("--writers", type=int, default=1, help="shard writer threads of the build (the stage's: 1)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto: where the teacher (and the capture) run")
    ap.add_argument("--teacher", choices=("standin", "real"), default="standin",
                    help="standin: a forward that costs nothing; real: a random-weight BERT of the shape (on a GPU)")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args()
    ARGS.teacher, ARGS.device = args.teacher, resolve_device(args.device)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    cores = len(os.sched_getaffinity(0))
    where = torch.cuda.get_device_name(ARGS.device) if ARGS.device.type == "cuda" else "CPU"
    print(f"at_scale: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {where}, {cores} cores, torch threads "
          f"{torch.get_num_threads()}; teacher {args.teacher}; load average {os.getloadavg()[0]:.1f}")
    print("Measured here: per-step CPU time, writer scaling, the build, disk and loader. Projected: a "
          f"{args.cores}-core box with one GPU at {args.gpu_seq_s:,.0f} BERT-Large L 384 seq/s.")
    results = {}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        tmp = Path(tmp)
        disk_write, disk_read = disk_bandwidth(tmp, args.disk_gb)
        print(f"disk: sequential write {disk_write / 1e9:.2f} GB/s (fsync'd), read {disk_read / 1e9:.2f} GB/s "
              f"(pages dropped), {args.disk_gb:g} GB")
        for name in args.sets.split(","):
            sset = SETS[name]
            n, shard_rows = args.rows or sset.rows, args.shard_rows or sset.shard_rows
            rows = make_rows(n, sset.seq_len, sset.masked)
            m = measure_steps(sset, rows, shard_rows, tmp)
            m["writer_s_per_row_1core"], m["writer_speedup_2"] = writer_scaling(sset, rows, shard_rows, tmp)
            m["build_rows_per_s"] = measure_build(sset, rows, shard_rows, tmp, args.writers)
            if args.teacher == "real":
                m["bare_rows_per_s"] = bare_rate(sset, rows, shard_rows)
            (m["loader_rows_per_s"], m["loader_bytes_per_s"], m["loader_cpu_s_per_row"],
             m["loader_cores"], m["loader_parallel_files_speedup"]) = loader_rate(Path(m.pop("store")))
            m["projection"] = project(sset, m, disk_write, disk_read, args)
            results[name] = m
            m["rows"], m["shard_rows"] = n, shard_rows
            _print_set(sset, n, m)
            for p in tmp.glob("*.zarr*"):
                _rm(p)
    _print_projection(results, args)
    _write_json(results, disk_write, disk_read, args)


def _rm(p: Path) -> None:
    import shutil

    shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)


def _print_set(sset: SignalSet, n: int, m: dict) -> None:
    cpu = m["cpu_s_per_1k"]
    print(f"\n== {sset.name}: {sset.paper}; {sset.shape} shape, L {sset.seq_len}, {n} rows, shards of "
          f"{m['shard_rows']}")
    ratio = m["captured_bytes_per_row"] / m["stored_bytes_per_row"]
    print(f"   bytes/row: captured {m['captured_bytes_per_row'] / 1024:,.1f} KiB, on disk "
          f"{m['stored_bytes_per_row'] / 1024:,.1f} KiB ({ratio:.2f}x: padding; dense float16 values barely compress)")
    print(f"   {'step':44s} {'CPU s / 1k rows':>16s} {'MB/s of 1 core':>15s}")
    for k, label in STEP_NAMES.items():
        rate = m["captured_bytes_per_row"] * 1000 / cpu[k] / 1e6 if cpu[k] else float("inf")
        print(f"   {label:44s} {cpu[k]:16.3f} {rate:15,.0f}")
    host = sum(cpu[k] for k in MAIN_THREAD + WRITER)
    print(f"   {'host total (all but capture)':44s} {host:16.3f}")
    print(f"   one writer uses {m['writer_parallelism']:.2f} cores; writers on one core each: "
          f"{1 / m['writer_s_per_row_1core']:,.0f} rows/s for one, 2 vs 1: {m['writer_speedup_2']:.2f}x; "
          f"in-process build {m['build_rows_per_s']:,.0f} "
          f"rows/s (capture on {ARGS.device.type} included); loader {m['loader_rows_per_s']:,.0f} rows/s = "
          f"{m['loader_bytes_per_s'] / 1e9:.2f} GB/s from disk, using {m['loader_cores']:.2f} cores "
          f"({m['loader_cpu_s_per_row'] * 1e3:.2f} CPU-ms/row); shard files read in parallel vs one at a time: "
          f"{m['loader_parallel_files_speedup']:.2f}x")
    if "bare_rows_per_s" in m:
        print(f"   real teacher: bare forward {m['bare_rows_per_s']:,.0f} rows/s -> build/bare "
              f"{m['build_rows_per_s'] / m['bare_rows_per_s']:.2f}")


def _print_projection(results: dict, args) -> None:
    print(f"\n== projected rows/s on a {args.cores}-core box with one GPU ({args.gpu_seq_s:,.0f} BERT-Large L 384 "
          f"seq/s, {args.pcie_gb_s:g} GB/s device-to-host); disk as measured here")
    cols = ["gpu", "pcie", "main thread", "writers", "disk"]
    print(f"   {'set':12s}" + "".join(f"{c:>13s}" for c in cols) + f"{'bound':>13s}{'of GPU':>8s}")
    for name, m in results.items():
        p = m["projection"]
        print(f"   {name:12s}" + "".join(f"{p['rates'][c]:13,.0f}" for c in cols)
              + f"{p['bound']:>13s}{p['of_gpu']:8.2f}")
    print("\n   a student's block loader on that box (cores - 2 decoding; disk read as measured here)")
    print(f"   {'set':12s}{'CPU':>13s}{'disk':>13s}{'bound':>13s}{'of disk':>9s}")
    for name, m in results.items():
        p = m["projection"]
        print(f"   {name:12s}" + "".join(f"{p['loader_rates'][c]:13,.0f}" for c in ("cpu", "disk"))
              + f"{p['loader_bound']:>13s}{p['loader_of_disk']:9.2f}")


def _write_json(results: dict, disk_write: float, disk_read: float, args) -> None:
    host_s = [sum(m["cpu_s_per_1k"][k] for k in MAIN_THREAD + WRITER) / 1000 / m["captured_bytes_per_row"]
              for m in results.values()]  # per uncompressed byte, as `distillpipe plan` applies it
    out = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "device": ARGS.device.type,
        "device_name": (torch.cuda.get_device_name(ARGS.device) if ARGS.device.type == "cuda"
                        else f"CPU, {len(os.sched_getaffinity(0))} cores"),
        "cores": len(os.sched_getaffinity(0)), "teacher": ARGS.teacher,
        "gpu": {"name": f"H100 bf16 (assumed: {args.gpu_seq_s:,.0f} BERT-Large L 384 seq/s)",
                "flops_per_s": args.gpu_seq_s * forward_flops(SHAPES["bert-large"], 384, "qa"),
                "projection_cores": args.cores},
        "disk": {"write_bytes_per_s": disk_write, "read_bytes_per_s": disk_read},
        "host": {"cpu_s_per_byte": statistics.median(host_s)},
        "sets": results,
        "argv": sys.argv[1:],
    }
    measured = [(name, m["bare_rows_per_s"]) for name, m in results.items() if "bare_rows_per_s" in m]
    if measured:  # a real teacher's forward was measured here (on a GPU: replaces the assumption)
        name, rate = measured[0]
        sset = SETS[name]
        flops = rate * forward_flops(SHAPES[sset.shape], sset.seq_len, sset.head, masked=sset.masked)
        out["forward"] = {"flops_per_s": flops, "rows_per_s": rate,
                          "measured_on": f"random-weight {sset.shape}, L {sset.seq_len}, {ARGS.device.type}"}
        if ARGS.device.type == "cuda":
            out["gpu"].update(name=f"{out['device_name']} (measured)", flops_per_s=flops)
    elif ARGS.device.type == "cpu":
        out["forward"] = _forward_rate()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(f"\nwrote {args.json}")


def _forward_rate() -> dict:
    """This machine's real teacher forward (the embedded MiniLM-L6, L 128, fp32) as FLOP/s, for `plan`."""
    from teacher_cache import bare_forward

    from distillpipe.assets import resolve_model
    from distillpipe.teacher.load import load_teacher

    model_dir = resolve_model("embedded:minilm-l6")
    model, _ = load_teacher(model_dir, "base", "cpu")
    rows = make_rows(256, 128, 0)
    bare_forward(model, rows.select(range(64)), BATCH, torch.device("cpu"), 64)
    rate = bare_forward(model, rows, BATCH, torch.device("cpu"), 256)
    mean_len = float(np.mean(rows["length"]))
    cfg = model.config.to_dict()
    return {"flops_per_s": rate * forward_flops(cfg, round(mean_len), "base"),
            "measured_on": f"MiniLM-L6, mean length {mean_len:.0f} of L 128, fp32, batch {BATCH}",
            "rows_per_s": rate}



if __name__ == "__main__":
    main()
