"""``distillpipe plan``: what the teacher caches of params.yaml will take (rows, bytes, files, memory, time),
before anything runs. Reads only; not a DVC stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from distillpipe.commands.base import ParamsOpt, user_errors
from distillpipe.store.schema import MLM
from distillpipe.teacher.bench import BENCH_HINT
from distillpipe.teacher.estimate import COMPRESSION, fmt_bytes
from distillpipe.teacher.plan import WEIGHT_BYTES, ItemPlan, Plan, plan_caches

BenchOpt = Annotated[Path, typer.Option("--bench", help="benchmark JSON of this machine (benchmarks/at_scale.py)")]


@user_errors
def plan(params: ParamsOpt = Path("params.yaml"),
         bench: BenchOpt = Path("benchmarks/results/at_scale.json"),
         as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False) -> None:
    """Plan the teacher caches: rows, signal arrays, bytes (uncompressed and estimated on disk), files, memory per
    worker and time (from the benchmark JSON), for every teacher_cache.datasets item. Run from the repository root:
    it reads data/tokens, data/prepared and models/teacher where they exist."""
    p = plan_caches(params, Path("."), bench)
    typer.echo(json.dumps(p.to_dict(), indent=1, default=float) if as_json else format_plan(p))


def format_plan(p: Plan) -> str:
    """The plan as a fixed-width table (one row per item, then totals), each item's details, the formulas."""
    timed = p.bench is not None
    head = ["item", "rows", "from", "bytes/row", "uncompressed", "~on disk", "shards", "files", "mem/worker"]
    if timed:
        head += ["time here", "bound", "time GPU", "bound"]
    table = [head]
    for i in p.items:
        files = i.files
        row = [i.name, _num(i.rows.n), i.rows.how, fmt_bytes(i.row_bytes), fmt_bytes(i.nbytes), fmt_bytes(i.est_bytes),
               _num(i.n_shards), _num(files and files["total"]), fmt_bytes(i.memory_bytes)]
        if timed:
            for where in ("here", "gpu"):
                r = i.rates.get(where)
                row += [_duration(r and r["seconds"]), r["bound"] if r else "?"]
        table.append(row)
    files = [i.files for i in p.items]
    total = ["total", _num(p.total_rows), "", "", fmt_bytes(p.total("nbytes")), fmt_bytes(p.total("est_bytes")),
             _num(p.total("n_shards")), _num(None if None in files else sum(f["total"] for f in files)), ""]
    if timed:
        total += [_duration(p.seconds("here")), "", _duration(p.seconds("gpu")), ""]
    table.append(total)
    lines = _columns(table)
    lines.insert(-1, "-" * len(lines[0]))
    lines.append(f"disk: {fmt_bytes(p.disk_free)} free on {p.disk_path}" +
                 (f" (+ {fmt_bytes(p.existing_bytes)} of stores already there)" if p.existing_bytes else ""))
    for w in p.warnings:
        lines.append(f"WARNING: {w}")
    lines += _runs(p)
    lines.append("")
    for i in p.items:
        lines += _details(i)
    lines += ["", *_formulas(p)]
    return "\n".join(lines)


def _runs(p: Plan) -> list[str]:
    """The student runs that read the items' targets: where from now, the teacher's share of a step from either
    source here and on the GPU box, and the faster one there."""
    if not p.runs:
        return []
    table = [["run", "dataset", "teacher", "step here: cache", "live", "step GPU: cache", "live", "faster on GPU"]]
    for r in p.runs:
        row = [f"{r.section}.{r.name}", r.dataset, "live" if r.live else "cache"]
        for where in ("here", "gpu"):
            row += [_duration(r.step_seconds(where, "cache")), _duration(r.step_seconds(where, "live"))]
        row.append(r.faster("gpu") or "?")
        table.append(row)
    lines = _columns(table)
    return ["", "student runs: the teacher's share of a step (a batch of targets) from the cache or run live "
            "(switch a run: dvc exp run -S '<section>.runs.<run>.teacher=...', docs/students.md)", *lines]


def _details(i: ItemPlan) -> list[str]:
    out = [f"{i.name} (teacher {i.teacher}): {i.rows.note}"]
    if i.spec is not None:
        s = i.spec
        out.append(f"  spec: L {s.max_seq_len}, pool {s.pool}, task {s.task}, d {s.hidden_size}, H {s.n_heads}, "
                   f"V {s.vocab_size}" + (f", C {s.n_classes}" if s.n_classes else "") +
                   (f", top-{s.mlm_topk} at M {s.mlm_max_masked}" if s.mlm_topk else "") +
                   f"; {_num(i.teacher_params)} teacher parameters")
        out.append("  bytes a row: " + ", ".join(f"{g} {fmt_bytes(b)}" for g, b in i.group_row_bytes.items()))
        if s.hidden_rank or s.attn_rank or s.embedding_size:
            out.append("  compact: " + "; ".join(
                [f"hidden states as {s.hidden_rank} of {s.hidden_size} principal coordinates"] * bool(s.hidden_rank)
                + [f"attention maps as rank-{s.attn_rank} factors per head"] * bool(s.attn_rank)
                + ["the embedding output derived from the teacher's tables"] * bool(s.embedding_size)))
        if i.constants:
            out.append(f"  constants (once a store): {fmt_bytes(sum(i.constants.values()))} in {len(i.constants)} "
                       "arrays")
        for layer, fit in (i.fit or {}).items():
            out.append(f"  fit of hidden/{layer} (built store): the top {fit['rank']} components keep "
                       f"{100 * fit['variance_kept']:.1f}% of the variance; kept at r = " + ", ".join(
                           f"{r}: {100 * v:.1f}%"
                           for r, v in sorted(fit["spectrum"].items(), key=lambda kv: int(kv[0]))))
        files = i.files
        if files:
            out.append(f"  files: {files['data']:,} data (at most) + {files['markers']:,} markers + "
                       f"{files['metadata']:,} zarr.json = {files['total']:,}")
        r = i.reading
        if r is not None:
            out.append(f"  a student's epoch on the GPU box: {r['cached_rows_per_s']:,.0f} rows/s from this cache on "
                       f"this disk ({r['cached_bound']}-bound, {r['cached_vs_live']:.2f}x the live teacher's "
                       f"{r['live_rows_per_s']:,.0f}), {r['nvme_rows_per_s']:,.0f} rows/s from a 3 GB/s NVMe "
                       f"({r['nvme_vs_live']:.2f}x)")
        if i.flops_per_row is not None:
            line = f"  {i.flops_per_row / 1e9:,.2f} GFLOP a row"
            for where, r in i.rates.items():
                line += f"; {where} {r['rows_per_s']:,.0f} rows/s ({r['bound']}-bound: " + ", ".join(
                    f"{k} {v:,.0f}" for k, v in r["limits"].items()) + ")"
            out.append(line)
    out += [f"  note: {n}" for n in i.notes] + [f"  PROBLEM: {n}" for n in i.problems]
    return out


def _formulas(p: Plan) -> list[str]:
    out = [
        "uncompressed = rows x bytes a row (exact, from the store's array layout); ~on disk = the bytes of the real "
        "values (padding and unused MLM slots compress to ~0, float16 activations barely compress; MLM top-k x "
        f"{COMPRESSION[MLM]}, measured): an estimate",
        f"mem/worker = 2 x min(shard_rows, rows) x bytes a row (a shard held twice while written) + {WEIGHT_BYTES} B x "
        "teacher parameters (fp32)",
    ]
    b = p.bench
    if b is None:
        out.append(f"time: no benchmark JSON ({BENCH_HINT})")
        return out
    out.append("rows/s = min(FLOP/s / FLOPs a row, cores / (host CPU s a byte x bytes a row), "
               "disk write bytes/s / bytes on disk a row)")
    out.append(f"benchmark {b.path} of {b.date}: here = {b.device_name} ({b.device}, {b.cores} cores, "
               f"{b.forward_flops_per_s:.3g} FLOP/s measured on {b.forward_measured_on}); GPU = {b.gpu_name} "
               f"({b.gpu_flops_per_s:.3g} FLOP/s, {b.projection_cores} cores); "
               f"disk {fmt_bytes(b.disk_write_bytes_per_s)}/s, host {b.host_cpu_s_per_byte:.3g} CPU s a byte")
    return out


def _columns(table: list[list[str]]) -> list[str]:
    """Fixed-width columns: names and words left, numbers right."""
    widths = [max(len(r[c]) for r in table) for c in range(len(table[0]))]
    left = {c for c, name in enumerate(table[0]) if c in (0, 2) or name in ("bound", "dataset", "faster on GPU")}
    return ["  ".join(cell.ljust(w) if c in left else cell.rjust(w) for c, (cell, w) in enumerate(zip(r, widths)))
            .rstrip() for r in table]


def _num(n: Any) -> str:
    return "?" if n is None else f"{n:,}"


def _duration(s: float | None) -> str:
    if s is None:
        return "?"
    for unit, scale in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if s >= scale:
            return f"{s / scale:,.1f} {unit}"
    return f"{s * 1e3:,.1f} ms"
