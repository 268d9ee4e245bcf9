"""Compressed teacher targets (teacher_cache signals.precision) against float16, on real teacher outputs.

Fidelity: the embedded MiniLM teachers over the embedded corpora, each store built twice by the real
``teacher_cache`` path (:func:`distillpipe.teacher.cache.build_teacher_cache`) from the repository's params, once
float16 and once with every quantizable signal compressed (int8 hidden states, embeddings and attention scores, uint8
MLM top-k steps). Per signal: bytes a row on disk (after Blosc) int8 / float16; reconstruction error (cosine min and
mean, max |error| for hidden states and embeddings; KL of the softmax and top-1 agreement for attention scores, KL of
the top-k + tail distribution and top-1 agreement for the MLM); and the block loader's rows/s reading the compressed
arrays against float16, measured side by side (goal >= 0.9x).

``--students``: the effect on students, same seed and steps, float16 vs compressed caches, each run by the real stage
commands (``python -m stages.<stage>``) on params.yaml copies that differ only in ``precision``: (a) the general
distillation loss terms of the Hybrid (``train@hybrid``: MLM KD) and of MiniALBERT (``train@minialbert``: hidden
cosine, attention KL, MLM KD), per step; (b) the Hybrid fine-tuned on wiki_pairs from each (``finetune@hybrid-
wiki_pairs``), test accuracy with McNemar's test; (c) WaLDORf layer-distilled (``train@waldorf-layers``), test HasAns
span F1 with the paired bootstrap (:func:`distillpipe.evaluate.intervals.paired`, as the report).

Needs the embedded pipeline's inputs in ``--repo`` (after ``dvc repro``: data/tokens, data/prepared,
models/teacher). Usage:
    python benchmarks/compression.py [--repo .] [--rows 512] [--repeats 3] [--students] [--max-steps N]
        [--work /tmp/compression]
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import copy
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from distillpipe.config.base import build
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.evaluate.intervals import paired
from distillpipe.store.loader import BlockLoader
from distillpipe.store.quant import encode
from distillpipe.store.reader import open_store
from distillpipe.store.schema import (
    ATTN_SCORES,
    EMBEDDINGS,
    HIDDEN,
    MLM_LOGSUMEXP,
    MLM_POSITIONS,
    MLM_TOPK_LOGITS,
    UINT8_STEPS,
    array_group,
)
from distillpipe.teacher.cache import build_teacher_cache

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COMPRESSED = {"hidden": "int8", "embeddings": "int8", "attn_scores": "int8", "mlm_topk": "uint8"}
DATASETS = ("wiki", "wiki_mini", "wiki_qa")
"""The caches with quantizable signals: MLM top-k (wiki), unpooled hidden states + MLM (wiki_mini: its attention
probabilities stay float16), pooled hidden states, scores and embeddings (wiki_qa)."""


# ------------------------------------------------------------------------------------------ fidelity


def build_pair(repo: Path, params: dict, name: str, rows: int, out: Path) -> tuple[Path, Path]:
    """The float16 and the compressed store of ``name`` (its first ``rows`` evenly spaced rows)."""
    tc = params["teacher_cache"]
    raw = copy.deepcopy(tc["datasets"][name])
    raw["max_rows"] = min(rows, raw["max_rows"] or rows)
    paths = []
    for precision in ("float16", "compressed"):
        raw["signals"]["precision"] = COMPRESSED if precision == "compressed" else {k: "float16" for k in COMPRESSED}
        cfg = build(TeacherCacheDatasetConfig, raw, f"teacher_cache.datasets.{name}")
        path = out / f"{name}-{precision}.zarr"
        build_teacher_cache(name, repo / "data/tokens" / name, repo / "models/teacher" / raw["teacher"], cfg, "cpu",
                            tc["batch_size"], min(tc["shard_rows"], 256), path, cpu_threads=tc["cpu_threads"])
        paths.append(path)
    return paths[0], paths[1]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.reshape(-1, a.shape[-1]).astype(np.float64), b.reshape(-1, b.shape[-1]).astype(np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    real = na > 0  # padding positions are exact zeros in both
    return (a[real] * b[real]).sum(1) / (na[real] * nb[real])


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _kl(lp: np.ndarray, lq: np.ndarray) -> np.ndarray:
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        t = np.where(p > 0, p * (lp - lq), 0.0)
    return t.sum(-1)


def fidelity(f16: Path, q: Path) -> list[dict]:
    a, b = open_store(f16), open_store(q)
    assert a.layout == b.layout
    n = a.n_rows
    info_a = {x["name"]: x for x in a.info()["arrays"]}
    info_b = {x["name"]: x for x in b.info()["arrays"]}
    encodings = b.manifest.signals.encodings()
    others = [k for k in a.arrays if k not in encodings]
    same = all(np.array_equal(a.read([k], 0, n)[k], b.read([k], 0, n)[k]) for k in others)
    out = []
    for name, e in encodings.items():
        x, y = a.read([name], 0, n)[name], b.read([name], 0, n)[name]
        row = {"array": name, "bytes_f16": info_a[name]["bytes_per_row"], "bytes_q": info_b[name]["bytes_per_row"],
               "other_arrays_identical": same}
        group = array_group(name)
        if group in (HIDDEN, EMBEDDINGS):
            cos = _cosines(x, y)
            row |= {"cos_min": cos.min(), "cos_mean": cos.mean(),
                    "max_abs": float(np.abs(x.astype(np.float64) - y).max()),
                    "max_abs_rel": float(np.abs(x.astype(np.float64) - y).max() / np.abs(x.astype(np.float64)).max())}
        elif group == ATTN_SCORES:
            live = np.isfinite(x).any(-1)  # (n, H, Lq) query rows with a real key
            lx, ly = _log_softmax(x[live].astype(np.float64)), _log_softmax(y[live].astype(np.float64))
            kl = _kl(lx, ly)
            xl, yl = x[live].astype(np.float64), y[live].astype(np.float64)
            xa, ya = xl.argmax(-1)[..., None], yl.argmax(-1)[..., None]
            # tie-aware: the compressed top-1 key is a float16 top-1 key or the other way round (quantization merges
            # scores less than a step apart, and argmax takes the first of tied keys)
            tied = ((np.take_along_axis(xl, ya, -1)[..., 0] == xl.max(-1))
                    | (np.take_along_axis(yl, xa, -1)[..., 0] == yl.max(-1)))
            row |= {"kl_max": kl.max(), "kl_mean": kl.mean(), "top1": float((xa == ya).mean()),
                    "top1_tie_aware": float(tied.mean()),
                    "masked_exact": bool(np.array_equal(np.isneginf(x), np.isneginf(y)))}
        elif name == MLM_TOPK_LOGITS:
            ctx = a.read([MLM_POSITIONS, MLM_LOGSUMEXP], 0, n)
            used = ctx[MLM_POSITIONS] >= 0
            lse = ctx[MLM_LOGSUMEXP][used].astype(np.float64)[:, None]
            kl = _kl(_buckets(x[used], lse), _buckets(y[used], lse))
            steps = encode(UINT8_STEPS, x[used])[0]
            row |= {"kl_max": kl.max(), "kl_mean": kl.mean(),
                    "top1": float((x[used].argmax(-1) == y[used].argmax(-1)).mean()),
                    "saturated": float((steps == 255).mean())}
        out.append(row)
    return out


def _buckets(logits: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """log of the top-k + tail buckets the MLM KD compares (losses.topk_kd at T = 1)."""
    lp = logits.astype(np.float64) - lse
    tail = np.clip(1 - np.exp(lp).sum(-1, keepdims=True), 1e-30, 1)
    return np.concatenate([lp, np.log(tail)], -1)


def loader_rates(f16: Path, q: Path, repeats: int, workers: int) -> tuple[float, float]:
    """Rows/s of one epoch of the block loader over the compressed arrays (their float16 counterparts in the float16
    store), float16 store and compressed store alternately, ``workers`` DataLoader workers (0: this process, as
    training reads by default; 1: a worker process, torch single-threaded there): the median of ``repeats``."""
    names = list(open_store(q).manifest.signals.encodings())
    rates: dict[Path, list[float]] = {f16: [], q: []}
    for _ in range(repeats):
        for path in (f16, q):
            loader = BlockLoader(path, names, block_rows=64, buffer_blocks=16, seed=0, expected=None, batch_size=32,
                                 num_workers=workers)
            t, rows = time.perf_counter(), 0
            for row_index, _arrays in loader:
                rows += len(row_index)
            rates[path].append(rows / (time.perf_counter() - t))
    return float(np.median(rates[f16])), float(np.median(rates[q]))


# ------------------------------------------------------------------------------------------ students


def _run(stage: str, cwd: Path, **args: object) -> None:
    cmd = [sys.executable, "-m", f"stages.{stage}"] + [x for k, v in args.items()
                                                      for x in (f"--{k.replace('_', '-')}", str(v))]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd}:\n{proc.stderr[-3000:]}")
    print(f"  {cwd.name}: {stage} {args.get('run') or args.get('dataset')} {time.perf_counter() - t:.0f} s",
          flush=True)


def students(repo: Path, params: dict, work: Path, max_steps: int | None) -> dict:
    """Run both variants (float16, compressed) of every student and return their curves and records."""
    runs = ("hybrid", "minialbert", "waldorf-layers")
    out: dict = {}
    for variant in ("float16", "compressed"):
        d = work / variant
        p = copy.deepcopy(params)
        for item in p["teacher_cache"]["datasets"].values():  # a repository from before precision existed
            item["signals"].setdefault("precision", {k: "float16" for k in COMPRESSED})
        for name in DATASETS:
            p["teacher_cache"]["datasets"][name]["signals"]["precision"] = (
                COMPRESSED if variant == "compressed" else {k: "float16" for k in COMPRESSED})
        if max_steps:
            for r in runs:
                p["train"]["runs"][r]["optim"]["max_steps"] = max_steps
        d.mkdir(parents=True, exist_ok=True)
        (d / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
        common = {"params": d / "params.yaml"}
        for name in (*DATASETS, "wiki_pairs"):
            teacher = p["teacher_cache"]["datasets"][name]["teacher"]
            _run("teacher_cache", d, dataset=name, tokens=repo / "data/tokens" / name,
                 teacher=repo / "models/teacher" / teacher, out=d / f"data/teacher/{name}.zarr", **common)
        for r in runs:
            ds = p["train"]["runs"][r]["dataset"]
            _run("train", d, run=r, tokens=repo / "data/tokens" / ds, teacher_cache=d / f"data/teacher/{ds}.zarr",
                 prepared=repo / "data/prepared" / ds, out=d / f"models/students/{r}",
                 checkpoints=d / f"checkpoints/{r}", live=d / f"live/train/{r}", **common)
        _run("finetune", d, run="hybrid-wiki_pairs", init=d / "models/students/hybrid",
             tokens=repo / "data/tokens/wiki_pairs", teacher_cache=d / "data/teacher/wiki_pairs.zarr",
             prepared=repo / "data/prepared/wiki_pairs", out=d / "models/students/hybrid-wiki_pairs",
             checkpoints=d / "checkpoints/hybrid-wiki_pairs", live=d / "live/train/hybrid-wiki_pairs", **common)
        for r, ds, teacher in (("hybrid-wiki_pairs", "wiki_pairs", "wiki_pairs"), ("waldorf-layers", "wiki_qa",
                                                                                    "wiki_qa")):
            _run("evaluate", d, run=r, student=d / f"models/students/{r}", tokens=repo / "data/tokens" / ds,
                 prepared=repo / "data/prepared" / ds, teacher=repo / "models/teacher" / teacher,
                 out=d / f"metrics/{r}.json", predictions=d / f"predictions/{r}.json", live=d / f"live/evaluate/{r}",
                 **common)
        out[variant] = {"curves": {r: _curves(d / f"live/train/{r}") for r in runs},
                        "predictions": {r: json.loads((d / f"predictions/{r}.json").read_text())
                                        for r in ("hybrid-wiki_pairs", "waldorf-layers")}}
    return out


def _curves(live: Path) -> dict[str, np.ndarray]:
    """{loss term: per-step values} from a train stage's dvclive plots."""
    out = {}
    root = live / "plots/metrics/train"
    for f in sorted(root.rglob("*.tsv")):
        name = str(f.relative_to(root).with_suffix(""))  # e.g. hidden/0: the term of the first aligned layer
        if name in ("lr", "temperature"):
            continue
        with f.open() as fh:
            out[name] = np.array([float(r[-1]) for r in list(csv.reader(fh, delimiter="\t"))[1:]])
    return out


def print_students(res: dict, boot: dict) -> list[dict]:
    rows = []
    print("\n(a) general distillation loss terms, same seed and batches: float16 vs compressed cache")
    print(f"{'run':<16} {'term':<10} {'steps':>5} {'last-10 f16':>12} {'last-10 q':>12} {'mean diff':>11} "
          f"{'+-2 SE':>9} {'f16 noise':>10}")
    for r, curves in res["float16"]["curves"].items():
        for term, a in curves.items():
            b = res["compressed"]["curves"][r][term]
            d = b - a
            se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
            noise = np.abs(np.diff(a[-11:])).mean() if len(a) > 2 else float("nan")  # step-to-step change
            rows.append({"run": r, "term": term, "steps": len(a), "f16_last10": a[-10:].mean(),
                         "q_last10": b[-10:].mean(), "mean_diff": d.mean(), "se2": 2 * se, "noise": noise})
            print(f"{r:<16} {term:<10} {len(a):>5} {a[-10:].mean():>12.4f} {b[-10:].mean():>12.4f} "
                  f"{d.mean():>+11.5f} {2 * se:>9.5f} {noise:>10.4f}")
    print("\n(b), (c) paired tests, compressed - float16 (the report's tests: McNemar for accuracy, paired bootstrap "
          "otherwise)")
    for r, metric in (("hybrid-wiki_pairs", "accuracy"), ("waldorf-layers", "HasAns_span_f1")):
        pa, pb = res["compressed"]["predictions"][r], res["float16"]["predictions"][r]
        for split in ("dev", "test"):
            ra, rb = pa["student"].get(split), pb["student"].get(split)
            if not ra or not rb:
                continue
            t = paired(metric, pa["task_type"], ra, rb, n_resamples=boot["n_resamples"],
                       confidence=boot["confidence"], seed=boot["seed"], key=f"compression/{r}/{split}/{metric}")
            d = t.difference
            print(f"{r:<18} {split:<5} {metric:<15} diff {d.value:+.4f} [{d.low:+.4f}, {d.high:+.4f}] "
                  f"{t.test} p={t.p_value:.3f} n={t.n}")
            rows.append({"run": r, "split": split, "metric": metric, "diff": d.value, "low": d.low, "high": d.high,
                         "test": t.test, "p": t.p_value, "n": t.n})
    return rows


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT, help="a repository after `dvc repro` (its data and models)")
    ap.add_argument("--rows", type=int, default=512, help="rows of each fidelity store (at most the params' max_rows)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--students", action="store_true", help="also train the students on both caches (minutes)")
    ap.add_argument("--no-fidelity", action="store_true", help="skip the fidelity and loader part")
    ap.add_argument("--max-steps", type=int, default=None, help="override the general-distillation runs' max_steps")
    ap.add_argument("--work", type=Path, default=None, help="folder for the students' runs (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = ap.parse_args()
    repo = args.repo.resolve()
    missing = [d for d in ("data/tokens", "data/prepared", "models/teacher") if not (repo / d).is_dir()]
    if missing:
        raise SystemExit(f"{repo} lacks {missing}: run `make repro` there first (or pass --repo a repository that has)")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    print(f"compressed precisions {COMPRESSED} vs float16; repo {repo}; {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}. Ratios are measured side by side in this run.", flush=True)
    result: dict = {"fidelity": [], "loader": []}
    with tempfile.TemporaryDirectory(prefix="compression-") as tmp:
        tmp = Path(tmp)
        measured = () if args.no_fidelity else DATASETS
        if measured:
            print(f"\n{'array':<18} {'B/row f16':>10} {'B/row q':>9} {'ratio':>6}  fidelity")
        for name in measured:
            f16, q = build_pair(repo, params, name, args.rows, tmp)
            for row in fidelity(f16, q):
                row["dataset"] = name
                result["fidelity"].append(row)
                extra = "  ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                                  if k not in ("array", "bytes_f16", "bytes_q", "dataset"))
                print(f"{name + ':' + row['array']:<18} {row['bytes_f16']:>10,.0f} {row['bytes_q']:>9,.0f} "
                      f"{row['bytes_q'] / row['bytes_f16']:>6.3f}  {extra}")
            a, b = open_store(f16).info(), open_store(q).info()
            print(f"{name + ': store':<18} {a['bytes_per_row']:>10,.0f} {b['bytes_per_row']:>9,.0f} "
                  f"{b['bytes_per_row'] / a['bytes_per_row']:>6.3f}  (every array, {a['n_rows']} rows)")
            for workers in (0, 1):
                r16, rq = loader_rates(f16, q, args.repeats, workers)
                result["loader"].append({"dataset": name, "workers": workers, "f16_rows_s": r16, "q_rows_s": rq,
                                         "ratio": rq / r16})
                print(f"{name + ': loader':<18} {r16:>10,.0f} {rq:>9,.0f} {rq / r16:>6.2f}x  rows/s of the "
                      f"compressed arrays, float16 vs compressed, {workers} DataLoader workers (goal >= 0.9x)")
            for p in (f16, q):
                shutil.rmtree(p)
    if args.students:
        work = args.work or Path(tempfile.mkdtemp(prefix="compression-students-"))
        res = students(repo, params, work, args.max_steps)
        result["students"] = print_students(res, params["report"]["bootstrap"])
        if args.work is None:
            shutil.rmtree(work)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
