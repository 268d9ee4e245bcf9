"""The associative scans of students/cmow_hybrid.py vs a python loop of matmuls, outputs checked equal.

prefix_products and tree_product on X (B, L, 20, 20) = I + N(0, 0.01^2), fp32, for L 64 and 128; median of
``--repeats``.

Usage: python benchmarks/scans.py [--device auto] [--batch-size N] [--repeats 3] [--threads N] [--quick]
``--quick``: batch 4, one repeat (a smoke run: its numbers mean little).
"""

from __future__ import annotations

import time

import torch
from _common import arguments, start, throughput, timing

from distillpipe.students.cmow_hybrid import prefix_products, tree_product


def loop_prefix(X: torch.Tensor) -> torch.Tensor:
    """P_i = X_0 ... X_i by one matmul per position (the sequential reference)."""
    out = torch.empty_like(X)  # (B, L, d, d)
    P = X[:, 0]
    out[:, 0] = P
    for i in range(1, X.shape[1]):
        P = torch.bmm(P, X[:, i])  # (B, d, d)
        out[:, i] = P
    return out


def loop_product(X: torch.Tensor) -> torch.Tensor:
    P = X[:, 0]  # (B, d, d)
    for i in range(1, X.shape[1]):
        P = torch.bmm(P, X[:, i])
    return P


def bench_scans(device, batch_size: int, timing: dict) -> None:
    d = 20
    print(
        f"\nParallel scan (scan.py) vs a python loop of matmuls, X (B={batch_size}, L, {d}, {d}) = I + N(0, 0.01^2)"
        f" fp32, median of {timing['repeats']}"
    )
    for L in (64, 128):
        g = torch.Generator().manual_seed(L)
        X = (torch.eye(d) + 0.01 * torch.randn(batch_size, L, d, d, generator=g)).to(device)  # (B, L, d, d)

        def make(X=X):
            return {"X": X}

        for name, fast, slow in (
            ("prefix_products", prefix_products, loop_prefix),
            ("tree_product", tree_product, loop_product),
        ):
            with torch.inference_mode():
                a, b = fast(X), slow(X)
            err = (a - b).abs().max().item()
            if not torch.allclose(a, b, rtol=1e-4, atol=1e-5):
                raise RuntimeError(f"{name} differs from the sequential loop at L={L}: max |diff| {err:.2e}")
            t_fast = batch_size / throughput(lambda bt, f=fast: f(bt["X"]), make, batch_size, timing)
            t_slow = batch_size / throughput(lambda bt, f=slow: f(bt["X"]), make, batch_size, timing)
            print(
                f"   L {L:3d} {name:16s} scan {1e3 * t_fast:8.2f} ms  loop {1e3 * t_slow:8.2f} ms  "
                f"-> {t_slow / t_fast:5.1f}x   (equal: max |diff| {err:.1e})"
            )


def main() -> None:
    args = arguments(__doc__, **{"--batch-size": {"type": int, "default": None,
                                                 "help": "matrices per batch (default 256 on CUDA, 64 on CPU)"}}
                     ).parse_args()
    device = start(args)
    batch = args.batch_size or (4 if args.quick else 256 if device.type == "cuda" else 64)
    repeats = 1 if args.quick else args.repeats
    t0 = time.perf_counter()
    bench_scans(device, batch, timing(device, repeats, args.quick))
    print(f"\ndone in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
