"""Inference speed, CMOW paper Table V protocol: CMOW/CBOW-Hybrid vs BERT-base vs the MiniLM-L6 teacher.

Random batches of ``--batch-size`` sequences of 64 tokens, no grad, warm-up, median of ``--repeats``: the
paper-size bidirectional CMOW/CBOW-Hybrid (d 20, d_vec 400, MLP head, sequence classification path) vs a random
BERT-base (BertForSequenceClassification, sdpa) vs the embedded MiniLM-L6 teacher. Paper: 30.0k vs 4.6k
sentences/s (6.5x) on a GPU. Every model but the teacher is randomly initialised: only speed is measured.

Usage: python benchmarks/student_inference.py [--device auto] [--batch-size N] [--repeats 3] [--threads N] [--quick]
``--quick``: batch 4, one repeat (a smoke run: its numbers mean little).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import time

from _common import (
    CMOW_PAPER,
    MLP_HEAD,
    PAD,
    VOCAB,
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
from distillpipe.config.students import CMOWHybridConfig, HeadConfig
from distillpipe.evaluate.speed import random_batch
from distillpipe.runtime import seed_everything
from distillpipe.students import build_student
from distillpipe.students.base import TaskSpec
from distillpipe.teacher.load import load_teacher


def bench_inference(device, batch_size: int, timing: dict) -> None:
    seq_len = 64
    print(
        f"\nInference, CMOW paper Table V protocol: {batch_size} random sequences x {seq_len} tokens, no grad, "
        f"median of {timing['repeats']} (x{timing['batches_per_repeat']} batches)"
    )
    if device.type == "cpu" and batch_size != 256:
        print(f"   (CPU: batch {batch_size}, not the paper's 256: BERT-base takes ~a minute per 256-batch on 2 cores)")

    def make():
        return random_batch(batch_size, seq_len, VOCAB, pad_id=PAD, device=device, seed=0, pairs=False)

    task = TaskSpec(
        kind="classification",
        vocab_size=VOCAB,
        max_seq_len=512,
        pad_id=PAD,
        num_labels=2,
        encoding="joint",
        head=build(HeadConfig, MLP_HEAD, "head"),
    )
    seed_everything(0)
    cmow = build_student(build(CMOWHybridConfig, CMOW_PAPER, "model"), task).eval().to(device)
    rates = {
        "CMOW/CBOW-Hybrid (d 20, d_vec 400, MLP)": (
            throughput(student_forward(cmow, device), make, batch_size, timing),
            params(cmow),
        )
    }
    del cmow
    model = bert("BertForSequenceClassification", device)
    rates["BERT-base (random init, sdpa)"] = (throughput(hf_forward(model, device), make, batch_size, timing),
                                              params(model))
    del model
    free(device)
    minilm, _ = load_teacher("embedded:minilm-l6", "base", device)
    rates["MiniLM-L6 teacher (embedded)"] = (throughput(hf_forward(minilm, device), make, batch_size, timing),
                                             params(minilm))
    del minilm
    free(device)
    cmow_rate = next(iter(rates.values()))[0]
    for name, (rate, p) in rates.items():
        print(f"   {name:42s} {rate:9.1f} sentences/s  CMOW speed-up {cmow_rate / rate:6.1f}x   {p}")
    print("   paper (GPU, batch 256): CMOW/CBOW-Hybrid 30.0k vs BERT-base 4.6k sentences/s -> 6.5x")


def main() -> None:
    args = arguments(__doc__, **{"--batch-size": {"type": int, "default": None,
                                                 "help": "sequences per batch (default 256 on CUDA, as in the "
                                                         "paper; 64 on CPU)"}}).parse_args()
    device = start(args)
    cuda = device.type == "cuda"
    batch = args.batch_size or (4 if args.quick else 256 if cuda else 64)
    repeats = 1 if args.quick else args.repeats
    t0 = time.perf_counter()
    bench_inference(device, batch, timing(device, repeats, args.quick))
    print(f"\ndone in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
