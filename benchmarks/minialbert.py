"""MiniALBERT adapter tuning vs full fine-tuning: optimizer-step throughput of the same student, measured side by
side in one run (machines are noisy), with the trainable parameter counts. Paper (sec. 5): adapter tuning is
"nearly 30% faster" than full fine-tuning; Table 1: 0.9M tunable parameters.

Both runs are built by the training loop itself (``train.build.build_run``: ``freeze_for_tuning``, the optimizer over
the trainable parameters, the teacher-cache loader) and stepped with ``train.loop.train_step`` (collate, forward,
loss, backward, clip, AdamW step), alternating ``--steps`` steps of one and of the other for ``--repeats`` rounds;
the median steps/s of each is reported. Adapters still need the backward pass through every iteration (they sit
inside the recursion), so the saving is the weight gradients and optimizer updates of the frozen weights.

Data: a classification tokens folder and its teacher cache, by default the embedded pipeline's wiki_pairs (run
``dvc repro teacher_cache@wiki_pairs`` first); the objective is ground truth only (the paper's fine-tuning), so only
``length`` is read from the cache. Models (random weights: only speed is measured):

  --model embedded   the embedded preset of params.yaml (train.runs.minialbert.model)
  --model paper128   MiniALBERT-128 with adapters (Table 1: 12M; d 768, 12 heads, 6 iterations, adapters 48)
  --model paper312   MiniALBERT-312 with adapters (Table 1: 18M)

Usage: python benchmarks/minialbert.py [--model paper128] [--tokens data/tokens/wiki_pairs]
           [--teacher-cache data/teacher/wiki_pairs.zarr] [--batch-size 16] [--steps 5] [--repeats 3] [--device auto]
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import torch

from distillpipe.config.base import build, load_section
from distillpipe.config.finetune import FinetuneRunConfig
from distillpipe.config.run import LoaderConfig
from distillpipe.config.students import MiniALBERTConfig
from distillpipe.config.train import TrainConfig
from distillpipe.runtime import resolve_device
from distillpipe.train.build import TrainingRun, build_run
from distillpipe.train.loop import train_step

PAPER = {"student": "minialbert", "d_model": 768, "n_heads": 12, "d_ff": 3072, "n_iterations": 6, "adapter_size": 48,
         "max_position_embeddings": 512, "dropout": 0.1, "init_std": 0.02, "embedding_init": "random"}
MODELS = {"paper128": {**PAPER, "embedding_size": 128}, "paper312": {**PAPER, "embedding_size": 312}}


def model_config(name: str, params: Path) -> MiniALBERTConfig:
    if name == "embedded":
        return load_section(params, "train", TrainConfig).runs["minialbert"].model
    return build(MiniALBERTConfig, MODELS[name], f"benchmark model {name}")


def make_run(tune: str, model: MiniALBERTConfig, args: argparse.Namespace, tmp: Path) -> TrainingRun:
    run = build(FinetuneRunConfig, {
        "init": "none", "student": "minialbert", "tune": tune, "dataset": args.tokens.name, "encoding": "joint",
        "teacher": f"data/teacher/{args.tokens.name}.zarr",
        "head": {"type": "linear", "hidden_size": 1, "dropout": 0.0},
        "objective": {"loss_weights": {"hard": 1.0}, "hidden_loss": "cosine", "layer_map": [-1] * model.n_iterations,
                      "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                   "temperature_decay": False}},
        "optim": {"epochs": 1000, "max_steps": None, "batch_size": args.batch_size, "lr": 1e-4, "weight_decay": 0.01,
                  "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10**6, "seed": 0},
        "note": "benchmark"}, f"benchmark.{tune}")
    r = build_run(f"bench-{tune}", model_cfg=model, run=run, loader_cfg=LoaderConfig(64, 4, 1), device=args.device,
                  tokens_dir=args.tokens, store_path=args.teacher_cache, prepared_dir=None, ckpt_dir=tmp / tune)
    r.trainable.train()
    return r


def batches(r: TrainingRun):
    while True:
        yield from r.data


def timed_steps(r: TrainingRun, source, n: int) -> float:
    """Seconds for n optimizer steps (data loading and collate included, as in training)."""
    if r.device.type == "cuda":
        torch.cuda.synchronize(r.device)
    t0 = time.perf_counter()
    for _ in range(n):
        src, rows, arrays = next(source)
        train_step(r, src, rows, arrays)
    if r.device.type == "cuda":
        torch.cuda.synchronize(r.device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["embedded", *MODELS], default="embedded")
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--tokens", type=Path, default=Path("data/tokens/wiki_pairs"))
    ap.add_argument("--teacher-cache", type=Path, default=Path("data/teacher/wiki_pairs.zarr"))
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5, help="steps per timed round")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (each times both runs)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    args = ap.parse_args()
    args.device = str(resolve_device(args.device))
    if args.threads:
        torch.set_num_threads(args.threads)
    model = model_config(args.model, args.params)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {tune: make_run(tune, model, args, Path(tmp)) for tune in ("full", "adapters")}
        sources = {tune: batches(r) for tune, r in runs.items()}
        for tune, r in runs.items():  # warm-up: allocator, lazy init, first blocks read
            timed_steps(r, sources[tune], 2)
        seconds: dict[str, list[float]] = {tune: [] for tune in runs}
        for _ in range(args.repeats):
            for tune, r in runs.items():
                seconds[tune].append(timed_steps(r, sources[tune], args.steps))
    print(f"MiniALBERT fine-tuning throughput: model {args.model} ({dataclasses.asdict(model)}), batch "
          f"{args.batch_size}, {args.tokens}, device {args.device}, {torch.get_num_threads()} threads, "
          f"{args.repeats} rounds of {args.steps} steps")
    print(f"{'tune':<10}{'trainable':>14}{'of total':>14}{'steps/s (median)':>20}{'rounds (s)':>30}")
    rate = {}
    for tune, r in runs.items():
        total = sum(p.numel() for p in r.student.parameters())
        trainable = sum(p.numel() for p in r.student.parameters() if p.requires_grad)
        rate[tune] = args.steps / statistics.median(seconds[tune])
        rounds = " ".join(f"{s:.2f}" for s in seconds[tune])
        print(f"{tune:<10}{trainable:>14,}{total:>14,}{rate[tune]:>20.2f}{rounds:>30}")
    ratio = rate["adapters"] / rate["full"]
    print(f"adapter tuning / full fine-tuning: {ratio:.2f}x steps/s ({(ratio - 1) * 100:+.0f}%; paper: ~+30%)")


if __name__ == "__main__":
    main()
