"""The teacher-cache path at the seeds' scale: what each step costs, and what would bound a real run.

A BERT-Large-shaped (or BERT-base) stand-in teacher (:mod:`distillpipe.teacher.standin`: real hooks, a
forward that costs nothing) runs the real path: capture and pooling, host copy and checks, shard
assembly, the writer's checks, encoding (:mod:`distillpipe.store.codec`: raw frames, lz4, crc32c),
publishing (O_DIRECT segments + rename), markers and manifest. For each signal set of the seed papers it
measures, on this machine (``_scale_measure.py``), for its signals ``dense`` (float16 as the teacher computes them:
before the compact forms) and ``compact`` (the defaults: hidden states in a principal subspace, attention maps as
low-rank factors, int8; the embedding output derived in both):

  1. CPU-seconds per 1,000 rows of each step, run one after the other in one process (so each step's
     CPU time, all threads included, is its own), and bytes per row captured and on disk;
  2. writers with one core each, 2 against 1 (how writer threads scale: what the GIL leaves parallel);
  3. the writers alone (capture left out, as on a GPU box), as many as cores, against the disk's sequential write
     (O_DIRECT, fsync'd: the device's own): rows/s, GB/s, and the fraction of the disk they reach;
  4. the whole in-process build, writes overlapped with capture, as the stage runs it;
  5. the disk's own sequential write (O_DIRECT and through the page cache, fsync'd) and read (pages dropped);
  6. the block loader's rows/s, bytes/s and CPU per row reading the built stores from disk (pages dropped), against
     the disk's read.

Then it PROJECTS, for a box of ``--cores`` cores with one H100 (a BERT-Large L 384 forward at ``--gpu-seq-s``
sequences/s in bf16, scaled to other shapes by FLOPs, and the capture's extra Q K^T FLOPs), the rows/s each
resource allows: GPU (forward + capture), device-to-host copy (at ``--pcie-gb-s``), the driver's main thread, the
shard writers (one writer's rate on one core, times Amdahl's speed-up over the cores left from the 2-writer
speed-up of 2), and the disk, this one and a ``--nvme-gb-s`` NVMe. The smallest is the bound. And a student's
epoch on that box: reading the cache (the loader's CPU over the cores left, the disk's read) against running the
teacher live (the GPU's bare forward), dense and compact, on both disks.
Measured vs projected: 1-6 are measured here; the GPU rate, the PCIe rate, the NVMe and the 16-core scaling are
projections from them.

Writes ``benchmarks/results/at_scale.json`` (read by ``distillpipe plan``).

Usage: python benchmarks/at_scale.py [--sets logits,cmow,waldorf,minialbert] [--variants dense,compact] [--rows N]
       [--shard-rows N] [--disk-gb 2] [--cores 16] [--nvme-gb-s 3] [--device cuda --teacher real]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from _scale_measure import (
    MAIN_THREAD,
    STEP_NAMES,
    WRITER,
    _rm,
    bare_rate,
    computed_shards,
    disk_bandwidth,
    loader_rate,
    measure_build,
    measure_steps,
    writer_scaling,
    writers_vs_disk,
)
from _scale_sets import ARGS, BATCH, RESULTS, SETS, VARIANTS, SignalSet, make_rows

from distillpipe.runtime import resolve_device
from distillpipe.teacher.plan import forward_flops
from distillpipe.teacher.standin import SHAPES

# -- projection --------------------------------------------------------------------------------------------------


def capture_flops(sset: SignalSet, variant: str) -> float:
    """Device FLOPs the capture adds to a forward, per row: Q K^T of each selected attention layer; in the compact
    forms also the subspace projection of each hidden layer (n d r) and the low-rank factorization of each head's map
    (a randomized subspace iteration: ~(2 q + 2) n^2 (r + 8) for q = 2 power iterations, plus its small Gram
    eigendecompositions: left out)."""
    spec, L, d = sset.spec(variant), sset.seq_len, SHAPES[sset.shape]["hidden_size"]
    attn = set(spec.attn_layers) | set(spec.attn_probs_layers)
    flops = 2.0 * L * L * d * len(attn)
    if spec.hidden_rank:
        flops += 2.0 * spec.pooled_len * d * spec.hidden_rank * len(spec.hidden_layers)
    if spec.attn_rank:
        n = spec.pooled_len if spec.attn_layers else spec.max_seq_len
        flops += 2.0 * 6 * n * n * (spec.attn_rank + 8) * spec.n_heads * len(attn)
    return flops


def project(sset: SignalSet, m: dict, disk_write: float, disk_read: float, args, variant: str) -> dict:
    """Rows/s each resource of a ``--cores`` box with one GPU allows, and the bound, with this disk and an NVMe; a
    student's epoch there from the cache against the live teacher."""
    cfg = SHAPES[sset.shape]
    ref = forward_flops(SHAPES["bert-large"], 384, "qa")
    bare = args.gpu_seq_s * ref / forward_flops(cfg, sset.seq_len, sset.head, masked=sset.masked)
    gpu = args.gpu_seq_s * ref / (forward_flops(cfg, sset.seq_len, sset.head, masked=sset.masked)
                                  + capture_flops(sset, variant))
    cpu = m["cpu_s_per_1k"]
    main_s = sum(cpu[k] for k in MAIN_THREAD) / 1000
    writer_s = sum(cpu[k] for k in WRITER) / 1000
    # Writers are threads (threads_per_worker - 1), each encoding on one core when there are as many writers as
    # cores: one such writer's wall time per row (measured), times Amdahl's speed-up across writers from the measured
    # 2-writer speed-up (writer_scaling), projected to the cores left on the GPU box.
    spare = max(1, args.cores - 2)  # one core drives the GPU, one is the OS's and DVC's
    parallel = min(1.0, max(0.0, 2 * (1 - 1 / m["writer_speedup_2"])))
    writers_speedup = 1 / ((1 - parallel) + parallel / spare)
    disks = {"this disk": (disk_write, disk_read), "nvme": (args.nvme_gb_s * 1e9, args.nvme_gb_s * 1e9)}
    rates = {
        "gpu": gpu,
        "pcie": args.pcie_gb_s * 1e9 / m["captured_bytes_per_row"],
        # the driver's host work (cutting the next batch, taking the copy) overlaps the GPU's work on the current one
        # (distillpipe.teacher.shard.compute_shard): the slower of the two sets the pace
        "main thread": 1 / max(1 / gpu, main_s),
        "writers": writers_speedup / m["writer_s_per_row_1core"] if writer_s else float("inf"),
    }
    out = {"rates": rates, "writer_parallel_fraction": parallel, "writers": round(writers_speedup, 2),
           "live_rows_per_s": bare, "per_disk": {}}
    lm = m["loader"]
    for disk, (write, read) in disks.items():
        r = {**rates, "disk": write / m["stored_bytes_per_row"]}
        bound = min(r, key=r.get)
        # A student's epoch on the same box, reading the cache: the loader's CPU spread over the cores left, or the
        # disk's read; against the teacher run live on every batch (its bare forward on the GPU).
        limits = {"cpu": spare / lm["cpu_s_per_row"], "disk": read / lm["stored_bytes_per_row"]}
        epoch = {"rows_per_s": min(limits.values()), "bound": min(limits, key=limits.get),
                 "vs_live": min(limits.values()) / bare}
        out["per_disk"][disk] = {"disk": r["disk"], "bound": bound, "rows_per_s": r[bound], "of_gpu": r[bound] / gpu,
                                 "epoch": epoch}
    return out


# -- main --------------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="rows per signal set (default: the set's own)")
    ap.add_argument("--shard-rows", type=int, default=None, help="rows per shard (default: the set's own)")
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--disk-gb", type=float, default=2.0)
    ap.add_argument("--cores", type=int, default=16, help="cores of the projected GPU box")
    ap.add_argument("--gpu-seq-s", type=float, default=3200.0,
                    help="BERT-Large L 384 sequences/s of the projected GPU (H100, bf16)")
    ap.add_argument("--pcie-gb-s", type=float, default=20.0, help="device-to-host GB/s of the projected GPU")
    ap.add_argument("--nvme-gb-s", type=float, default=3.0, help="sequential write and read GB/s of the projected NVMe")
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
    print("Measured here: per-step CPU time, writer scaling, the writers against the disk, the build, disk and loader. "
          f"Projected: a {args.cores}-core box with one GPU at {args.gpu_seq_s:,.0f} BERT-Large L 384 seq/s.")
    variants = args.variants.split(",")
    results = {}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        tmp = Path(tmp)
        disk_write, buffered_write, disk_read = disk_bandwidth(tmp, args.disk_gb)
        print(f"disk: sequential write {disk_write / 1e9:.2f} GB/s (O_DIRECT, fsync'd; through the page cache "
              f"{buffered_write / 1e9:.2f} GB/s), read {disk_read / 1e9:.2f} GB/s (pages dropped), {args.disk_gb:g} GB")
        for name in args.sets.split(","):
            sset = SETS[name]
            n, shard_rows = args.rows or sset.rows, args.shard_rows or sset.shard_rows
            rows = make_rows(n, sset.seq_len, sset.masked)
            res = results[name] = {"rows": n, "shard_rows": shard_rows}
            for variant in variants:
                m = measure_steps(sset, rows, shard_rows, tmp, variant)
                _rm(Path(m.pop("store")))
                shards, consts = computed_shards(sset, rows, shard_rows, variant)
                m["writer_s_per_row_1core"], m["writer_speedup_2"] = writer_scaling(sset, shards, tmp, variant)
                w = m["writers_alone"] = writers_vs_disk(sset, shards, tmp, variant, consts)
                w["of_disk"] = w["bytes_per_s"] / disk_write
                store = Path(w.pop("store"))
                rate, bps, cpu, used, par = loader_rate(store)
                m["loader"] = {"rows_per_s": rate, "bytes_per_s": bps, "of_disk": bps / disk_read,
                               "cpu_s_per_row": cpu, "cores": used, "parallel_files_speedup": par,
                               "stored_bytes_per_row": w["stored_bytes_per_row"]}
                _rm(store)
                del shards
                m["build_rows_per_s"] = measure_build(sset, rows, shard_rows, tmp, args.writers, variant)
                if args.teacher == "real" and "bare_rows_per_s" not in res:
                    res["bare_rows_per_s"] = bare_rate(sset, rows, shard_rows)
                m["projection"] = project(sset, m, disk_write, disk_read, args, variant)
                res[variant] = m
                _print_set(sset, n, shard_rows, variant, m, res.get("bare_rows_per_s"))
                for p in tmp.glob("*.zarr*"):
                    _rm(p)
    _print_projection(results, args, variants)
    _write_json(results, disk_write, disk_read, args, buffered_write, variants)


def _print_set(sset: SignalSet, n: int, shard_rows: int, variant: str, m: dict, bare: float | None) -> None:
    cpu = m["cpu_s_per_1k"]
    spec = sset.spec(variant)
    forms = (f"hidden rank {spec.hidden_rank or 'full'}, attention rank {spec.attn_rank or 'dense'}, "
             f"{spec.precision.hidden}/{spec.precision.attention}")
    print(f"\n== {sset.name} {variant} ({forms}): {sset.paper}; {sset.shape} shape, L {sset.seq_len}, {n} rows, "
          f"shards of {shard_rows}")
    ratio = m["captured_bytes_per_row"] / m["stored_bytes_per_row"]
    print(f"   bytes/row: captured {m['captured_bytes_per_row'] / 1024:,.1f} KiB, on disk "
          f"{m['stored_bytes_per_row'] / 1024:,.1f} KiB ({ratio:.2f}x: padding left out"
          f"{', int8 coded' if spec.precision.hidden == 'int8' else ''}); constants "
          f"{m['constants_bytes'] / 2**20:,.1f} MiB once a store")
    print(f"   {'step':44s} {'CPU s / 1k rows':>16s} {'MB/s of 1 core':>15s}")
    for k, label in STEP_NAMES.items():
        rate = m["captured_bytes_per_row"] * 1000 / cpu[k] / 1e6 if cpu[k] else float("inf")
        print(f"   {label:44s} {cpu[k]:16.3f} {rate:15,.0f}")
    writer = sum(cpu[k] for k in WRITER)
    print(f"   {'shard writer total (CPU-ms a row)':44s} {writer:16.3f}")
    print(f"   {'host total (all but capture)':44s} {sum(cpu[k] for k in MAIN_THREAD + WRITER):16.3f}")
    if m["fit_cpu_s_per_1k_rows"]:
        print(f"   {'subspace fit (CPU s / 1k fit rows, once)':44s} {m['fit_cpu_s_per_1k_rows']:16.3f}")
    print(f"   writers on one core each: {1 / m['writer_s_per_row_1core']:,.0f} rows/s for one, 2 vs 1: "
          f"{m['writer_speedup_2']:.2f}x; in-process build {m['build_rows_per_s']:,.0f} rows/s (capture on "
          f"{ARGS.device.type} included)")
    w, lo = m["writers_alone"], m["loader"]
    print(f"   writers alone ({w['writers']}): {w['rows_per_s']:,.0f} rows/s = {w['bytes_per_s'] / 1e9:.2f} "
          f"GB/s = {w['of_disk']:.2f} of the disk's write ({w['cpu_s_per_row'] * 1e3:.2f} CPU-ms/row, "
          f"{w['stored_bytes_per_row'] / 1024:,.0f} KiB/row); loader {lo['rows_per_s']:,.0f} rows/s = "
          f"{lo['bytes_per_s'] / 1e9:.2f} GB/s = {lo['of_disk']:.2f} of the disk's read "
          f"({lo['cpu_s_per_row'] * 1e3:.2f} CPU-ms/row, {lo['cores']:.2f} cores)")
    if bare:
        print(f"   real teacher: bare forward {bare:,.0f} rows/s -> build/bare {m['build_rows_per_s'] / bare:.2f}")


def _print_projection(results: dict, args, variants: list[str]) -> None:
    print(f"\n== projected rows/s on a {args.cores}-core box with one GPU ({args.gpu_seq_s:,.0f} BERT-Large L 384 "
          f"seq/s, {args.pcie_gb_s:g} GB/s device-to-host); this disk as measured here, and a {args.nvme_gb_s:g} GB/s "
          "NVMe")
    cols = ["gpu", "pcie", "main thread", "writers"]
    print(f"   {'set':20s}" + "".join(f"{c:>12s}" for c in cols) + f"{'disk':>12s}{'bound':>12s}{'of GPU':>8s}"
          f"{'NVMe':>12s}{'bound':>12s}{'of GPU':>8s}")
    for name, res in results.items():
        for v in variants:
            p = res[v]["projection"]
            here, nvme = p["per_disk"]["this disk"], p["per_disk"]["nvme"]
            print(f"   {name + ' ' + v:20s}" + "".join(f"{p['rates'][c]:12,.0f}" for c in cols)
                  + f"{here['disk']:12,.0f}{here['bound']:>12s}{here['of_gpu']:8.2f}"
                  + f"{nvme['disk']:12,.0f}{nvme['bound']:>12s}{nvme['of_gpu']:8.2f}")
    print("\n   a student's epoch on that box: rows/s reading the cache (the loader's CPU over the cores left, or the "
          "disk's read) against the teacher run live (its bare forward on the GPU)")
    print(f"   {'set':20s}{'KiB/row':>10s}{'live':>10s}{'this disk':>22s}{'NVMe':>22s}")
    for name, res in results.items():
        for v in variants:
            p, m = res[v]["projection"], res[v]
            cells = [p["per_disk"][d]["epoch"] for d in ("this disk", "nvme")]
            print(f"   {name + ' ' + v:20s}{m['stored_bytes_per_row'] / 1024:10,.1f}{p['live_rows_per_s']:10,.0f}"
                  + "".join(f"{c['rows_per_s']:13,.0f} ({c['vs_live']:5.2f}x)" for c in cells))


def _write_json(results: dict, disk_write: float, disk_read: float, args, buffered_write: float,
                variants: list[str]) -> None:
    used = "compact" if "compact" in variants else variants[0]  # the defaults: what `distillpipe plan` projects
    host_s = [sum(r[used]["cpu_s_per_1k"][k] for k in MAIN_THREAD + WRITER) / 1000 / r[used]["captured_bytes_per_row"]
              for r in results.values()]  # per uncompressed byte, as `distillpipe plan` applies it
    loader_s = [r[used]["loader"]["cpu_s_per_row"] / r[used]["loader"]["stored_bytes_per_row"]
                for r in results.values()]  # per stored byte read
    out = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "device": ARGS.device.type,
        "device_name": (torch.cuda.get_device_name(ARGS.device) if ARGS.device.type == "cuda"
                        else f"CPU, {len(os.sched_getaffinity(0))} cores"),
        "cores": len(os.sched_getaffinity(0)), "teacher": ARGS.teacher,
        "gpu": {"name": f"H100 bf16 (assumed: {args.gpu_seq_s:,.0f} BERT-Large L 384 seq/s)",
                "flops_per_s": args.gpu_seq_s * forward_flops(SHAPES["bert-large"], 384, "qa"),
                "projection_cores": args.cores},
        "disk": {"write_bytes_per_s": disk_write, "read_bytes_per_s": disk_read,
                 "buffered_write_bytes_per_s": buffered_write},
        "host": {"cpu_s_per_byte": statistics.median(host_s), "variant": used},
        "loader": {"cpu_s_per_byte": statistics.median(loader_s), "variant": used},
        "sets": results,
        "argv": sys.argv[1:],
    }
    measured = [(name, r["bare_rows_per_s"]) for name, r in results.items() if "bare_rows_per_s" in r]
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
