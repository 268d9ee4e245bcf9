"""Student benchmarks: speed ratios measured side by side in one run (machines are noisy).

Prints
  1. inference speed, CMOW paper Table V protocol (random batches of ``--batch-size`` sequences of
     64 tokens, no grad, warm-up, median of ``--repeats``): the paper-size bidirectional CMOW/CBOW-Hybrid
     (d 20, d_vec 400, MLP head, sequence classification path) vs a random BERT-base
     (BertForSequenceClassification, sdpa) vs the embedded MiniLM-L6 teacher. Paper: 30.0k vs 4.6k
     sentences/s (6.5x) on a GPU;
  2. the associative scans of scan.py (prefix_products, tree_product) vs a python loop of matmuls on
     (B, L, 20, 20) for L 64 and 128, outputs checked equal;
  3. one training epoch reading teacher targets from the cache vs the same epoch with the teacher run
     live on every batch (capture_batch), for a general-distillation student (CMOW + MLM head, MiniLM
     hidden layer 6 pooled 4x) and a task-distillation student (classification, teacher logits);
     goal cached/live <= 0.2. The one-off cache build and a whole ``train_student`` run are reported too;
  4. WaLDORf (Table 1 sizes, QA head) vs a 4-layer TinyBERT-shaped and a BERT-base QA model at length 384.
     Paper (Table 2): 1.24x TinyBERT, 9.1x BERT-Base.

Usage: python benchmarks/students.py [--device auto] [--batch-size N] [--qa-batch-size N] [--repeats 3]
                                     [--rows 512] [--threads N] [--only 1,2,3,4] [--quick]
``--quick`` shrinks batches, rows and repeats for a smoke run (< 1 min on a 2-core CPU); its numbers mean
little. Every model is randomly initialised except the MiniLM teacher: only speed is measured.
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")  # train_student / build_teacher_cache progress bars would drown the table
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from distillpipe.assets import TOKENIZER_FILES, resolve_model, tokenizer_sha256
from distillpipe.config.base import build
from distillpipe.config.run import LoaderConfig
from distillpipe.config.students import CMOWHybridConfig, HeadConfig, WaLDORfConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.data.schema import write_meta
from distillpipe.evaluate.speed import measure_throughput, random_batch
from distillpipe.evaluate.student import count_parameters
from distillpipe.runtime import adamw, autocast, resolve_device, seed_everything
from distillpipe.students import build_student
from distillpipe.students.base import TaskSpec
from distillpipe.students.scan import prefix_products, tree_product
from distillpipe.teacher.capture import CaptureRequest, capture_batch
from distillpipe.teacher.load import load_teacher
from distillpipe.train.data import Source, collate
from distillpipe.train.loop import param_groups, task_spec, train_student
from distillpipe.train.objective import Objective, aligned_blocks, probe_student, store_names
from distillpipe.train.schedule import build_schedule

VOCAB, PAD = 30522, 0  # BERT uncased vocabulary (the MiniLM teacher's)
CMOW_PAPER = {
    "student": "cmow_hybrid",
    "variant": "hybrid",
    "bidirectional": True,
    "d": 20,
    "d_vec": 400,
    "init_std": 0.01,
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
    "init_std": 0.02,
}


# ------------------------------------------------------------------------------------------ helpers


def _timing(device: torch.device, repeats: int, quick: bool) -> dict:
    """measure_throughput settings: on a GPU one batch is mostly launch overhead, so time several per repeat."""
    cuda = device.type == "cuda"
    return {
        "warmup": 3 if cuda else 1,
        "repeats": repeats,
        "batches_per_repeat": (3 if quick else 10) if cuda else 1,
        "device": device,
    }


def _throughput(forward, make_batch, batch_size: int, timing: dict) -> float:
    return measure_throughput(forward, make_batch, n_sequences_per_batch=batch_size, **timing).sentences_per_s


def _hf_forward(model, device):
    def forward(batch):
        with autocast(device):
            return model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"].long(),
                token_type_ids=batch["token_type_ids"],
            )

    return forward


def _student_forward(model, device):
    def forward(batch):
        with autocast(device):
            return model(batch)

    return forward


def _params(model) -> str:
    c = count_parameters(model)
    return f"{c['total'] / 1e6:6.1f}M params ({c['without_embeddings'] / 1e6:.1f}M w/o embeddings)"


def _bert(cls_name: str, device, **cfg):
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(attn_implementation="sdpa", **cfg)
    return getattr(transformers, cls_name)(config).eval().to(device)


def _free(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ 1. inference


def bench_inference(device, batch_size: int, timing: dict) -> None:
    seq_len = 64
    print(
        f"\n1. Inference, CMOW paper Table V protocol: {batch_size} random sequences x {seq_len} tokens, no grad, "
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
            _throughput(_student_forward(cmow, device), make, batch_size, timing),
            _params(cmow),
        )
    }
    del cmow
    bert = _bert("BertForSequenceClassification", device)
    rates["BERT-base (random init, sdpa)"] = (
        _throughput(_hf_forward(bert, device), make, batch_size, timing),
        _params(bert),
    )
    del bert
    _free(device)
    minilm, _ = load_teacher("embedded:minilm-l6", "base", device)
    rates["MiniLM-L6 teacher (embedded)"] = (
        _throughput(_hf_forward(minilm, device), make, batch_size, timing),
        _params(minilm),
    )
    del minilm
    _free(device)
    cmow_rate = next(iter(rates.values()))[0]
    for name, (rate, params) in rates.items():
        print(f"   {name:42s} {rate:9.1f} sentences/s  CMOW speed-up {cmow_rate / rate:6.1f}x   {params}")
    print("   paper (GPU, batch 256): CMOW/CBOW-Hybrid 30.0k vs BERT-base 4.6k sentences/s -> 6.5x")


# ------------------------------------------------------------------------------------------ 2. scans


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
        f"\n2. Parallel scan (scan.py) vs a python loop of matmuls, X (B={batch_size}, L, {d}, {d}) = I + N(0, 0.01^2)"
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
            t_fast = batch_size / _throughput(lambda bt, f=fast: f(bt["X"]), make, batch_size, timing)
            t_slow = batch_size / _throughput(lambda bt, f=slow: f(bt["X"]), make, batch_size, timing)
            print(
                f"   L {L:3d} {name:16s} scan {1e3 * t_fast:8.2f} ms  loop {1e3 * t_slow:8.2f} ms  "
                f"-> {t_slow / t_fast:5.1f}x   (equal: max |diff| {err:.1e})"
            )


# ------------------------------------------------------------------------------------------ 3. training


def _tok_meta(model_dir: Path) -> dict:
    return {
        "spec": str(model_dir),
        "sha256": tokenizer_sha256(model_dir),
        "pad_id": PAD,
        "cls_id": 101,
        "sep_id": 102,
        "mask_id": 103,
        "vocab_size": VOCAB,
    }


def make_tokens(folder: Path, model_dir: Path, kind: str, n: int, n_dev: int, L: int, seed: int = 0) -> Path:
    """Random full-length rows (L tokens: [CLS] body [SEP]) in the tokens format: an MLM corpus with 15%
    static [MASK]s, or a binary classification task with random labels."""
    from datasets import Dataset, DatasetDict

    rng = np.random.default_rng(seed)

    def split(m: int) -> Dataset:
        rows: dict[str, list] = {"input_ids": [], "token_type_ids": [], "length": []}
        for i in range(m):
            ids = [101] + rng.integers(1000, 29000, size=L - 2).tolist() + [102]
            rows["token_type_ids"].append([0] * L)
            rows["length"].append(L)
            if kind == "mlm":
                pos = sorted(rng.choice(np.arange(1, L - 1), size=int(0.15 * (L - 2)), replace=False).tolist())
                rows.setdefault("masked_positions", []).append(pos)
                rows.setdefault("masked_labels", []).append([ids[p] for p in pos])
                rows.setdefault("block_id", []).append(i)
                rows.setdefault("view", []).append(0)
                for p in pos:
                    ids[p] = 103
            else:
                rows.setdefault("label", []).append(int(rng.integers(0, 2)))
                rows.setdefault("example_id", []).append(f"ex{i}")
            rows["input_ids"].append(ids)
        return Dataset.from_dict(rows)

    DatasetDict({"train": split(n), "dev": split(n_dev)}).save_to_disk(str(folder))
    mlm = kind == "mlm"
    write_meta(
        folder,
        {
            "name": f"bench_{kind}",
            "task_type": "corpus" if mlm else "classification",
            "kind": kind,
            "num_labels": 0 if mlm else 2,
            "label_names": None if mlm else ["no", "yes"],
            "fingerprint": f"bench-{kind}-{n}-{L}-{seed}",
            "tokenizer": _tok_meta(model_dir),
            "max_seq_len": L,
            "params": {},
            "summary": {},
        },
    )
    return folder


def make_classification_teacher(folder: Path, minilm_dir: Path) -> Path:
    """MiniLM-L6 with a randomly initialised classification head (only speed matters here)."""
    import transformers

    transformers.logging.set_verbosity_error()  # "newly initialized weights": intended
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    model.save_pretrained(folder)
    for f in TOKENIZER_FILES:  # byte-identical tokenizer files: the same tokenizer sha as the tokens
        if (minilm_dir / f).is_file():
            shutil.copy(minilm_dir / f, folder / f)
    return folder


class Case:
    """One student + dataset + teacher cache, and everything its two training epochs need."""

    def __init__(
        self,
        label: str,
        tmp: Path,
        tokens: Path,
        store: Path,
        teacher_dir: Path,
        head: str,
        run: TrainRunConfig,
        loader: LoaderConfig,
        device: torch.device,
    ):
        self.label, self.tmp, self.tokens, self.store = label, tmp, tokens, store
        self.teacher_dir, self.head, self.run, self.loader, self.device = teacher_dir, head, run, loader, device
        self.teacher = None

    def _setup(self) -> tuple:
        """Fresh student, objective, optimizer and schedule (not timed), the way train_student builds them."""
        from datasets import load_from_disk

        from distillpipe.data.schema import read_meta
        from distillpipe.store.reader import open_store

        opt = self.run.optim
        meta = read_meta(self.tokens)
        signals = open_store(self.store).manifest.signals
        task = task_spec(meta, self.run, signals)
        seed_everything(opt.seed)
        model = build_student(self.run.model, task).to(self.device)
        rows = load_from_disk(str(self.tokens))["train"]
        source = Source(
            self.label,
            self.tokens,
            self.store,
            store_names(self.run.objective, task.kind, signals),
            batch_size=opt.batch_size,
            seed=opt.seed,
            block_rows=self.loader.block_rows,
            buffer_blocks=self.loader.buffer_blocks,
            streams=self.loader.streams,
        )
        cols = rows.select_columns(source.columns)
        probe, _ = collate(
            cols[:2], None, kind=task.kind, pad_id=task.pad_id, labeled=True, pairs=False, pool=signals.pool
        )
        dims = probe_student(model, {k: v.to(self.device) for k, v in probe.items()})
        objective = Objective(self.run.objective, kind=task.kind, signals=signals, dims=dims).to(self.device)
        optimizer = adamw(param_groups([model, objective], opt.weight_decay), lr=opt.lr)
        schedule = build_schedule(
            self.run.objective.schedule, blocks=aligned_blocks(self.run.objective), total_steps=len(source.loader)
        )
        model.train()
        return task, signals, model, source, cols, objective, optimizer, schedule

    def _step(self, step: int, batch, targets, model, objective, optimizer, schedule) -> None:
        """One optimizer step exactly as train_student's loop makes it."""
        for g in optimizer.param_groups:
            g["lr"] = self.run.optim.lr * schedule.lr_factor(step)
        with autocast(self.device):
            out = model(batch, return_hidden=objective.needs_hidden)
            loss, _ = objective(
                out, targets, multipliers=schedule.weights(step), temperature=schedule.temperature(step)
            )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(
            [p for g in optimizer.param_groups for p in g["params"]], self.run.optim.max_grad_norm
        )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # the loop logs it every step (a device sync)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def cached_epoch(self, max_steps: int | None = None) -> tuple[float, list[list[int]], dict]:
        """(seconds, the epoch's row batches, the first batch's teacher targets): targets read from the cache."""
        task, signals, model, source, cols, objective, optimizer, schedule = self._setup()
        order, first = [], {}
        self._sync()
        t = time.perf_counter()
        for step, (row_index, arrays) in enumerate(source.loader):
            rows = cols[row_index.tolist()]
            batch, targets = collate(
                rows,
                arrays,
                kind=task.kind,
                pad_id=task.pad_id,
                labeled=source.info.labeled,
                pairs=False,
                pool=signals.pool,
            )
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            targets = {k: v.to(self.device, non_blocking=True) for k, v in targets.items()}
            self._step(step, batch, targets, model, objective, optimizer, schedule)
            order.append(row_index.tolist())
            if step == 0:
                first = {k: v.detach().cpu() for k, v in targets.items() if k in arrays}
            if max_steps is not None and step + 1 >= max_steps:
                break
        self._sync()
        return time.perf_counter() - t, order, first

    def live_epoch(self, order: list[list[int]]) -> tuple[float, dict]:
        """(seconds, the first batch's teacher targets): the same batches, the teacher run on each of them."""
        if self.teacher is None:
            self.teacher, _ = load_teacher(self.teacher_dir, self.head, self.device)
        task, signals, model, _, cols, objective, optimizer, schedule = self._setup()
        request = CaptureRequest.from_signal_spec(signals)
        first = {}
        self._sync()
        t = time.perf_counter()
        for step, idx in enumerate(order):
            batch, targets = collate(
                cols[idx], None, kind=task.kind, pad_id=task.pad_id, labeled=True, pairs=False, pool=signals.pool
            )
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            targets = {k: v.to(self.device, non_blocking=True) for k, v in targets.items()}
            inputs = {
                "input_ids": batch["input_ids"],
                "token_type_ids": batch["token_type_ids"],
                "attention_mask": batch["attention_mask"].long(),
            }
            live = capture_batch(self.teacher, inputs, request)  # fp16, as cached; (B, ceil(T/p), d) / (B, C)
            for name, v in live.items():
                if name != "length":  # float32 copies: inference tensors cannot be saved for backward
                    targets[name] = v.to(torch.float32, copy=True)
            self._step(step, batch, targets, model, objective, optimizer, schedule)
            if step == 0:
                first = {k: targets[k].detach().cpu() for k in live if k != "length"}
        self._sync()
        return time.perf_counter() - t, first

    def train_student_seconds(self) -> float:
        """Wall time of a whole one-epoch train_student run (setup, epoch, dev evaluation, checkpoint, save)."""
        out = self.tmp / f"run_{self.label}"
        t = time.perf_counter()
        train_student(
            self.label,
            model_cfg=self.run.model,
            run=self.run,
            loader_cfg=self.loader,
            device=str(self.device),
            tokens_dir=self.tokens,
            store_path=self.store,
            prepared_dir=None,
            out_dir=out / "student",
            ckpt_dir=out / "ckpt",
            live_dir=out / "plots",
        )
        return time.perf_counter() - t


def _run_cfg(model: dict, dataset: str, head: dict | None, weights: dict, layer_map: list[int], batch_size: int):
    schedule = {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0, "temperature_decay": False}
    return build(
        TrainRunConfig,
        {
            "dataset": dataset,
            "model": model,
            "encoding": "joint",
            "head": head,
            "objective": {"loss_weights": weights, "hidden_loss": "mse", "layer_map": layer_map, "schedule": schedule},
            "optim": {
                "epochs": 1,
                "max_steps": None,
                "batch_size": batch_size,
                "lr": 1e-3,
                "weight_decay": 0.01,
                "max_grad_norm": 1.0,
                "eval_every": 0,
                "patience": None,
                "checkpoint_every": 10**6,
                "seed": 0,
            },
            "note": "benchmark",
        },
        "runs.bench",
    )


def bench_training(device, rows: int, L: int, batch_size: int, repeats: int, student: dict) -> None:
    shard = 256 if rows % 256 == 0 else 64  # the loader's blocks (64 rows) must divide the store's shards
    print(
        f"\n3. One training epoch, targets from the teacher cache vs the teacher run live on each batch: {rows} "
        f"random rows x {L} tokens, batch {batch_size}, median of {repeats} (interleaved)"
    )
    if student != CMOW_PAPER:
        print(f"   (quick: a small CMOW/CBOW-Hybrid, d {student['d']}, d_vec {student['d_vec']}, not the paper's size)")
    if rows < 64 or rows % 64:
        raise SystemExit(f"--rows must be a multiple of 64 (the loader's block rows), got {rows}")
    minilm = resolve_model("embedded:minilm-l6")
    loader = build(LoaderConfig, {"block_rows": 64, "buffer_blocks": 4, "streams": 1}, "loader")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        clf_teacher = make_classification_teacher(tmp / "clf_teacher", minilm)
        mlm_signals = {
            "logits": False,
            "mlm_topk": 0,
            "hidden_layers": [6],
            "attn_layers": [],
            "pool": 4,
            "attn_probs": False,
            "embeddings": False,
        }
        cls_signals = {**mlm_signals, "logits": True, "hidden_layers": [], "pool": 1}
        cases = [
            (
                "general",
                "mlm",
                minilm,
                "base",
                mlm_signals,
                _run_cfg(student, "bench_mlm", None, {"hard": 0.5, "hidden": 0.5}, [6], batch_size),
                (
                    "general distillation: CMOW/CBOW-Hybrid + MLM head; MLM CE at the static masks + hidden MSE to "
                    "MiniLM layer 6 (pooled 4x)"
                ),
            ),
            (
                "task",
                "classification",
                clf_teacher,
                "classification",
                cls_signals,
                _run_cfg(student, "bench_cls", MLP_HEAD, {"hard": 0.5, "soft": 0.5}, [-1], batch_size),
                (
                    "task distillation: CMOW/CBOW-Hybrid + MLP head; CE + soft CE to the logits of MiniLM with a "
                    "random classification head"
                ),
            ),
        ]
        for label, kind, teacher_dir, head, sig, run, what in cases:
            tokens = make_tokens(tmp / f"tokens_{kind}", teacher_dir, kind, rows, 16, L)
            store = tmp / f"{kind}.zarr"
            cfg = build(
                TeacherCacheDatasetConfig,
                {"teacher": "t", "head": head, "split": "train", "max_rows": None, "signals": sig},
                "teacher_cache.datasets.bench",
            )
            t = time.perf_counter()
            build_cache_summary = _build_cache(label, tokens, teacher_dir, cfg, device, batch_size, shard, store)
            cache_s = time.perf_counter() - t
            case = Case(label, tmp, tokens, store, teacher_dir, head, run, loader, device)
            _, warm_order, _ = case.cached_epoch(max_steps=1)  # untimed: lazy inits, allocator, first kernels
            case.live_epoch(warm_order)
            cached, live, diffs = [], [], []
            for r in range(repeats):
                s, order, first_cached = case.cached_epoch()
                cached.append(s)
                s, first_live = case.live_epoch(order)
                live.append(s)
                if r == 0:
                    diffs = [
                        (k, (first_cached[k] - first_live[k]).abs().max().item(), first_cached[k].abs().max().item())
                        for k in first_cached
                    ]
            whole = case.train_student_seconds()
            c, v = statistics.median(cached), statistics.median(live)
            steps = len(order)
            print(f"   {what}")
            print(f"     cache build (one-off)      {cache_s:7.2f} s   ({build_cache_summary})")
            print(f"     epoch from the cache       {c:7.2f} s   ({steps} steps, {1e3 * c / steps:.0f} ms/step)")
            print(f"     epoch, teacher live        {v:7.2f} s   ({1e3 * v / steps:.0f} ms/step)")
            print(f"     ratio cached/live          {c / v:7.2f}     (goal <= 0.2)")
            print(
                f"     whole train_student run    {whole:7.2f} s   (1 epoch + setup, dev evaluation, checkpoint, "
                f"save; ratio to live epoch {whole / v:.2f})"
            )
            teacher_s = max(v - c, 0.0)  # the teacher's share of the live epoch
            print(
                "     extrapolated by encoder size (an estimate, not a measurement): teacher live time x7.9 "
                f"(BERT-base) -> ratio {c / (c + 7.9 * teacher_s):.2f}, x28 (BERT-large) -> "
                f"{c / (c + 28 * teacher_s):.2f}"
            )
            print(
                "     live targets = cached targets (first batch): "
                + ", ".join(f"{k} max |diff| {e:.1e} (max |x| {m:.2g})" for k, e, m in diffs)
            )
            case.teacher = None
            _free(device)
    print(
        "   The embedded teacher is MiniLM-L6 (22M params, 6 x 384): with BERT-base/large teachers the live epoch "
        "costs far more,\n   so these ratios are a lower bound of the cache's benefit."
    )


def _build_cache(label, tokens, teacher_dir, cfg, device, batch_size, shard, store) -> str:
    from distillpipe.teacher.cache import build_teacher_cache

    s = build_teacher_cache(label, tokens, teacher_dir, cfg, str(device), batch_size, shard, store,
                            cpu_threads=torch.get_num_threads())
    return f"{s.computed_rows} rows, {s.store.bytes_on_disk / max(s.store.rows, 1) / 1024:.1f} KiB/row on disk"


# ------------------------------------------------------------------------------------------ 4. WaLDORf


def bench_waldorf(device, batch_size: int, timing: dict) -> None:
    seq_len = 384
    print(
        f"\n4. QA inference (WaLDORf issue 6): {batch_size} random sequences x {seq_len} tokens, no grad, "
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
            _throughput(_student_forward(waldorf, device), make, batch_size, timing),
            _params(waldorf),
        )
    }
    del waldorf
    tiny = _bert(
        "BertForQuestionAnswering",
        device,
        hidden_size=312,
        num_hidden_layers=4,
        num_attention_heads=12,
        intermediate_size=1200,
        max_position_embeddings=512,
    )
    rates["TinyBERT-4 shape (4 x 312)"] = (
        _throughput(_hf_forward(tiny, device), make, batch_size, timing),
        _params(tiny),
    )
    del tiny
    base = _bert("BertForQuestionAnswering", device, max_position_embeddings=512)
    rates["BERT-base QA (random init)"] = (
        _throughput(_hf_forward(base, device), make, batch_size, timing),
        _params(base),
    )
    del base
    _free(device)
    w = next(iter(rates.values()))[0]
    for name, (rate, params) in rates.items():
        print(f"   {name:42s} {rate:9.1f} sequences/s  WaLDORf speed-up {w / rate:5.2f}x   {params}")
    print("   paper (Table 2): WaLDORf 1.24x TinyBERT, 9.1x BERT-Base")


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda[:i]")
    ap.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="sequences per batch for 1 and 2 (default 256 on CUDA, as in the paper; 64 on CPU)",
    )
    ap.add_argument("--qa-batch-size", type=int, default=None, help="batch for 4 (default 32 on CUDA, 8 on CPU)")
    ap.add_argument("--train-batch-size", type=int, default=32, help="batch for 3")
    ap.add_argument("--rows", type=int, default=512, help="training rows for 3 (a multiple of 64)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--only", default="1,2,3,4", help="comma-separated sections to run")
    ap.add_argument("--quick", action="store_true", help="small batches, rows and repeats: a smoke run")
    args = ap.parse_args()

    import transformers

    transformers.logging.set_verbosity_error()
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    if args.quick:
        batch, qa_batch = args.batch_size or 4, args.qa_batch_size or 1
        rows, train_len, train_batch, repeats = 64, 64, 32, 1
        student = {**CMOW_PAPER, "d": 8, "d_vec": 64}
    else:
        batch, qa_batch = args.batch_size or (256 if cuda else 64), args.qa_batch_size or (32 if cuda else 8)
        rows, train_len, train_batch, repeats = args.rows, 128, args.train_batch_size, args.repeats
        student = CMOW_PAPER
    only = {int(s) for s in args.only.split(",")}
    timing = _timing(device, repeats, args.quick)

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
    t0 = time.perf_counter()
    if 1 in only:
        bench_inference(device, batch, timing)
    if 2 in only:
        bench_scans(device, batch, timing)
    if 3 in only:
        bench_training(device, rows, train_len, train_batch, repeats, student)
    if 4 in only:
        bench_waldorf(device, qa_batch, timing)
    print(f"\ndone in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
