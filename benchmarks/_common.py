"""What the student benchmarks share: the paper-size configs, timing helpers and the run header.

Not a benchmark itself (``make bench`` skips ``benchmarks/_*.py``); each script imports it from its own
folder, which Python puts on ``sys.path`` when it runs ``python benchmarks/<script>.py``.
"""

from __future__ import annotations

import argparse
import os

import torch

from distillpipe.evaluate.size import count_parameters
from distillpipe.evaluate.speed import measure_throughput
from distillpipe.runtime import autocast, resolve_device

VOCAB, PAD = 30522, 0  # BERT uncased vocabulary (the MiniLM teacher's)
CMOW_PAPER = {
    "student": "cmow_hybrid",
    "variant": "hybrid",
    "bidirectional": True,
    "d": 20,
    "d_vec": 400,
    "init_std": 0.01, "embedding_init": "random",
    "dropout": 0.1,
}
MLP_HEAD = {"type": "mlp", "hidden_size": 1000, "dropout": 0.1}  # CMOW paper Table XIII: 1,000 hidden units
WALDORF_TABLE1 = {
    "student": "waldorf",
    "embedding_size": 96,
    "conv_channels": [96, 192],
    "conv_kernel": 3,
    "d_model": 480,
    "n_layers": 8,
    "n_heads": 16,
    "d_ff": 1440,
    "dropout": 0.1,
    "init_std": 0.02, "embedding_init": "random",
}
MINIALBERT_128 = {"student": "minialbert", "embedding_size": 128, "d_model": 768, "n_heads": 12, "d_ff": 3072,
                  "n_iterations": 6, "adapter_size": 48, "max_position_embeddings": 512, "dropout": 0.1,
                  "init_std": 0.02,
                  "embedding_init": "random"}  # the paper's MiniALBERT-128 with adapters (Table 1: 12 M parameters)


def arguments(doc: str, **extra: dict) -> argparse.ArgumentParser:
    """The options every student benchmark has (device, repeats, threads, quick); ``extra``: name -> add_argument
    keywords of the script's own."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda[:i]")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--quick", action="store_true", help="small batches, rows and repeats: a smoke run")
    for name, kw in extra.items():
        ap.add_argument(name, **kw)
    return ap


def start(args: argparse.Namespace) -> torch.device:
    """Resolve the device, set the threads and print the header every benchmark prints."""
    import transformers

    transformers.logging.set_verbosity_error()  # "newly initialized weights": intended, only speed is measured
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    name = torch.cuda.get_device_name(device) if cuda else f"CPU, {os.cpu_count()} cores"
    print(
        f"device {device} ({name}), torch {torch.__version__}, transformers {transformers.__version__}, "
        f"torch threads {torch.get_num_threads()}{', QUICK (smoke run: numbers mean little)' if args.quick else ''}"
    )
    print("Ratios are measured side by side in this run; absolute numbers depend on the machine and its load.")
    load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    if not cuda and load > 0.5 * cores:
        print(
            f"Load average {load:.1f} on {cores} cores: other processes compete for the CPU, so timings are noisy "
            "(oversubscribed threads stall at every barrier; --threads 1 gives steadier numbers)."
        )
    return device


def timing(device: torch.device, repeats: int, quick: bool) -> dict:
    """measure_throughput settings: on a GPU one batch is mostly launch overhead, so time several per repeat."""
    cuda = device.type == "cuda"
    return {
        "warmup": 3 if cuda else 1,
        "repeats": repeats,
        "batches_per_repeat": (3 if quick else 10) if cuda else 1,
        "device": device,
    }


def throughput(forward, make_batch, batch_size: int, timing: dict) -> float:
    return measure_throughput(forward, make_batch, n_sequences_per_batch=batch_size, **timing).sentences_per_s


def hf_forward(model, device):
    def forward(batch):
        with autocast(device):
            return model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"].long(),
                token_type_ids=batch["token_type_ids"],
            )

    return forward


def student_forward(model, device):
    def forward(batch):
        with autocast(device):
            return model(batch)

    return forward


def params(model) -> str:
    c = count_parameters(model)
    return f"{c['total'] / 1e6:6.1f}M params ({c['without_embeddings'] / 1e6:.1f}M w/o embeddings)"


def bert(cls_name: str, device, **cfg):
    """A randomly initialised transformers BERT (sdpa attention), in eval mode on ``device``."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(attn_implementation="sdpa", **cfg)
    return getattr(transformers, cls_name)(config).eval().to(device)


def free(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
