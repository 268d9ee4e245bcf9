"""Inference speed of students: the CMOW paper's protocol, and PyTorch vs ONNX Runtime, where people deploy.

Part 1, CMOW paper Table V protocol: random batches of ``--batch-size`` sequences of 64 tokens, no grad, warm-up,
median of ``--repeats``: the paper-size bidirectional CMOW/CBOW-Hybrid (d 20, d_vec 400, MLP head, sequence
classification path) vs a random BERT-base (BertForSequenceClassification, sdpa) vs the embedded MiniLM-L6 teacher.
Paper: 30.0k vs 4.6k sentences/s (6.5x) on a GPU.

Part 2, runtimes: each student architecture that exports (CMOW/CBOW-Hybrid as above, WaLDORf at Table 1 size with
its QA head, MiniALBERT-128 with adapters), exported to ONNX by ``distillpipe export``'s own code (checked against
PyTorch), run by what ``distillpipe predict`` runs (``--runtime torch``: the module in eager mode; ``--runtime
onnx``: ONNX Runtime with as many threads as torch), at batch 1 and 32 of 64-token sequences, beside the MiniLM-L6
teacher in PyTorch at the same batch; ratios side by side. Every model but the teacher is randomly initialised:
only speed is measured.

Usage: python benchmarks/student_inference.py [--device auto] [--batch-size N] [--repeats 3] [--threads N] [--quick]
``--quick``: batch 4 in part 1, fewer batches and one repeat (a smoke run: its numbers mean little).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tempfile
import time
from pathlib import Path

import torch
from _common import (
    CMOW_PAPER,
    MINIALBERT_128,
    MLP_HEAD,
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
from distillpipe.config.students import CMOWHybridConfig, HeadConfig, MiniALBERTConfig, WaLDORfConfig
from distillpipe.evaluate.speed import measure_throughput, random_batch
from distillpipe.runtime import seed_everything
from distillpipe.ship.onnx import export_onnx, output_names
from distillpipe.ship.runners import OnnxRunner, TorchRunner
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


RUNTIME_LEN = 64
RUNTIME_MAX_LEN = 128  # the exported students' longest input (the embedded tokens' max_seq_len)
STUDENTS = {  # name: (config class, config, task kind, head)
    "CMOW/CBOW-Hybrid (d 20, d_vec 400, MLP)": (CMOWHybridConfig, CMOW_PAPER, "classification", MLP_HEAD),
    "WaLDORf (Table 1, QA head)": (WaLDORfConfig, WALDORF_TABLE1, "qa", None),
    "MiniALBERT-128 (6 x 768, adapters 48)": (MiniALBERTConfig, MINIALBERT_128, "classification",
                                              {"type": "linear", "hidden_size": 1, "dropout": 0.1}),
}


def bench_runtimes(device, timing: dict, threads: int, quick: bool) -> None:
    """Part 2: PyTorch eager vs ONNX Runtime for each exportable student, batch 1 and 32, beside the teacher."""
    print(f"\nRuntimes: random sequences x {RUNTIME_LEN} tokens, no grad, median of {timing['repeats']}; "
          f"ONNX Runtime with {threads} intra-op threads (= torch's)")
    batches = {1: 3 if quick else 30, 32: 1 if quick else 3}  # batches per repeat: ~equal time per measurement

    def rate(forward, batch_size: int) -> float:
        def make():
            return random_batch(batch_size, RUNTIME_LEN, VOCAB, pad_id=PAD, device=device, seed=0, pairs=False)

        t = {**timing, "batches_per_repeat": batches[batch_size]}
        return measure_throughput(forward, make, n_sequences_per_batch=batch_size, **t).sentences_per_s

    minilm, _ = load_teacher("embedded:minilm-l6", "base", device)
    teacher = {b: rate(hf_forward(minilm, device), b) for b in batches}
    del minilm
    free(device)
    rows = [("MiniLM-L6 teacher (embedded)", "torch", b, teacher[b], None) for b in batches]
    for name, (cls, cfg, kind, head) in STUDENTS.items():
        task = TaskSpec(kind=kind, vocab_size=VOCAB, max_seq_len=RUNTIME_MAX_LEN, pad_id=PAD,
                        num_labels=2 if kind == "classification" else 0, encoding="joint",
                        head=build(HeadConfig, head, "head") if head else None)
        seed_everything(0)
        model = build_student(build(cls, cfg, "model"), task).eval()
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            onnx_cfg = export_onnx(model, cfg["student"], task, Path(tmp) / "model.onnx")
            print(f"   exported {name} to ONNX in {time.perf_counter() - t0:.0f} s "
                  f"(parity {onnx_cfg['parity_max_difference']:.1e})")
            ort = OnnxRunner(Path(tmp) / "model.onnx", onnx_cfg, device, threads=threads)
            eager = TorchRunner(model.to(device), device, output_names(task))
            for b in batches:
                e = rate(eager, b)
                o = rate(ort, b)
                rows += [(name, "torch", b, e, None), (name, "onnx", b, o, e)]
        del model, ort, eager
        free(device)
    print(f"   {'model':42s} {'runtime':8s} {'batch':>5s} {'sentences/s':>12s} {'vs teacher':>11s} {'onnx/torch':>11s}")
    for name, runtime, b, r, eager_rate in rows:
        vs_eager = f"{r / eager_rate:10.2f}x" if eager_rate else ""
        print(f"   {name:42s} {runtime:8s} {b:5d} {r:12,.1f} {r / teacher[b]:10.1f}x {vs_eager:>11s}")


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
    bench_runtimes(device, timing(device, repeats, args.quick), torch.get_num_threads(), args.quick)
    print(f"\ndone in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
