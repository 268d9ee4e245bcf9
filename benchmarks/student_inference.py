"""Inference speed of students: the CMOW paper's protocol, and PyTorch vs ONNX Runtime, where people deploy.

Part 1, CMOW paper Table V protocol: random batches of ``--batch-size`` sequences of 64 tokens, no grad, warm-up,
median of ``--repeats``: the paper-size bidirectional CMOW/CBOW-Hybrid (d 20, d_vec 400, MLP head, sequence
classification path) vs a random BERT-base (BertForSequenceClassification, sdpa) vs the embedded MiniLM-L6 teacher.
Paper: 30.0k vs 4.6k sentences/s (6.5x) on a GPU.

Part 2, runtimes: each student architecture that exports (CMOW/CBOW-Hybrid as above, WaLDORf at Table 1 size with
its QA head, MiniALBERT-128 with adapters), exported to ONNX by ``distillpipe export``'s own code (checked against
PyTorch), run by what ``distillpipe predict`` runs (``--runtime torch``: the module in eager mode; ``--runtime
onnx``: ONNX Runtime with as many threads as torch; ``--runtime onnx-int8``: the same graph quantized as ``export
--quantize dynamic`` quantizes it), at batch 1 and 32 of 64-token sequences, beside the MiniLM-L6 teacher in PyTorch
at the same batch; sentences/s of the three runtimes measured in interleaved rounds, and the size of the weights and
of both graphs. Every model but the teacher is randomly initialised: only speed is measured (what int8 does to
scores is export's check, on a trained student's dev and test sets).

Usage: python benchmarks/student_inference.py [--device auto] [--batch-size N] [--repeats 3] [--threads N] [--quick]
[--runtimes-only] [--rounds 2]. ``--quick``: batch 4 in part 1, fewer batches and one repeat (a smoke run: its
numbers mean little); ``--runtimes-only``: part 2 alone.
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
from distillpipe.ship.quantize import quantize_onnx_graph
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


def bench_runtimes(device, timing: dict, threads: int, quick: bool, rounds: int) -> None:
    """Part 2: PyTorch eager vs ONNX Runtime (float graph and its int8 quantization) for each exportable student,
    batch 1 and 32, beside the teacher; model sizes."""
    print(f"\nRuntimes: random sequences x {RUNTIME_LEN} tokens, no grad, median of {timing['repeats']}, best of "
          f"{rounds} interleaved rounds (other load only slows a round); ONNX Runtime with {threads} intra-op "
          f"threads (= torch's); int8 = export --quantize dynamic's graph (onnxruntime.quantization)")
    print(f"   load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    batches = {1: 3 if quick else 30, 32: 1 if quick else 3}  # batches per repeat: ~equal time per measurement

    def rate(forward, batch_size: int) -> float:
        def make():
            return random_batch(batch_size, RUNTIME_LEN, VOCAB, pad_id=PAD, device=device, seed=0, pairs=False)

        t = {**timing, "batches_per_repeat": batches[batch_size]}
        return measure_throughput(forward, make, n_sequences_per_batch=batch_size, **t).sentences_per_s

    def best(runners: dict, batch_size: int) -> dict[str, float]:
        rates: dict[str, float] = {k: 0.0 for k in runners}
        for _ in range(rounds):
            for k, f in runners.items():
                rates[k] = max(rates[k], rate(f, batch_size))
        return rates

    minilm, _ = load_teacher("embedded:minilm-l6", "base", device)
    teacher = {b: best({"t": hf_forward(minilm, device)}, b)["t"] for b in batches}
    del minilm
    free(device)
    rows = []
    for name, (cls, cfg, kind, head) in STUDENTS.items():
        task = TaskSpec(kind=kind, vocab_size=VOCAB, max_seq_len=RUNTIME_MAX_LEN, pad_id=PAD,
                        num_labels=2 if kind == "classification" else 0, encoding="joint",
                        head=build(HeadConfig, head, "head") if head else None)
        seed_everything(0)
        model = build_student(build(cls, cfg, "model"), task).eval()
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            onnx_cfg = export_onnx(model, cfg["student"], task, Path(tmp) / "model.onnx")
            quantize_onnx_graph(Path(tmp) / "model.onnx", Path(tmp) / "model.int8.onnx")
            print(f"   exported {name} to ONNX and int8 in {time.perf_counter() - t0:.0f} s "
                  f"(parity {onnx_cfg['parity_max_difference']:.1e})")
            sizes = {"torch": sum(t.numel() * t.element_size() for t in model.state_dict().values()),
                     "onnx": (Path(tmp) / "model.onnx").stat().st_size,
                     "int8": (Path(tmp) / "model.int8.onnx").stat().st_size}
            runners = {"torch": TorchRunner(model.to(device), device, output_names(task)),
                       "onnx": OnnxRunner(Path(tmp) / "model.onnx", onnx_cfg, device, threads=threads),
                       "int8": OnnxRunner(Path(tmp) / "model.int8.onnx", onnx_cfg, device, threads=threads)}
            rows += [(name, b, best(runners, b), sizes) for b in batches]
        del model, runners
        free(device)
    print(f"   load average at the end:   {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"   {'model':42s} {'batch':>5s} {'PyTorch':>9s} {'ORT float':>9s} {'ORT int8':>9s} {'float/pt':>8s} "
          f"{'int8/pt':>8s} {'pt/teacher':>10s}  {'MB: weights, float graph, int8 graph'}")
    for b in batches:
        print(f"   {'MiniLM-L6 teacher (embedded)':42s} {b:5d} {teacher[b]:9,.0f}")
    for name, b, r, sizes in rows:
        print(f"   {name:42s} {b:5d} {r['torch']:9,.0f} {r['onnx']:9,.0f} {r['int8']:9,.0f} "
              f"{r['onnx'] / r['torch']:7.2f}x {r['int8'] / r['torch']:7.2f}x {r['torch'] / teacher[b]:9.1f}x  "
              f"{sizes['torch'] / 1e6:.1f}, {sizes['onnx'] / 1e6:.1f}, {sizes['int8'] / 1e6:.1f}")


def main() -> None:
    args = arguments(__doc__, **{"--batch-size": {"type": int, "default": None,
                                                 "help": "sequences per batch (default 256 on CUDA, as in the "
                                                         "paper; 64 on CPU)"},
                                 "--runtimes-only": {"action": "store_true", "help": "part 2 only"},
                                 "--rounds": {"type": int, "default": 2,
                                              "help": "part 2: interleaved rounds per runtime (the best counts)"}},
                     ).parse_args()
    device = start(args)
    cuda = device.type == "cuda"
    batch = args.batch_size or (4 if args.quick else 256 if cuda else 64)
    repeats = 1 if args.quick else args.repeats
    t0 = time.perf_counter()
    if not args.runtimes_only:
        bench_inference(device, batch, timing(device, repeats, args.quick))
    bench_runtimes(device, timing(device, repeats, args.quick), torch.get_num_threads(), args.quick,
                   1 if args.quick else args.rounds)
    print(f"\ndone in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
