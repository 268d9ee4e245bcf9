"""One training epoch reading teacher targets from the cache vs the same epoch with the teacher run live.

For a general-distillation student (CMOW/CBOW-Hybrid + MLM head: MLM CE at the static masks + hidden MSE to
MiniLM-L6 layer 6, pooled 4x) and a task-distillation student (CMOW/CBOW-Hybrid + MLP head: CE + soft CE to
the logits of MiniLM with a random classification head), on random rows: the same batches, the same
library training step (:func:`distillpipe.train.loop.train_step`), the targets either read from the cache
or computed by the teacher on each batch (:func:`distillpipe.teacher.capture.capture_batch`). Goal
cached/live <= 0.2. The one-off cache build and a whole ``train_student`` run are reported too.

Usage: python benchmarks/cached_vs_live.py [--device auto] [--rows 512] [--batch-size 32] [--repeats 3]
                                          [--threads N] [--quick]
``--quick``: 64 rows of 64 tokens, a small CMOW, one repeat (a smoke run: its numbers mean little).
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")  # train_student / build_teacher_cache progress bars would drown the table
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import CMOW_PAPER, MLP_HEAD, PAD, VOCAB, arguments, free, start

from distillpipe.assets import TOKENIZER_FILES, resolve_model, tokenizer_sha256
from distillpipe.config.base import build
from distillpipe.config.run import LoaderConfig
from distillpipe.config.students import CMOWHybridConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.data.collate import collate
from distillpipe.data.schema import write_meta
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.teacher.capture import capture_batch, to_host
from distillpipe.teacher.load import load_teacher
from distillpipe.train.build import TrainingRun, build_run
from distillpipe.train.loop import train_step, train_student

# ------------------------------------------------------------------------------------------ fixtures


def _tok_meta(model_dir: Path) -> dict:
    return {"spec": str(model_dir), "sha256": tokenizer_sha256(model_dir), "pad_id": PAD, "cls_id": 101,
            "sep_id": 102, "mask_id": 103, "vocab_size": VOCAB}


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
    write_meta(folder, {"name": f"bench_{kind}", "task_type": "corpus" if mlm else "classification", "kind": kind,
                        "num_labels": 0 if mlm else 2, "label_names": None if mlm else ["no", "yes"],
                        "fingerprint": f"bench-{kind}-{n}-{L}-{seed}", "tokenizer": _tok_meta(model_dir),
                        "max_seq_len": L, "params": {}, "summary": {}})
    return folder


def make_classification_teacher(folder: Path, minilm_dir: Path) -> Path:
    """MiniLM-L6 with a randomly initialised classification head (only speed matters here)."""
    import transformers

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    model.save_pretrained(folder)
    for f in TOKENIZER_FILES:  # byte-identical tokenizer files: the same tokenizer sha as the tokens
        if (minilm_dir / f).is_file():
            shutil.copy(minilm_dir / f, folder / f)
    return folder


def run_config(model: dict, dataset: str, head: dict | None, weights: dict, layer_map: list[int],
               batch_size: int) -> TrainRunConfig:
    schedule = {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0, "temperature_decay": False}
    optim = {"epochs": 1, "max_steps": None, "batch_size": batch_size, "lr": 1e-3, "weight_decay": 0.01,
             "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10**6, "seed": 0}
    return build(TrainRunConfig, {"dataset": dataset, "teacher": f"data/teacher/{dataset}.zarr", "model": model,
                                  "encoding": "joint", "head": head,
                                  "objective": {"loss_weights": weights, "hidden_loss": "mse", "layer_map": layer_map,
                                                "schedule": schedule},
                                  "optim": optim, "note": "benchmark"}, "runs.bench")


# ------------------------------------------------------------------------------------------ the two epochs


class Case:
    """One student + dataset + teacher cache, and its two kinds of training epoch."""

    def __init__(self, label: str, tmp: Path, tokens: Path, store: Path, teacher_dir: Path, head: str,
                 run: TrainRunConfig, loader: LoaderConfig, device: torch.device):
        self.label, self.tmp, self.tokens, self.store = label, tmp, tokens, store
        self.teacher_dir, self.head, self.run, self.loader, self.device = teacher_dir, head, run, loader, device
        self.teacher = None
        self.builds = 0

    def _fresh(self) -> TrainingRun:
        """A fresh run (student, objective, optimizer, schedule, data) exactly as train_student builds it: not timed."""
        self.builds += 1
        r = build_run(self.label, model_cfg=self.run.model, run=self.run, loader_cfg=self.loader,
                      device=str(self.device), tokens_dir=self.tokens, store_path=self.store, prepared_dir=None,
                      ckpt_dir=self.tmp / f"ckpt_{self.label}_{self.builds}")
        r.trainable.train()
        return r

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def cached_epoch(self, max_steps: int | None = None) -> tuple[float, list[dict], dict]:
        """(seconds, the epoch's token rows batch by batch, the first batch's cached targets)."""
        r = self._fresh()
        batches, first = [], {}
        self._sync()
        t = time.perf_counter()
        for source, rows, arrays in r.data:
            train_step(r, source, rows, arrays)
            batches.append(rows)
            if not first:
                first = {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()}
            if max_steps is not None and r.step >= max_steps:
                break
        self._sync()
        return time.perf_counter() - t, batches, first

    def live_epoch(self, batches: list[dict]) -> tuple[float, dict]:
        """(seconds, the first batch's live targets): the same batches and steps, the teacher run on each batch.

        The one thing the library's loop cannot do, kept here: the targets come from the teacher instead of the
        store. They go through the same step as cached ones (``train_step`` collates host arrays and uploads
        them), so on CUDA the live epoch also copies its targets to the host (``to_host``, one sync per batch),
        bytes the cached epoch reads from disk instead."""
        if self.teacher is None:
            self.teacher, _ = load_teacher(self.teacher_dir, self.head, self.device)
        r = self._fresh()
        source = r.sources[0]
        spec = source.info.signals
        first = {}
        self._sync()
        t = time.perf_counter()
        for rows in batches:
            batch, _ = collate(rows, kind=r.task.kind, pad_id=r.task.pad_id, labeled=True, pairs=False)
            batch["attention_mask"] = batch["attention_mask"].long()
            arrays = to_host(capture_batch(self.teacher, batch, spec))  # fp16, as cached; batch-length shapes
            train_step(r, source, rows, arrays)
            if not first:
                first = {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()}
        self._sync()
        return time.perf_counter() - t, first

    def train_student_seconds(self) -> float:
        """Wall time of a whole one-epoch train_student run (setup, epoch, dev evaluation, checkpoint, save)."""
        out = self.tmp / f"run_{self.label}"
        t = time.perf_counter()
        train_student(self.label, model_cfg=self.run.model, run=self.run, loader_cfg=self.loader,
                      device=str(self.device), tokens_dir=self.tokens, store_path=self.store, prepared_dir=None,
                      out_dir=out / "student", ckpt_dir=out / "ckpt", live_dir=out / "live")
        return time.perf_counter() - t


def bench_training(device, rows: int, L: int, batch_size: int, repeats: int, student: dict) -> None:
    shard = 256 if rows % 256 == 0 else 64  # the loader's blocks (64 rows) must divide the store's shards
    print(f"\nOne training epoch, targets from the teacher cache vs the teacher run live on each batch: {rows} "
          f"random rows x {L} tokens, batch {batch_size}, median of {repeats} (interleaved)")
    if student != CMOW_PAPER:
        print(f"   (quick: a small CMOW/CBOW-Hybrid, d {student['d']}, d_vec {student['d_vec']}, not the paper's size)")
    if rows < 64 or rows % 64:
        raise SystemExit(f"--rows must be a multiple of 64 (the loader's block rows), got {rows}")
    build(CMOWHybridConfig, student, "model")  # a wrong student config fails here, before the caches are built
    minilm = resolve_model("embedded:minilm-l6")
    loader = build(LoaderConfig, {"block_rows": 64, "buffer_blocks": 4, "streams": 1}, "loader")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        clf_teacher = make_classification_teacher(tmp / "clf_teacher", minilm)
        mlm_signals = {"logits": False, "mlm_topk": 0, "hidden_layers": [6], "attn_layers": [], "pool": 4,
                       "attn_probs": False, "embeddings": False, "hidden_rank": None, "hidden_fit_rows": 256,
                       "attn_rank": None, "precision": {"hidden": "float16", "attention": "float16",
                                                        "mlm_topk": "float16"}}
        cls_signals = {**mlm_signals, "logits": True, "hidden_layers": [], "pool": 1}
        cases = [
            ("general", "mlm", minilm, "base", mlm_signals,
             run_config(student, "bench_mlm", None, {"hard": 0.5, "hidden": 0.5}, [6], batch_size),
             "general distillation: CMOW/CBOW-Hybrid + MLM head; MLM CE at the static masks + hidden MSE to "
             "MiniLM layer 6 (pooled 4x)"),
            ("task", "classification", clf_teacher, "classification", cls_signals,
             run_config(student, "bench_cls", MLP_HEAD, {"hard": 0.5, "soft": 0.5}, [-1], batch_size),
             "task distillation: CMOW/CBOW-Hybrid + MLP head; CE + soft CE to the logits of MiniLM with a "
             "random classification head"),
        ]
        for label, kind, teacher_dir, head, sig, run, what in cases:
            tokens = make_tokens(tmp / f"tokens_{kind}", teacher_dir, kind, rows, 16, L)
            store = tmp / f"{kind}.zarr"
            cfg = build(TeacherCacheDatasetConfig,
                        {"teacher": "t", "head": head, "split": "train", "max_rows": None, "signals": sig},
                        "teacher_cache.datasets.bench")
            t = time.perf_counter()
            s = build_teacher_cache(label, tokens, teacher_dir, cfg, str(device), batch_size, shard, store,
                                    cpu_threads=torch.get_num_threads())
            cache_s = time.perf_counter() - t
            built = f"{s.computed_rows} rows, {s.store.bytes_on_disk / max(s.store.rows, 1) / 1024:.1f} KiB/row on disk"
            case = Case(label, tmp, tokens, store, teacher_dir, head, run, loader, device)
            _, warm, _ = case.cached_epoch(max_steps=1)  # untimed: lazy inits, allocator, first kernels
            case.live_epoch(warm)
            cached, live, diffs = [], [], []
            for r in range(repeats):
                s_cached, batches, first_cached = case.cached_epoch()
                cached.append(s_cached)
                s_live, first_live = case.live_epoch(batches)
                live.append(s_live)
                if r == 0:
                    diffs = [(k, float(np.abs(first_cached[k] - first_live[k]).max()),
                              float(np.abs(first_cached[k]).max())) for k in first_live if k != "length"]
            whole = case.train_student_seconds()
            c, v = statistics.median(cached), statistics.median(live)
            steps = len(batches)
            print(f"   {what}")
            print(f"     cache build (one-off)      {cache_s:7.2f} s   ({built})")
            print(f"     epoch from the cache       {c:7.2f} s   ({steps} steps, {1e3 * c / steps:.0f} ms/step)")
            print(f"     epoch, teacher live        {v:7.2f} s   ({1e3 * v / steps:.0f} ms/step)")
            print(f"     ratio cached/live          {c / v:7.2f}     (goal <= 0.2)")
            print(f"     whole train_student run    {whole:7.2f} s   (1 epoch + setup, dev evaluation, checkpoint, "
                  f"save; ratio to live epoch {whole / v:.2f})")
            teacher_s = max(v - c, 0.0)  # the teacher's share of the live epoch
            print("     extrapolated by encoder size (an estimate, not a measurement): teacher live time x7.9 "
                  f"(BERT-base) -> ratio {c / (c + 7.9 * teacher_s):.2f}, x28 (BERT-large) -> "
                  f"{c / (c + 28 * teacher_s):.2f}")
            print("     live targets = cached targets (first batch): "
                  + ", ".join(f"{k} max |diff| {e:.1e} (max |x| {m:.2g})" for k, e, m in diffs))
            case.teacher = None
            free(device)
    print("   The embedded teacher is MiniLM-L6 (22M params, 6 x 384): with BERT-base/large teachers the live epoch "
          "costs far more,\n   so these ratios are a lower bound of the cache's benefit.")


def main() -> None:
    args = arguments(__doc__, **{"--batch-size": {"type": int, "default": 32, "help": "training batch"},
                                 "--rows": {"type": int, "default": 512, "help": "training rows (a multiple of 64)"}}
                     ).parse_args()
    device = start(args)
    if args.quick:
        rows, seq_len, repeats, student = 64, 64, 1, {**CMOW_PAPER, "d": 8, "d_vec": 64}
    else:
        rows, seq_len, repeats, student = args.rows, 128, args.repeats, CMOW_PAPER
    t0 = time.perf_counter()
    bench_training(device, rows, seq_len, args.batch_size, repeats, student)
    print(f"\ndone in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
