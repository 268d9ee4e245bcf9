"""QA inference at length 384: WaLDORf (Table 1 sizes) vs a 4-layer TinyBERT-shaped and a BERT-base QA model.

``--batch-size`` random sequences x 384 tokens, no grad, warm-up, median of ``--repeats``; every model randomly
initialised (only speed is measured). Paper (Table 2): WaLDORf 1.24x TinyBERT, 9.1x BERT-Base.

Usage: python benchmarks/waldorf_speed.py [--device auto] [--batch-size N] [--repeats 3] [--threads N] [--quick]
``--quick``: batch 1, one repeat (a smoke run: its numbers mean little).
"""

from __future__ import annotations

import time

from _common import (
    PAD,
    VOCAB,
    WALDORF_TABLE1,
    arguments,
    bert,
    free,
    hf_forward,
    params,
    start,
    student_forward,
    throughput,
    timing,
)

from distillpipe.config.base import build
from distillpipe.config.students import WaLDORfConfig
from distillpipe.evaluate.speed import random_batch
from distillpipe.runtime import seed_everything
from distillpipe.students import build_student
from distillpipe.students.base import TaskSpec


def bench_waldorf(device, batch_size: int, timing: dict) -> None:
    seq_len = 384
    print(
        f"\nQA inference (WaLDORf issue 6): {batch_size} random sequences x {seq_len} tokens, no grad, "
        f"median of {timing['repeats']} (x{timing['batches_per_repeat']} batches)"
    )

    def make():
        return random_batch(batch_size, seq_len, VOCAB, pad_id=PAD, device=device, seed=0, pairs=False)

    task = TaskSpec(
        kind="qa", vocab_size=VOCAB, max_seq_len=seq_len, pad_id=PAD, num_labels=0, encoding="joint", head=None
    )
    seed_everything(0)
    waldorf = build_student(build(WaLDORfConfig, WALDORF_TABLE1, "model"), task).eval().to(device)
    rates = {
        "WaLDORf (Table 1: 8 x 480, seq/4)": (
            throughput(student_forward(waldorf, device), make, batch_size, timing),
            params(waldorf),
        )
    }
    del waldorf
    tiny = bert("BertForQuestionAnswering", device, hidden_size=312, num_hidden_layers=4, num_attention_heads=12,
                intermediate_size=1200, max_position_embeddings=512)
    rates["TinyBERT-4 shape (4 x 312)"] = (throughput(hf_forward(tiny, device), make, batch_size, timing), params(tiny))
    del tiny
    base = bert("BertForQuestionAnswering", device, max_position_embeddings=512)
    rates["BERT-base QA (random init)"] = (throughput(hf_forward(base, device), make, batch_size, timing), params(base))
    del base
    free(device)
    w = next(iter(rates.values()))[0]
    for name, (rate, p) in rates.items():
        print(f"   {name:42s} {rate:9.1f} sequences/s  WaLDORf speed-up {w / rate:5.2f}x   {p}")
    print("   paper (Table 2): WaLDORf 1.24x TinyBERT, 9.1x BERT-Base")


def main() -> None:
    args = arguments(__doc__, **{"--batch-size": {"type": int, "default": None,
                                                 "help": "sequences per batch (default 32 on CUDA, 8 on CPU)"}}
                     ).parse_args()
    device = start(args)
    batch = args.batch_size or (1 if args.quick else 32 if device.type == "cuda" else 8)
    repeats = 1 if args.quick else args.repeats
    t0 = time.perf_counter()
    bench_waldorf(device, batch, timing(device, repeats, args.quick))
    print(f"\ndone in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
