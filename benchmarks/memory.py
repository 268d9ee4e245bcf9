"""Memory benchmark: peak RSS of a teacher_cache build, a student training run and the block loader at 1x and
10x the rows with the same shard size (goal: flat in rows), and what grows with shard_rows and the loader's window.

Each configuration runs in a fresh subprocess of this script, which samples its own /proc/self/status every
2 ms from a thread (RssAnon: heap, torch and numpy buffers; VmRSS) and reads the kernel's exact VmHWM at the end
(it also counts the pages of the memory-mapped tokens file read so far, which the kernel drops under pressure).
The baseline is the RSS just before the stage's function is called: after the imports and, for the build, after
the teacher is loaded (the build reuses that teacher). Growth = peak - baseline; the ratio of the 10x growth to
the 1x growth is the figure that should stay ~1.0.

Configurations: the build in this process (cluster inprocess) with glibc's default malloc and with a fixed mmap
threshold (FIXED_MMAP: what the code holds, without the freed memory glibc keeps), and with 2x shard_rows; one
epoch of a student, and with its teacher live (the replica each training process then holds); one epoch of the
block loader alone over every array, and with 2x buffer_blocks.
Prints the table, the 10x/1x ratios with the bytes per added row, the shard and window terms and the peak per
tenth of the long runs (a plateau or a ramp). Writes benchmarks/results/memory.json.

Usage: python benchmarks/memory.py [--rows 1024] [--factor 10] [--shard-rows 128] [--quick]   (~5 min on 2 cores)
The teacher is a random BERT (hidden 256, 2 layers, 4 heads, MLM head over a 1,029-token vocabulary) at
L 128; its cache holds the hidden states and attention scores of both layers (pool 1) and the MLM top-8:
385 KiB a row before compression. The student is the tests' smallest CMOW/CBOW-Hybrid (d 4), trained one epoch
on hard + hidden + mlm_kd (batch 32, blocks of 64 rows, windows of 2 blocks).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

L, VOCAB_WORDS, HIDDEN, LAYERS, HEADS = 128, 1024, 256, 2, 4
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SIGNALS = {"logits": False, "mlm_topk": 8, "hidden_layers": [1, 2], "attn_layers": [1, 2], "pool": 1,
           "attn_probs": False, "embeddings": False, "hidden_rank": None, "hidden_fit_rows": 256, "attn_rank": None,
           "precision": {"hidden": "float16", "attention": "float16", "mlm_topk": "float16"}}
BATCH = 32
TOLERANCE = 0.15
"""The anonymous-RSS growth at 10x within 1 +- this of the growth at 1x, or within SLACK_MIB of it, counts as flat:
glibc arenas, torch's allocator and the 2 ms sampling move a peak by a few MiB from run to run."""
SLACK_MIB = 8.0
MIB = 2**20


# --------------------------------------------------------------------------------------------
# inputs (made once by the parent)
# --------------------------------------------------------------------------------------------


def make_teacher(folder: Path) -> Path:
    """A random BERT with an MLM head and a WordPiece tokenizer, in save_pretrained layout."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    folder.mkdir(parents=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + [f"w{i}" for i in range(VOCAB_WORDS)]) + "\n")
    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(folder)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(SPECIAL) + VOCAB_WORDS, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                     num_attention_heads=HEADS, intermediate_size=4 * HIDDEN, max_position_embeddings=L)
    BertForMaskedLM(cfg).save_pretrained(folder)
    return folder


def make_tokens(folder: Path, teacher: Path, n: int, n_dev: int = 64, seed: int = 0) -> Path:
    """MLM rows in the tokenize stage's format (64..128 tokens, ~15% statically masked), ``n`` train and
    ``n_dev`` dev rows, built column-wise in Arrow (no Python list per row, so 10x rows stay quick)."""
    import pyarrow as pa
    from datasets import Dataset, DatasetDict

    from distillpipe.assets import tokenizer_sha256
    from distillpipe.data.schema import write_meta

    rng = np.random.default_rng(seed)

    def split(k: int) -> Dataset:
        lengths = rng.integers(64, L + 1, size=k).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        ids = rng.integers(len(SPECIAL), len(SPECIAL) + VOCAB_WORDS, size=int(offsets[-1])).astype(np.int32)
        ids[offsets[:-1]], ids[offsets[1:] - 1] = 2, 3  # [CLS] ... [SEP]
        n_masked = np.maximum(1, (lengths - 2) * 15 // 100).astype(np.int32)
        m_offsets = np.concatenate([[0], np.cumsum(n_masked)]).astype(np.int32)
        # masked positions: the first n_masked of a few evenly spread slots, shifted per row (sorted, inside the row)
        row = np.repeat(np.arange(k), n_masked)
        j = np.arange(int(m_offsets[-1])) - m_offsets[row]
        pos = (1 + j * ((lengths[row] - 2) // n_masked[row]) + rng.integers(0, 2, size=len(row))).astype(np.int32)
        pos = np.minimum(pos, lengths[row] - 2)
        labels = ids[offsets[row] + pos].copy()
        ids[offsets[row] + pos] = 4  # [MASK]
        table = pa.table({
            "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
            "token_type_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(len(ids), np.int8))),
            "length": pa.array(lengths),
            "block_id": pa.array(np.arange(k, dtype=np.int64)),
            "view": pa.array(np.zeros(k, np.int32)),
            "masked_positions": pa.ListArray.from_arrays(pa.array(m_offsets), pa.array(pos)),
            "masked_labels": pa.ListArray.from_arrays(pa.array(m_offsets), pa.array(labels)),
        })  # fmt: skip
        return Dataset(table)

    DatasetDict({"train": split(n), "dev": split(n_dev)}).save_to_disk(str(folder))
    write_meta(folder, {"name": "bench", "task_type": "corpus", "kind": "mlm", "fingerprint": f"memory-{n}-{seed}",
                        "num_labels": 0, "label_names": None, "max_seq_len": L, "params": {}, "summary": {},
                        "tokenizer": {"spec": str(teacher), "sha256": tokenizer_sha256(teacher), "pad_id": 0,
                                      "cls_id": 2, "sep_id": 3, "mask_id": 4,
                                      "vocab_size": len(SPECIAL) + VOCAB_WORDS}})
    return folder


# --------------------------------------------------------------------------------------------
# the child: one configuration, measured in its own process
# --------------------------------------------------------------------------------------------


def _status() -> dict[str, int]:
    """Bytes of VmRSS, RssAnon, RssFile and VmHWM of this process."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


class Sampler:
    """Peak RssAnon and VmRSS of this process, sampled every ``interval`` s by a thread, and the peak RssAnon per
    time bin (a bounded profile: when it holds ``max_bins`` bins, neighbours merge and bins get twice as wide, so
    the sampler itself does not grow with the run's length)."""

    def __init__(self, interval: float = 0.002, max_bins: int = 256):
        self.interval, self.max_bins, self.peak_anon, self.peak_rss = interval, max_bins, 0, 0
        self.bin_seconds, self.bins = 0.05, np.zeros(max_bins, dtype=np.int64)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            s = _status()
            self.peak_anon, self.peak_rss = max(self.peak_anon, s["RssAnon"]), max(self.peak_rss, s["VmRSS"])
            k = int((time.perf_counter() - t0) / self.bin_seconds)
            while k >= self.max_bins:
                merged = self.bins.reshape(-1, 2).max(axis=1)
                self.bins = np.concatenate([merged, np.zeros_like(merged)])
                self.bin_seconds *= 2
                k //= 2
            self.bins[k] = max(self.bins[k], s["RssAnon"])
            time.sleep(self.interval)

    def profile(self, seconds: float, n: int = 10) -> list[int]:
        """The peak RssAnon in each n-th of a run of ``seconds`` (approximately: whole bins)."""
        used = self.bins[: max(1, min(self.max_bins, int(np.ceil(seconds / self.bin_seconds))))]
        return [int(p.max()) if p.size else 0 for p in np.array_split(used, n)]

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _build_cfg():
    from distillpipe.config.base import build
    from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig

    return build(TeacherCacheDatasetConfig, {"teacher": "bench", "head": "mlm", "split": "train", "max_rows": None,
                                             "signals": SIGNALS}, "bench")


def child_build(a: argparse.Namespace) -> None:
    """A teacher_cache build, in this process (cluster inprocess), after loading the teacher the build reuses."""
    import torch

    from distillpipe.teacher.cache import ShardJob, build_teacher_cache, producer_code, teacher_facts

    torch.set_num_threads(a.threads)
    cfg = _build_cfg()
    job = ShardJob(store=str(Path(a.store).resolve()), tokens_dir=str(Path(a.tokens).resolve()), split="train",
                   teacher_dir=str(Path(a.teacher).resolve()), head="mlm", device="cpu", batch_size=BATCH,
                   cpu_threads=a.threads, pad_id=0, code=producer_code())
    teacher_facts(job)  # loads the teacher and opens the tokens; build_teacher_cache finds them loaded
    measure(lambda: build_teacher_cache("bench", a.tokens, a.teacher, cfg, "cpu", BATCH, a.shard_rows, a.store,
                                        cpu_threads=a.threads))


def child_train(a: argparse.Namespace) -> None:
    """One epoch of the smallest student the tests train (CMOW/CBOW-Hybrid, d 4) on hard + hidden + mlm_kd."""
    import torch

    from distillpipe.config.base import build
    from distillpipe.config.run import LoaderConfig
    from distillpipe.config.train import TrainRunConfig
    from distillpipe.train.loop import train_student

    torch.set_num_threads(a.threads)
    run = build(TrainRunConfig, {
        "dataset": "bench", "encoding": "joint", "head": None, "note": "memory benchmark",
        "teacher": "data/teacher/bench.zarr", "mlm_views": "static",
        "model": {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 4, "d_vec": 16,
                  "init_std": 0.01, "embedding_init": "random", "dropout": 0.0},
        "objective": {"loss_weights": {"hard": 1.0, "hidden": 1.0, "mlm_kd": 1.0}, "hidden_loss": "cosine",
                      "layer_map": [2], "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0,
                                                     "temperature": 1.0, "temperature_decay": False}},
        "optim": {"epochs": 1, "max_steps": None, "batch_size": BATCH, "lr": 1e-3, "weight_decay": 0.0,
                  "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
    }, "bench")  # fmt: skip
    loader = build(LoaderConfig, {"block_rows": a.block_rows, "buffer_blocks": 2, "streams": 1}, "loader")
    out = Path(a.work)
    source = a.store
    if a.live_teacher:  # the run's teacher live: what each training process holds besides the student
        from distillpipe.teacher.live import LiveSettings

        source = LiveSettings("bench", Path(a.teacher), _build_cfg(), BATCH, a.shard_rows, a.threads)
    measure(lambda: train_student("bench", model_cfg=run.model, run=run, loader_cfg=loader, device="cpu",
                                  tokens_dir=a.tokens, store_path=source, prepared_dir=None, out_dir=out / "student",
                                  ckpt_dir=out / "ckpt", live_dir=out / "live"))


def child_loader(a: argparse.Namespace) -> None:
    """One epoch of the block loader alone over every array of the store."""
    from distillpipe.store.loader import BlockLoader
    from distillpipe.store.reader import open_store

    names = [n for n in open_store(a.store).arrays if n != "row_index"]

    def epoch() -> int:
        loader = BlockLoader(a.store, names, block_rows=a.block_rows, buffer_blocks=a.buffer_blocks, seed=0,
                             expected=None, batch_size=BATCH)
        return sum(len(rows) for rows, _ in loader)

    measure(epoch)


def measure(fn) -> None:
    """Run ``fn`` under the sampler and print this process's numbers as one JSON line."""
    base = _status()
    t, cpu = time.perf_counter(), _cpu_seconds()
    with Sampler() as s:
        fn()
    seconds, cpu = time.perf_counter() - t, _cpu_seconds() - cpu
    end = _status()
    print(json.dumps({"baseline_rss": base["VmRSS"], "baseline_anon": base["RssAnon"], "peak_anon": s.peak_anon,
                      "peak_rss": max(end["VmHWM"], s.peak_rss), "end_file": end["RssFile"], "seconds": seconds,
                      "cpu_seconds": cpu,
                      "profile_anon": s.profile(seconds)}))


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


CHILDREN = {"build": child_build, "train": child_train, "loader": child_loader}


# --------------------------------------------------------------------------------------------
# the parent
# --------------------------------------------------------------------------------------------


FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}
"""glibc with a fixed mmap threshold: every allocation of 1 MiB or more is its own mapping, returned at free. By
default glibc raises the threshold up to 32 MiB as large blocks are freed, then serves them from its heaps, which
keep freed memory: the RSS then holds what the code holds plus what the allocator kept."""


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    child: str
    factor: int = 1
    """Rows: the 1x rows times this."""
    shard: int = 1
    """shard_rows: the base shard rows times this."""
    window: int = 1
    """buffer_blocks: the base (2) times this."""
    env: tuple[tuple[str, str], ...] = ()
    live_teacher: bool = False
    """A training run with its teacher live (no store read): the teacher's replica in the process."""


def configs(factor: int) -> list[Config]:
    fixed = tuple(FIXED_MMAP.items())
    return [
        Config("build", "teacher_cache build", "build"),
        Config("build", "teacher_cache build", "build", factor=factor),
        Config("build_fixed", "  same, fixed mmap threshold", "build", env=fixed),
        Config("build_fixed", "  same, fixed mmap threshold", "build", factor=factor, env=fixed),
        Config("build_fixed_shard", "  same, 2x shard_rows", "build", shard=2, env=fixed),
        Config("train", "student training, 1 epoch", "train"),
        Config("train", "student training, 1 epoch", "train", factor=factor),
        Config("train_live", "  same, teacher live", "train", live_teacher=True),
        Config("train_live", "  same, teacher live", "train", factor=factor, live_teacher=True),
        Config("loader", "block loader alone, 1 epoch", "loader"),
        Config("loader", "block loader alone, 1 epoch", "loader", factor=factor),
        Config("loader_window", "  same, 2x buffer_blocks", "loader", window=2),
    ]  # fmt: skip


def run_child(c: Config, **kw) -> dict:
    cmd = [sys.executable, __file__, "--child", c.child] + [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1", **dict(c.env)},
                       check=False)
    if p.returncode:
        raise RuntimeError(f"{c.label} child failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1024, help="rows at 1x")
    ap.add_argument("--factor", type=int, default=10)
    ap.add_argument("--shard-rows", type=int, default=128)
    ap.add_argument("--block-rows", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each child (more compete with the writer)")
    ap.add_argument("--quick", action="store_true", help="256 rows at 1x: a smoke run")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "memory.json"))
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    for name in ("tokens", "teacher", "store", "work"):
        ap.add_argument(f"--{name}", help=argparse.SUPPRESS)
    ap.add_argument("--buffer-blocks", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--live-teacher", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        CHILDREN[a.child](a)
        return
    if a.quick:
        a.rows = 256
    import torch

    device = f"CPU, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable)"
    print(f"device {device}, torch {torch.__version__}, {a.threads} torch thread(s) per child; rows {a.rows:,} and "
          f"{a.rows * a.factor:,}, shards of {a.shard_rows}, blocks of {a.block_rows}, windows of 2 blocks, batch "
          f"{BATCH}{', QUICK (smoke run: numbers mean little)' if a.quick else ''}")
    print(f"Each configuration runs in a fresh process; load average {os.getloadavg()[0]:.1f} (memory does not "
          "depend on it, the seconds do).")
    results = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        teacher = make_teacher(tmp / "teacher")
        tokens = {n: make_tokens(tmp / f"tokens{n}", teacher, n) for n in (a.rows, a.rows * a.factor)}
        row_bytes = None
        for i, c in enumerate(configs(a.factor)):
            n = a.rows * c.factor
            store = tmp / f"s{n}.zarr"  # the first (glibc default) build of n rows; training and loaders read it
            kw = {"tokens": tokens[n], "teacher": teacher, "shard_rows": a.shard_rows * c.shard,
                  "block_rows": a.block_rows, "buffer_blocks": 2 * c.window, "threads": a.threads,
                  "store": tmp / f"c{i}.zarr" if c.child == "build" and store.exists() else store}
            if c.child == "train":
                kw["work"] = tmp / f"train{i}"
                kw["live_teacher"] = int(c.live_teacher)
            r = run_child(c, **kw)
            results.append({"key": c.key, "label": c.label, "rows": n, "shard_rows": kw["shard_rows"],
                            "buffer_blocks": kw["buffer_blocks"], "env": dict(c.env), **r})
            print(f"  {c.label.strip():<32} {n:>7,} rows: peak anon {r['peak_anon'] / MIB:7.1f} MiB, "
                  f"{r['seconds']:6.1f} s", flush=True)
            if row_bytes is None:
                from distillpipe.store.reader import open_store

                row_bytes = open_store(store).info()["bytes_per_row_raw"]
        teacher_bytes = _teacher_bytes(teacher)
    report(results, a, device, row_bytes, time.perf_counter() - t0, teacher_bytes)


def _teacher_bytes(folder: Path) -> int:
    """fp32 bytes of the teacher's weights (its parameters, the tied decoder once)."""
    from transformers import BertForMaskedLM

    return 4 * sum(p.numel() for p in BertForMaskedLM.from_pretrained(folder).parameters())


def _growth(r: dict, kind: str) -> int:
    return r[f"peak_{kind}"] - r["baseline_anon" if kind == "anon" else "baseline_rss"]


def report(results: list[dict], a: argparse.Namespace, device: str, row_bytes: int, seconds: float,
           teacher_bytes: int) -> None:
    print(f"\n{'configuration':<32} {'rows':>7} {'shard':>6} {'baseline':>9} {'peak anon':>10} {'peak RSS':>9} "
          f"{'anon growth':>12} {'RSS growth':>11} {'s':>6}")
    for r in results:
        print(f"{r['label']:<32} {r['rows']:>7,} {r['shard_rows']:>6} {r['baseline_rss'] / MIB:>9.1f} "
              f"{r['peak_anon'] / MIB:>10.1f} {r['peak_rss'] / MIB:>9.1f} {_growth(r, 'anon') / MIB:>12.1f} "
              f"{_growth(r, 'rss') / MIB:>11.1f} {r['seconds']:>6.1f}")
    print("(MiB; baseline: VmRSS after the imports, and for the build the teacher, before the stage's function runs;"
          " anon = RssAnon, heap and torch/numpy buffers, sampled every 2 ms; RSS = VmHWM, which also counts the pages"
          " of the memory-mapped tokens file read so far, the kernel's to drop)")
    summary: dict[str, dict] = {}
    print(f"\nflat in rows? growth at {a.factor}x / growth at 1x (goal 1.00 +- {TOLERANCE:.2f}, or within "
          f"{SLACK_MIB:.0f} MiB):")
    for key in dict.fromkeys(r["key"] for r in results):
        pair = [r for r in results if r["key"] == key]
        if len(pair) != 2 or pair[0]["rows"] == pair[1]["rows"]:
            continue
        lo, hi = pair
        added = hi["rows"] - lo["rows"]
        out = {}
        for kind in ("anon", "rss"):
            g_lo, g_hi = _growth(lo, kind), _growth(hi, kind)
            out[kind] = {"ratio": g_hi / g_lo, "bytes_per_added_row": (g_hi - g_lo) / added}
        diff = _growth(hi, "anon") - _growth(lo, "anon")
        out["flat"] = abs(out["anon"]["ratio"] - 1) <= TOLERANCE or abs(diff) <= SLACK_MIB * MIB
        summary[key] = out
        print(f"  {lo['label'].strip():<32} anon {out['anon']['ratio']:.2f} ({out['anon']['bytes_per_added_row']:+,.0f}"
              f" B per added row), RSS {out['rss']['ratio']:.2f} ({out['rss']['bytes_per_added_row']:+,.0f} B per "
              f"added row): {'flat' if out['flat'] else 'NOT flat'}")
    by_key = {r["key"]: r for r in results if r["rows"] == a.rows}
    shard = (_growth(by_key["build_fixed_shard"], "anon") - _growth(by_key["build_fixed"], "anon")) / a.shard_rows
    window = (_growth(by_key["loader_window"], "anon") - _growth(by_key["loader"], "anon")) / (2 * a.block_rows)
    summary["per_shard_row"] = {"bytes": shard, "stored_row_bytes": row_bytes, "copies": shard / row_bytes}
    summary["per_window_row"] = {"bytes": window, "stored_row_bytes": row_bytes, "copies": window / row_bytes}
    print(f"\nwhat grows with shard_rows (fixed mmap threshold): {shard / 1024:,.0f} KiB per shard row = "
          f"{shard / row_bytes:.1f} x the stored row ({row_bytes / 1024:,.0f} KiB, float16 before compression)")
    print(f"what grows with the loader's window (buffer_blocks x block_rows, every array read): {window / 1024:,.0f} "
          f"KiB per window row = {window / row_bytes:.1f} x the stored row")
    live = (_growth(by_key["train_live"], "anon") - _growth(by_key["train"], "anon"))
    summary["live_teacher"] = {"bytes": live, "teacher_fp32_bytes": teacher_bytes}
    print(f"what a live teacher adds to a training process (its replica: each DDP process holds one): "
          f"{live / MIB:,.1f} MiB, against {teacher_bytes / MIB:,.1f} MiB of fp32 teacher weights")
    for r in results:
        if r["key"] in ("build", "build_fixed", "train") and r["rows"] > a.rows:
            print(f"peak anon per tenth of the run, {r['label'].strip()} at {r['rows']:,} rows (MiB): "
                  + " ".join(f"{p / MIB:.0f}" for p in r["profile_anon"]))
    print(f"whole run {seconds:.0f} s")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "date": datetime.date.today().isoformat(), "device": device, "rows": [a.rows, a.rows * a.factor],
        "shard_rows": a.shard_rows, "block_rows": a.block_rows, "batch_size": BATCH, "threads": a.threads,
        "quick": a.quick, "tolerance": TOLERANCE, "slack_mib": SLACK_MIB, "results": results, "summary": summary,
    }, indent=2) + "\n")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
