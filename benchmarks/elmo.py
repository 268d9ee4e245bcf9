"""ELMo-C vs ELMo-A vs ELMo-Sub: the cost of the output layer, measured side by side in one run.

Prints
  1. for each output layer (continuous / adaptive softmax / full softmax) at the same encoder size, and each
     vocabulary size (default: the teacher tokenizer's 30,522 subwords and a paper-like 200,000-word vocabulary,
     synthetic ids): training tokens/s (forward + backward + clip + AdamW step of the loop's Trainable: student
     and objective), trainable parameters (the frozen input table excluded) and peak memory (CUDA:
     max_memory_allocated; CPU: peak RSS growth of a fresh process), with ratios to ELMo-C. Paper (Table 2, 1B
     Word Benchmark, 800k words for ELMo-A): ELMo-C 2.5 x 4 GPU-days vs ELMo-A 5.7 x 4 (2.3x) and ELMo-Sub
     3.9 x 4 (1.6x); ELMo-C is ~4x faster than the original ELMo; trainable parameters 76M vs 196M (A),
     92M (Sub), 499M (ELMo): ELMo-C has 80%+ fewer than ELMo;
  2. the input vectors of one epoch looked up from the (V, e) table ("cached per word type", what the students
     do) vs read per token from a teacher-cache store (an ``embeddings`` (N, L, e) fp16 array through the block
     loader): tokens/s and bytes.

Usage: python benchmarks/elmo.py [--device auto] [--d-input 300] [--d-hidden 1024] [--d-proj 256]
                                 [--batch-size 32] [--seq-len 64] [--steps 5] [--vocabs 30522,200000]
``--paper`` uses the paper's encoder (2 x LSTM 4096 with 512 projections, FastText 300-d; batch 128 x 20).
Every model is randomly initialised: only cost is measured.
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import multiprocessing as mp
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from store_loader import synthetic

OUTPUTS = {"continuous": "ELMo-C", "adaptive": "ELMo-A", "subword": "ELMo-Sub"}


def _cutoffs(vocab: int) -> list[int]:
    """Adaptive-softmax clusters as Grave et al. use them on large vocabularies: a 2k shortlist, then 10k, 50k."""
    return [c for c in (2000, 10000, 50000) if c < vocab]


def measure(args: dict) -> dict:
    """One (output layer, vocabulary) in this process: tokens/s, trainable parameters, peak memory."""
    from distillpipe.config.base import build
    from distillpipe.config.run import ObjectiveConfig
    from distillpipe.config.students import ElmoConfig
    from distillpipe.runtime import adamw, autocast
    from distillpipe.students import build_student
    from distillpipe.students.base import TaskSpec, set_input_vectors
    from distillpipe.train.build import Trainable, param_groups
    from distillpipe.train.objective import Objective, StudentDims

    torch.set_num_threads(args["threads"])
    dev = torch.device(args["device"])
    V, B, T = args["vocab"], args["batch_size"], args["seq_len"]
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    torch.manual_seed(0)
    cfg = build(ElmoConfig, {"student": "elmo", "d_input": args["d_input"], "output": args["output"],
                             "d_hidden": args["d_hidden"], "d_proj": args["d_proj"], "n_layers": 2,
                             "adaptive_cutoffs": _cutoffs(V), "adaptive_div_value": 4.0, "dropout": 0.1,
                             "init_std": 0.02}, "model")
    task = TaskSpec(kind="mlm", vocab_size=V, max_seq_len=T, pad_id=0, num_labels=0, encoding="joint", head=None)
    student = build_student(cfg, task)
    table = torch.randn(V, args["d_input"])
    table[:5] = 0.0  # special tokens
    set_input_vectors(student, table)
    student.to(dev)
    g = torch.Generator().manual_seed(1)
    batches = [{"unmasked_input_ids": torch.randint(5, V, (B, T), generator=g).to(dev),
                "attention_mask": torch.ones(B, T, dtype=torch.bool, device=dev)} for _ in range(2)]
    ocfg = build(ObjectiveConfig, {"loss_weights": {"lm": 1.0}, "hidden_loss": "cosine", "layer_map": [-1, -1],
                                   "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                                "temperature_decay": False}}, "objective")

    class _Signals:  # the lm term reads no teacher signal
        pool = 1

    # (not probe_student: its eval-mode forward would score every prediction against the whole vocabulary)
    dims = StudentDims(hidden=(2 * cfg.d_proj,) * 2, hidden_stride=1, attn_heads=(), embedding=0, lm=True)
    objective = Objective(ocfg, kind="mlm", signals=_Signals(), dims=dims).to(dev)
    trainable = Trainable(student, objective).train()
    optimizer = adamw(param_groups([trainable], 0.0), lr=1e-3)
    params = [p for grp in optimizer.param_groups for p in grp["params"]]

    def step(batch):
        with autocast(dev):
            loss, _ = trainable(batch, {"attention_mask": batch["attention_mask"]}, multipliers={"lm": 1.0},
                                temperature=1.0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(batches[0])  # warm-up (allocates the optimizer state)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for i in range(args["steps"]):
        step(batches[i % 2])
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    peak = (torch.cuda.max_memory_allocated() if dev.type == "cuda"
            else (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) * 1024)
    return {"tokens_s": args["steps"] * B * T / seconds, "trainable": sum(p.numel() for p in params),
            "peak_bytes": peak, "step_s": seconds / args["steps"]}


def lookup_vs_store(device: torch.device, n_rows: int, seq_len: int, d_input: int, vocab: int) -> None:
    """One epoch's input vectors: gathered from the (V, e) table vs read per token from a store."""
    from distillpipe.store.loader import BlockLoader
    from distillpipe.store.manifest import Manifest, TeacherInfo
    from distillpipe.store.resume import create_or_resume
    from distillpipe.store.schema import SignalSpec, array_layout

    table = torch.randn(vocab, d_input, device=device)
    ids = torch.randint(5, vocab, (n_rows, seq_len), device=device)
    t = time.perf_counter()
    for i in range(0, n_rows, 64):
        x = torch.nn.functional.embedding(ids[i:i + 64], table)  # (64, L, e): what the student does per batch
    if device.type == "cuda":
        torch.cuda.synchronize()
    lookup = n_rows * seq_len / (time.perf_counter() - t)
    del x
    spec = SignalSpec(max_seq_len=seq_len, pool=1, task="none", n_classes=0, vocab_size=vocab, mlm_topk=0,
                      mlm_max_masked=0, hidden_layers=(), hidden_size=1, attn_layers=(), n_heads=1,
                      attn_probs_layers=(), embedding_size=d_input)  # fmt: skip
    teacher = TeacherInfo(name="synthetic", weights_sha256="0" * 64, tokenizer_sha256="0" * 64, config={})
    manifest = Manifest(teacher=teacher, tokens_fingerprint="bench", split="train", signals=spec,
                        compute={"precision": "fp32"}, code={}, n_rows=n_rows, shard_rows=1024)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vectors.zarr"
        writer = create_or_resume(path, manifest)
        for i in writer.pending_shards():
            writer.write_shard(i, synthetic(manifest, i))
        writer.finalize()
        names = [a.name for a in array_layout(spec, n_rows, 1024) if a.name not in ("row_index", "length")]
        loader = BlockLoader(path, names, block_rows=256, buffer_blocks=4, seed=0, expected=None, batch_size=64,
                             streams=1)
        t = time.perf_counter()
        for _, arrays in loader:
            torch.from_numpy(arrays["embeddings"]).to(device).float()
        store = n_rows * seq_len / (time.perf_counter() - t)
    row_bytes = seq_len * d_input * 2
    print(f"\ninput vectors of one epoch ({n_rows:,} rows x {seq_len} tokens, e={d_input}):")
    print(f"  table lookup (cached per word type)  {lookup:14,.0f} tokens/s   table "
          f"{vocab * d_input * 4 / 2**20:,.1f} MB once")
    print(f"  per-token store (block loader)       {store:14,.0f} tokens/s   {row_bytes / 1024:,.0f} KB per row "
          f"({n_rows * row_bytes / 2**20:,.0f} MB per epoch)")
    print(f"  lookup is {lookup / store:,.1f}x the store's rate and stores nothing per token")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--d-input", type=int, default=300)
    ap.add_argument("--d-hidden", type=int, default=1024)
    ap.add_argument("--d-proj", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--vocabs", default="30522,200000")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--paper", action="store_true", help="the paper's encoder: LSTM 4096/512, e 300, batch 128 x 20")
    ap.add_argument("--store-rows", type=int, default=2048)
    a = ap.parse_args()
    if a.paper:
        a.d_input, a.d_hidden, a.d_proj, a.batch_size, a.seq_len = 300, 4096, 512, 128, 20
    device = "cuda" if a.device == "auto" and torch.cuda.is_available() else ("cpu" if a.device == "auto"
                                                                              else a.device)
    print(f"device {device}; encoder: 2 x LSTM {a.d_hidden} -> proj {a.d_proj} + LayerNorm per direction, input "
          f"e={a.d_input}; batch {a.batch_size} x {a.seq_len} tokens; {a.steps} timed steps")
    ctx = mp.get_context("spawn")  # a fresh process per measurement: peak memory of that model alone
    for vocab in (int(v) for v in a.vocabs.split(",")):
        rows = {}
        for output in OUTPUTS:
            job = {"output": output, "vocab": vocab, "device": device, "d_input": a.d_input, "d_hidden": a.d_hidden,
                   "d_proj": a.d_proj, "batch_size": a.batch_size, "seq_len": a.seq_len, "steps": a.steps,
                   "threads": a.threads}
            with ctx.Pool(1) as pool:
                rows[output] = pool.apply(measure, (job,))
        c = rows["continuous"]
        print(f"\nvocabulary {vocab:,}" + (f" (adaptive cutoffs {_cutoffs(vocab)})" if vocab else ""))
        print(f"  {'model':9} {'tokens/s':>10} {'speed-up':>9} {'trainable':>12} {'C has':>8} {'peak MB':>9} "
              f"{'mem x':>6}")
        for output, name in OUTPUTS.items():
            r = rows[output]
            print(f"  {name:9} {r['tokens_s']:10,.0f} {c['tokens_s'] / r['tokens_s']:8.2f}x {r['trainable']:12,} "
                  f"{1 - c['trainable'] / r['trainable']:7.0%}- {r['peak_bytes'] / 2**20:9,.0f} "
                  f"{r['peak_bytes'] / max(c['peak_bytes'], 1):5.2f}x")
        print("  (speed-up: ELMo-C tokens/s over the row's; 'C has': how many fewer trainable parameters ELMo-C has; "
              "mem x: the row's peak over ELMo-C's)")
    lookup_vs_store(torch.device(device), a.store_rows, 128, a.d_input, 30522)


if __name__ == "__main__":
    np.set_printoptions(linewidth=120)
    main()
