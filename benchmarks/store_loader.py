"""Teacher-cache store throughput: shard writes, block-loader reads vs random single-row reads.

Builds a synthetic store shaped like a MiniLM-L6 general-distillation cache (L=128, hidden states
of 2 layers at d=384 and attention scores of 1 layer with 12 heads, both pooled p=4: ~74 KB/row)
in a temp folder, then prints
rows/s and MB/s for writing, for the block loader (num_workers=0), and for reading rows one at a
time in random order. Usage: python benchmarks/store_loader.py [n_rows]
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from distillpipe.store.loader import BlockLoader
from distillpipe.store.manifest import Manifest, TeacherInfo
from distillpipe.store.reader import open_store
from distillpipe.store.resume import create_or_resume
from distillpipe.store.schema import SignalSpec, array_layout


def synthetic(manifest: Manifest, i: int) -> dict[str, np.ndarray]:
    start, stop = manifest.shard_rows_range(i)
    n = stop - start
    rng = np.random.default_rng(i)
    out = {}
    for a in array_layout(manifest.signals, manifest.n_rows, manifest.shard_rows):
        shape = (n, *a.row_shape)
        if a.name == "row_index":
            out[a.name] = np.arange(start, stop, dtype=np.int64)
        elif a.name == "length":
            out[a.name] = rng.integers(16, manifest.signals.max_seq_len + 1, size=n).astype(np.int32)
        else:  # activations: fp16 with a realistic spread (mantissas are close to random)
            out[a.name] = (rng.standard_normal(shape, dtype=np.float32) * 2).astype(a.dtype)
    return out


def main(n_rows: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    spec = SignalSpec(max_seq_len=128, pool=4, task="classification", n_classes=2, vocab_size=30522, mlm_topk=0,
                      mlm_max_masked=0, hidden_layers=(3, 6), hidden_size=384, attn_layers=(6,), n_heads=12,
                      attn_probs_layers=(), embedding_size=0)  # fmt: skip
    teacher = TeacherInfo(name="synthetic", weights_sha256="0" * 64, tokenizer_sha256="0" * 64, config={})
    manifest = Manifest(teacher=teacher, tokens_fingerprint="bench", split="train", signals=spec,
                        compute={"precision": "fp32"}, code={}, n_rows=n_rows, shard_rows=1024)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.zarr"
        writer = create_or_resume(path, manifest)
        shards = [synthetic(manifest, i) for i in writer.pending_shards()]
        raw = sum(a.nbytes for s in shards for a in s.values())
        t = time.perf_counter()
        for i, arrays in enumerate(shards):
            writer.write_shard(i, arrays)
        summary = writer.finalize()
        dt = time.perf_counter() - t
        print(f"write    {n_rows / dt:10,.0f} rows/s  {raw / dt / 2**20:8,.1f} MB/s raw   {summary}")

        names = [a.name for a in array_layout(spec, n_rows, 1024) if a.name not in ("row_index", "length")]
        loader = BlockLoader(path, names, block_rows=256, buffer_blocks=4, seed=0, expected=None, batch_size=64,
                             streams=1)
        t = time.perf_counter()
        rows = sum(len(r) for r, _ in loader)
        block_rate = rows / (time.perf_counter() - t)
        print(f"blocks   {block_rate:10,.0f} rows/s  (block_rows=256, buffer_blocks=4, batch 64)")

        store = open_store(path)
        order = np.random.default_rng(0).permutation(n_rows)[: min(n_rows, 512)]
        t = time.perf_counter()
        for r in order:
            store.read(names, int(r), int(r) + 1)
        row_rate = len(order) / (time.perf_counter() - t)
        print(f"random   {row_rate:10,.0f} rows/s  (single rows)   block loader is {block_rate / row_rate:.0f}x faster")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2048)
