"""Scale-out benchmark: ratios measured side by side in one run (machines are noisy).

Prints
  1. teacher_cache rows/s in this process vs on a dask LocalCluster of 1 and 2 worker processes, on the
     same rows (the embedded MiniLM-L6 teacher, WaLDORf-like signals), with each configuration's threads
     adding up to the machine's cores; the cluster's start-up (workers, loading the teacher) apart;
  2. the per-shard overhead of dask at 1 worker with the in-process thread count (goal <= 5%);
  3. student training step time on 2 torchrun processes (DDP, gloo on CPU) vs 1, same global batch;
  4. on CUDA only: BERT-Large-shaped caching at L 384 (random weights), hidden states and scores of 4 layers,
     rows/s vs a bare forward on the same batches (goal >= 0.95) and vs ~3,200 seq/s, an H100's limit.

Usage: python benchmarks/scale.py [--rows 1024] [--shard-rows 128] [--train-rows 2048]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from teacher_cache import SIGNALS, make_tokens
from transformers import BertConfig, BertModel

from distillpipe.assets import resolve_model
from distillpipe.config.base import build
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.scale.machine import load_machine
from distillpipe.store.schema import SignalSpec
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.teacher.capture import capture_batch

CORES = os.cpu_count() or 1


def cluster(kind: str, workers: int, threads: int, machine_file: Path):
    return load_machine({"DISTILLPIPE_MACHINE": str(machine_file), "DISTILLPIPE_CLUSTER": kind,
                         "DISTILLPIPE_WORKERS": str(workers), "DISTILLPIPE_THREADS": str(threads)}).cluster


def cache_rates(tmp: Path, rows: int, shard_rows: int) -> None:
    model_dir = resolve_model("embedded:minilm-l6")
    tokens = make_tokens(tmp / "tokens", model_dir, rows)
    cfg = build(TeacherCacheDatasetConfig, {"teacher": "base", "head": "base", "split": "train", "max_rows": None,
                                            "signals": SIGNALS},
                "bench")
    (tmp / "machine.yaml").write_text("")
    # (label, cluster, torch threads per computation). Dask workers get 2 threads: while one computes a shard
    # (one at a time per teacher), the other writes the previous one, as the in-process writer thread does.
    machine = tmp / "machine.yaml"
    configs = [
        ("in this process", None, 1),
        ("dask, 1 worker", cluster("local", 1, 2, machine), 1),
        ("dask, 2 workers", cluster("local", 2, 2, machine), 1),
        (f"in this process, {CORES} threads", None, CORES),
        (f"dask, 1 worker, {CORES} threads", cluster("local", 1, 2, machine), CORES),
    ]
    results = {}
    for i, (label, settings, threads) in enumerate(configs):
        t = time.perf_counter()
        s = build_teacher_cache("bench", tokens, model_dir, cfg, "cpu", 64, shard_rows, tmp / f"s{i}.zarr",
                                cpu_threads=threads, cluster=settings)
        total = time.perf_counter() - t
        results[label] = (s.computed_rows / s.seconds, total - s.seconds, s.seconds)
    n_shards = -(-rows // shard_rows)
    print(f"1. teacher_cache on {CORES} cores, {rows} rows in {n_shards} shards of {shard_rows} (MiniLM-L6, L 128), "
          "torch threads per shard computation as labelled (1 unless said):")
    base_rate = results["in this process"][0]
    for label, (rate, startup, _) in results.items():
        print(f"   {label:<28} {rate:7.1f} rows/s   ratio {rate / base_rate:.2f}   start-up {startup:5.1f} s")
    base_s, one = results[f"in this process, {CORES} threads"][2], results[f"dask, 1 worker, {CORES} threads"][2]
    print(f"2. dask per-shard overhead at 1 worker: {(one - base_s) / n_shards * 1000:+.0f} ms per shard "
          f"= {(one / base_s - 1) * 100:+.1f}% of in-process (goal <= 5%)")


def _tests_tiny():
    """The tests' tiny-teacher fixtures (tests/_tiny.py), loaded from their file. Deliberately the tests' own: the
    DDP step time is measured on the teacher and task the DDP tests train, and a copy here would drift from them.
    Loaded by path, not by adding tests/ to sys.path, so nothing else this script imports can resolve there."""
    path = Path(__file__).resolve().parents[1] / "tests" / "_tiny.py"
    spec = importlib.util.spec_from_file_location("_tiny", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ddp_step_time(tmp: Path, train_rows: int) -> None:
    tiny = _tests_tiny()
    make_classification_tokens, make_tiny_bert_dir = tiny.make_classification_tokens, tiny.make_tiny_bert_dir
    signals, write_params = tiny.signals, tiny.write_params
    clf = make_tiny_bert_dir(tmp / "clf", num_labels=2, seed=1)
    tokens = make_classification_tokens(tmp / "cls", clf, n_train=train_rows, n_dev=64)
    cfg = build(TeacherCacheDatasetConfig, {"teacher": "t", "head": "classification", "split": "train",
                                            "max_rows": None,
                                            "signals": signals(logits=True, hidden_layers=[], attn_layers=[],
                                                               pool=1)}, "c")
    build_teacher_cache("toy", tokens, clf, cfg, "cpu", 64, 256, tmp / "cls.zarr", cpu_threads=1)
    run = {"dataset": "toy", "encoding": "joint", "head": {"type": "mlp", "hidden_size": 256, "dropout": 0.1},
           "teacher": "data/teacher/toy.zarr", "mlm_views": "static",
           "model": {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 8, "d_vec": 64,
                     "init_std": 0.01, "embedding_init": "random", "dropout": 0.1},
           "objective": {"loss_weights": {"hard": 0.5, "soft": 0.5}, "hidden_loss": "cosine", "layer_map": [-1],
                         "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                      "temperature_decay": False}},
           "optim": {"epochs": 2, "max_steps": None, "batch_size": 64, "lr": 1e-3, "weight_decay": 0.0,
                     "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10**6, "seed": 0},
           "note": "bench"}
    params = write_params(tmp / "params.yaml", {"train": {"device": "cpu", "runs": {"r": run},
                                                          "loader": {"block_rows": 64, "buffer_blocks": 4,
                                                                     "streams": 2}}})
    rates = {}
    for nproc in (1, 2):
        out = tmp / f"student{nproc}"
        env = {**os.environ, "DISTILLPIPE_MACHINE": str(tmp / "machine.yaml"), "DISTILLPIPE_NPROC": str(nproc),
               "OMP_NUM_THREADS": str(max(1, CORES // nproc))}
        res = subprocess.run([sys.executable, "-m", "distillpipe.cli", "train", "--run", "r", "--tokens", str(tokens),
                              "--teacher-cache", str(tmp / "cls.zarr"), "--prepared", str(tokens), "--out", str(out),
                              "--checkpoints", f"{out}.ckpt", "--live", f"{out}.live",
                              "--params", str(params)], env=env, capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(res.stderr[-2000:])
        steps, seconds = map(float, re.search(r"(\d+) steps in ([\d.]+) s", res.stdout).groups())
        rates[nproc] = seconds / steps
    print(f"3. student training, global batch 64, {train_rows} rows (embedded-size Hybrid, 5.9 M parameters): "
          f"{rates[1] * 1000:.0f} ms/step on 1 process, {rates[2] * 1000:.0f} ms/step on 2 (DDP, gloo) -> "
          f"{rates[1] / rates[2]:.2f}x (each run's time includes its start-up and evaluations)")


def bert_large_cuda() -> dict:
    if not torch.cuda.is_available():
        print("4. BERT-Large-shaped caching on CUDA: skipped (no CUDA device here)")
        return {}
    device = torch.device("cuda")
    model = BertModel(BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                 intermediate_size=4096, max_position_embeddings=512),
                      attn_implementation="sdpa").eval().to(device)
    layers = (6, 12, 18, 24)
    spec = SignalSpec(max_seq_len=384, pool=4, task="none", n_classes=0, vocab_size=model.config.vocab_size,
                      mlm_topk=0, mlm_max_masked=0, hidden_layers=layers, hidden_size=1024, attn_layers=layers,
                      n_heads=16, attn_probs_layers=(), embedding_size=0)
    batch = {"input_ids": torch.randint(1000, 29000, (64, 384), device=device),
             "token_type_ids": torch.zeros(64, 384, dtype=torch.long, device=device),
             "attention_mask": torch.ones(64, 384, dtype=torch.long, device=device)}

    def rate(fn, n=20) -> float:
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return n * 64 / (time.perf_counter() - t)

    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        bare = rate(lambda: model(**batch))
        cached = rate(lambda: capture_batch(model, batch, spec, seq_len=384))
    print(f"4. BERT-Large L 384 on {torch.cuda.get_device_name()}: capture {cached:.0f} seq/s vs bare forward "
          f"{bare:.0f} seq/s -> {cached / bare:.2f} (goal >= 0.95); {cached / 3200:.2f} of ~3,200 seq/s")
    return {"capture_seq_s": cached, "bare_seq_s": bare, "capture/bare": cached / bare, "of_3200": cached / 3200}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--shard-rows", type=int, default=128)
    ap.add_argument("--train-rows", type=int, default=2048)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache_rates(Path(tmp), args.rows, args.shard_rows)
        ddp_step_time(Path(tmp), args.train_rows)
    bert_large_cuda()


if __name__ == "__main__":
    main()
