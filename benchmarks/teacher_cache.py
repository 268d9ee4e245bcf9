"""Teacher-cache benchmark: ratios measured side by side in one run (machines are noisy).

Prints
  1. cache rows/s (the whole stage path: capture + pooling + host copy + Zarr write, writes
     overlapped with compute) vs a bare teacher forward on the same length-bucketed batches
     (goal >= 0.90 on CPU);
  2. bytes per row on disk vs a naive fp32 store of every layer's hidden states, every layer's
     attention probabilities and full-vocabulary logits at every position (goal >= 50x smaller);
  3. block-loader rows/s vs random single-row reads of the same store.

Usage: python benchmarks/teacher_cache.py [--rows 1024] [--shard-rows 256] [--repeats 3] [--device auto]
The teacher is the embedded MiniLM-L6 (offline); signals are WaLDORf-like: hidden and attention
scores of layers 2, 4, 6, pooled 4x.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from distillpipe.assets import resolve_model, tokenizer_sha256
from distillpipe.config.base import build
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.data.schema import write_meta
from distillpipe.runtime import autocast, resolve_device
from distillpipe.store.loader import BlockLoader
from distillpipe.store.reader import open_store
from distillpipe.teacher.batching import collate, length_buckets
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.teacher.load import load_teacher

SIGNALS = {"logits": False, "mlm_topk": 0, "hidden_layers": [2, 4, 6], "attn_layers": [2, 4, 6], "pool": 4,
           "attn_probs": False, "embeddings": False, "hidden_rank": None, "hidden_fit_rows": 256, "attn_rank": None,
           "precision": {"hidden": "float16", "attention": "float16", "mlm_topk": "float16"}}
L = 128


def make_tokens(folder: Path, model_dir: Path, n: int, seed: int = 0) -> Path:
    """Rows of real-looking length variety (64..128 tokens) from the teacher's vocabulary."""
    from datasets import Dataset, DatasetDict

    rng = np.random.default_rng(seed)
    lengths = rng.integers(64, L + 1, size=n)
    ids = [[101] + rng.integers(1000, 29000, size=k - 2).tolist() + [102] for k in lengths]
    DatasetDict({"train": Dataset.from_dict({"input_ids": ids, "token_type_ids": [[0] * k for k in lengths],
                                             "length": lengths.tolist()})}).save_to_disk(str(folder))
    write_meta(folder, {"name": "bench", "task_type": "corpus", "kind": "mlm", "fingerprint": f"bench-{n}-{seed}",
                        "num_labels": 0, "label_names": None, "max_seq_len": L, "params": {}, "summary": {},
                        "tokenizer": {"spec": "embedded:minilm-l6", "sha256": tokenizer_sha256(model_dir),
                                      "pad_id": 0, "cls_id": 101, "sep_id": 102, "mask_id": 103, "vocab_size": 30522}})
    return folder


@torch.inference_mode()
def bare_forward(model, rows, batch_size: int, device, shard_rows: int) -> float:
    """The teacher alone on exactly the cache's batches: length-bucketed within each shard."""
    batches = [rows.select(range(s, min(s + shard_rows, len(rows))))[idx]
               for s in range(0, len(rows), shard_rows)
               for idx in length_buckets(rows["length"][s:s + shard_rows], batch_size)]
    t = time.perf_counter()
    for b in batches:
        batch = collate(b, 0)
        with autocast(device):
            model(**{k: batch[k].to(device) for k in ("input_ids", "token_type_ids", "attention_mask")})
    if device.type == "cuda":
        torch.cuda.synchronize()
    return len(rows) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--shard-rows", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    device = resolve_device(args.device)
    model_dir = resolve_model("embedded:minilm-l6")
    model, _ = load_teacher(model_dir, "base", device)
    cfg = build(TeacherCacheDatasetConfig, {"teacher": "base", "head": "base", "split": "train", "max_rows": None,
                                            "signals": SIGNALS},
                "bench")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokens = make_tokens(tmp / "tokens", model_dir, args.rows)
        from datasets import load_from_disk

        rows = load_from_disk(str(tokens))["train"]
        bare_forward(model, rows.select(range(min(64, len(rows)))), args.batch_size, device, 64)  # warm-up
        bare, loop, stage = [], [], []
        for r in range(args.repeats):  # interleaved, so drift in machine load hits both sides alike
            bare.append(bare_forward(model, rows, args.batch_size, device, args.shard_rows))
            store = tmp / f"s{r}.zarr"
            t = time.perf_counter()
            summary = build_teacher_cache("bench", tokens, model_dir, cfg, str(device), args.batch_size,
                                          args.shard_rows, store, cpu_threads=torch.get_num_threads())
            stage.append(len(rows) / (time.perf_counter() - t))
            loop.append(summary.computed_rows / summary.seconds)
        b, c, s = statistics.median(bare), statistics.median(loop), statistics.median(stage)
        print(f"device {device}, {args.rows} rows of 64-{L} tokens, batch {args.batch_size}, shards of "
              f"{args.shard_rows} rows, medians of {args.repeats}")
        print(f"  bare teacher forward        {b:8.1f} rows/s")
        print(f"  teacher_cache shard loop    {c:8.1f} rows/s   ratio cache/bare = {c / b:.2f}  (goal >= 0.90)")
        print(f"  teacher_cache whole stage   {s:8.1f} rows/s   ratio {s / b:.2f} (adds loading the teacher, hashing "
              "its weights and creating the store, once per run)")

        st = open_store(tmp / "s0.zarr")
        info = st.info()
        per_row = info["bytes_on_disk"] / st.n_rows
        mc = model.config
        naive = 4 * L * ((mc.num_hidden_layers + 1) * mc.hidden_size
                         + mc.num_hidden_layers * mc.num_attention_heads * L + mc.vocab_size)
        print(f"  bytes per row on disk       {per_row / 1024:8.1f} KiB  vs naive fp32 {naive / 2**20:.1f} MiB "
              f"-> {naive / per_row:.0f}x smaller  (goal >= 50x)")

        names = [a for a in st.arrays if a.startswith(("hidden/", "attn_scores/"))]
        loader = BlockLoader(tmp / "s0.zarr", names, block_rows=64, buffer_blocks=4, seed=0, expected=None, streams=1,
                             batch_size=32)
        t = time.perf_counter()
        n = sum(len(ri) for ri, _ in loader)
        block_rate = n / (time.perf_counter() - t)
        rng = np.random.default_rng(0)
        picks = rng.permutation(st.n_rows)[:64]
        t = time.perf_counter()
        for i in picks:
            st.read(names, int(i), int(i) + 1)
        single_rate = len(picks) / (time.perf_counter() - t)
        print(f"  block loader                {block_rate:8.0f} rows/s   vs random single-row reads "
              f"{single_rate:.0f} rows/s -> {block_rate / single_rate:.0f}x")


if __name__ == "__main__":
    main()
