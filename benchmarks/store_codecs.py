"""Which codec chain each array group of the teacher cache gets: the measurement behind ``store.schema.CODECS``.

For each array group at the seeds' shapes (BERT-Large L 384 pooled 4x for WaLDORf's hidden states, embeddings and
attention scores; BERT-base L 128 for MiniALBERT's attention probabilities; the MLM top-k of CMOW; float16 and the
int8 codes), on rows of 50-100% of L (the rest padding, as a real corpus has), it encodes one shard with each chain
(:mod:`distillpipe.store.codec`, Zarr's format) and prints: bytes on disk against the real values' bytes (1.00 = the
padding costs nothing and the values are stored as they are), and encode and decode GB/s of one core (of the
uncompressed shard). Each chain runs with the chunks the layout would give it: ``raw`` with one row and a block of
positions, ``lz4`` and ``lz4+shuffle`` with 8-64 whole rows.

Values are random normals (the stand-in teacher's), which compress like real float16 activations within a few %
(lz4 1.01x, zstd 1.09x on MiniLM hidden states: docs/at-scale.md); ids and sorted logits are made as the MLM's are.

Usage: python benchmarks/store_codecs.py [--rows 128]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from distillpipe.store.codec import layout_codec
from distillpipe.store.schema import LZ4, LZ4_SHUFFLE, RAW, ArraySpec, chunk_rows_for, codec_of, position_block


def _spec(name: str, row_shape: tuple, dtype, fill, codec: str, shard_rows: int) -> ArraySpec:
    itemsize = np.dtype(dtype).itemsize
    if codec == RAW:
        chunks = (1, position_block(row_shape[0], int(np.prod(row_shape[1:])) * itemsize), *row_shape[1:])
    else:
        chunks = (chunk_rows_for(int(np.prod(row_shape)) * itemsize, shard_rows), *row_shape)
    return ArraySpec(name=name, shape=(shard_rows, *row_shape), chunks=chunks, shards=(shard_rows, *row_shape),
                     dtype=np.dtype(dtype), fill_value=fill, dimension_names=("row", *[f"a{i}" for i in row_shape]),
                     codec=codec)


def _rows(kind: str, n: int, row_shape: tuple, dtype, fill, lengths: np.ndarray, rng) -> tuple[np.ndarray, int]:
    """Rows of ``kind`` with padding past each row's length, and the bytes of their real values."""
    a = np.full((n, *row_shape), fill, dtype=dtype)
    real = 0
    for r, length in enumerate(lengths):
        if kind == "positions":  # (P, d): the first `length` positions
            region = (slice(0, length),)
        elif kind == "map":  # (H, P, P): real queries x real keys
            region = (slice(None), slice(0, length), slice(0, length))
        else:  # mlm (M, k): the first `length` slots
            region = (slice(0, length),)
        shape = a[(r, *region)].shape
        if np.dtype(dtype).kind == "f":
            v = rng.standard_normal(shape)
            if kind == "mlm":
                v = -np.sort(np.abs(v) * 3, axis=-1)  # sorted logits, top first
            a[(r, *region)] = v.astype(dtype)
        elif kind == "mlm":
            a[(r, *region)] = rng.integers(0, 30522, size=shape).astype(dtype)
        else:
            a[(r, *region)] = rng.integers(-127, 128, size=shape).astype(dtype)
        real += int(np.prod(shape)) * np.dtype(dtype).itemsize
    return a, real


GROUPS = [  # name, kind, row shape, dtype, fill, positions axis length (for the lengths)
    ("hidden (BERT-Large, L 384 / 4)", "positions", (96, 1024), np.float16, 0.0, 96),
    ("embeddings (BERT-Large, L 384)", "positions", (384, 1024), np.float16, 0.0, 384),
    ("hidden int8 codes", "positions", (96, 1024), np.int8, 0, 96),
    ("attn scores (16 heads, 96 x 96)", "map", (16, 96, 96), np.float16, float("-inf"), 96),
    ("attn probs (12 heads, 128 x 128)", "map", (12, 128, 128), np.float16, 0.0, 128),
    ("MLM top-64 ids (M 20)", "mlm", (20, 64), np.uint16, 0, 20),
    ("MLM top-64 logits (M 20)", "mlm", (20, 64), np.float16, 0.0, 20),
]


def _time(fn, nbytes: int, repeats: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        c = time.process_time()
        fn()
        best = min(best, time.process_time() - c)
    return nbytes / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=128, help="rows of the shard encoded")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'array group':36s} {'chain':12s} {'disk/real':>9s} {'encode GB/s':>12s} {'decode GB/s':>12s}  layout")
    for label, kind, row_shape, dtype, fill, axis in GROUPS:
        lengths = rng.integers(axis // 2, axis + 1, size=args.rows) if kind != "mlm" else \
            rng.integers(axis * 3 // 4, axis + 1, size=args.rows)
        rows, real = _rows(kind, args.rows, row_shape, dtype, fill, lengths, rng)
        layout_name = {"positions": "hidden/L1", "map": "attn_scores/L1", "mlm": "mlm/topk_ids"}[kind]
        chosen = codec_of(layout_name)
        for codec in (RAW, LZ4, LZ4_SHUFFLE):
            spec = _spec("a", row_shape, dtype, fill, codec, args.rows)
            _, shard = layout_codec(spec)
            enc = shard.encode_parts(rows, 0, args.rows)
            out = np.empty_like(rows)
            with tempfile.NamedTemporaryFile(delete=False) as f:
                f.write(enc.to_bytes())
            try:
                enc_rate = _time(lambda: shard.encode_parts(rows, 0, args.rows), rows.nbytes)
                dec_rate = _time(lambda: shard.decode_rows(f.name, 0, args.rows, out), rows.nbytes)
            finally:
                os.unlink(f.name)
            assert np.array_equal(out.view(np.uint8), rows.view(np.uint8)) or np.array_equal(out, rows)
            mark = "<- used" if codec == chosen else ""
            print(f"{label:36s} {codec:12s} {enc.nbytes / real:9.3f} {enc_rate:12.2f} {dec_rate:12.2f}  {mark}")
        print()


if __name__ == "__main__":
    main()
