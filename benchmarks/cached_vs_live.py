"""A training epoch with the teacher's targets read from its cache vs the same epoch with the teacher run live.

For each seed's signal set of the embedded pipeline (the ``teacher_cache`` entry of ``params.yaml`` and the student
run that reads it, with its student, objective and batch size), on random rows of the dataset's length, with the
embedded MiniLM-L6 teacher (its head random where the pipeline fine-tunes one: only speed matters here): the same
run built twice by the library (:func:`distillpipe.train.build.build_run`), once on the store the build wrote and
once with ``LiveSettings`` (the run's ``teacher: models/teacher/<name>``), and one epoch of the library's own step
(:func:`distillpipe.train.loop.train_step`) each, interleaved, median of ``--repeats``. The two epochs read the same
rows in the same batches; the live one runs the capture on each.

Then both are projected to the GPU box of the machine benchmark (``--bench``, ``benchmarks/at_scale.py`` writes it),
by the formulas ``distillpipe plan`` uses (:func:`distillpipe.teacher.bench.cached_vs_live`): the rows/s a student's
epoch reads from this store on the benchmark's disk and on a 3 GB/s NVMe, against the rows/s of the live teacher
(the GPU's FLOP/s over the FLOPs of a row, :func:`distillpipe.teacher.plan.row_flops`).

Usage: python benchmarks/cached_vs_live.py [--device auto] [--rows 256] [--repeats 2] [--threads N]
                                          [--params params.yaml] [--bench benchmarks/results/at_scale.json] [--quick]
``--quick``: 64 rows, one repeat (a smoke run: its numbers mean little).
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")  # build_teacher_cache's progress bars would drown the table
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from _common import PAD, VOCAB, arguments, free, start

from distillpipe.assets import TOKENIZER_FILES, resolve_model, tokenizer_sha256
from distillpipe.config.base import build
from distillpipe.config.run import LoaderConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.data.schema import write_meta
from distillpipe.store.reader import open_store
from distillpipe.teacher.bench import cached_vs_live, load_bench
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.teacher.live import LiveSettings
from distillpipe.teacher.plan import row_flops
from distillpipe.teacher.rows import Rows
from distillpipe.train.build import TrainingRun, build_run
from distillpipe.train.loop import train_step

SETS = [
    # (what, teacher_cache dataset, (section, run) whose student, objective and batch, loss weights that replace the
    # run's (None: its own))
    ("CMOW/CBOW-Hybrid general distillation: MLM top-k", "wiki", ("train", "hybrid"), None),
    # the embedded WaLDORf run trains on the logits only; the paper's all-layer rows (Table 5 weights) read the
    # compact hidden states and scores that teacher_cache@wiki_qa keeps for them
    ("WaLDORf: QA logits, compact hidden states and scores", "wiki_qa", ("train", "waldorf-soft"),
     {"hard": 1.0, "soft": 1.0, "embedding": 1.0, "hidden": 1.2, "attn": 1.4}),
    ("MiniALBERT: MLM top-k, compact hidden states, probability factors", "wiki_mini", ("train", "minialbert"), None),
    ("CMOW/CBOW-Hybrid task distillation: logits", "polarity", ("finetune", "hybrid-polarity"), None),
]
HEAD_CLASS = {"mlm": "BertForMaskedLM", "qa": "BertForQuestionAnswering", "classification":
              "BertForSequenceClassification", "base": "BertModel"}
KIND = {"mlm": "mlm", "base": "mlm", "qa": "qa", "classification": "classification"}


def make_teacher(folder: Path, minilm: Path, head: str) -> Path:
    """MiniLM-L6 with the head's module (random where the pipeline trains it), its tokenizer files byte-identical."""
    import transformers

    torch.manual_seed(0)
    kw = {"num_labels": 2} if head == "classification" else {}
    getattr(transformers, HEAD_CLASS[head]).from_pretrained(minilm, **kw).save_pretrained(folder)
    for f in TOKENIZER_FILES:
        if (minilm / f).is_file():
            shutil.copy(minilm / f, folder / f)
    return folder


def make_tokens(folder: Path, teacher: Path, kind: str, n: int, n_dev: int, L: int, seed: int = 0) -> Path:
    """Random full-length rows ([CLS] body [SEP]) in the tokens format: an MLM corpus with 15% static [MASK]s, a
    binary classification task, or QA rows with a random answer span."""
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
                for p in pos:
                    ids[p] = 103
            elif kind == "qa":
                start = int(rng.integers(1, L - 4))
                rows.setdefault("start_positions", []).append(start)
                rows.setdefault("end_positions", []).append(start + int(rng.integers(0, 3)))
            else:
                rows.setdefault("label", []).append(int(rng.integers(0, 2)))
            rows["input_ids"].append(ids)
        return Dataset.from_dict(rows)

    DatasetDict({"train": split(n), "dev": split(n_dev)}).save_to_disk(str(folder))
    write_meta(folder, {"name": folder.name, "task_type": {"mlm": "corpus"}.get(kind, kind), "kind": kind,
                        "num_labels": 2 if kind == "classification" else 0,
                        "label_names": ["no", "yes"] if kind == "classification" else None,
                        "fingerprint": f"bench-{kind}-{n}-{L}-{seed}",
                        "tokenizer": {"spec": str(teacher), "sha256": tokenizer_sha256(teacher), "pad_id": PAD,
                                      "cls_id": 101, "sep_id": 102, "mask_id": 103, "vocab_size": VOCAB},
                        "max_seq_len": L, "params": {}, "summary": {}})
    return folder


def run_config(params: dict, section: str, name: str, dataset: str,
               loss_weights: dict[str, float] | None = None) -> TrainRunConfig:
    """The embedded run as a one-epoch ``train`` run on the benchmark's rows, every loss term on from the start (a
    finetune run: its objective and head on the student of the run it starts from)."""
    run = dict(params[section]["runs"][name])
    if section == "finetune":
        init = params["train"]["runs"][run["init"]]
        run = {k: v for k, v in run.items() if k not in ("init", "student", "tune")} | {"model": init["model"]}
    optim = {**run["optim"], "epochs": 1, "max_steps": None, "eval_every": 0, "patience": None,
             "checkpoint_minutes": 10**6}
    # every term on from the first step (a slow build would time its first phase's terms only)
    objective = {**run["objective"], "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                                  "temperature_decay": False}}
    if loss_weights is not None:
        objective["loss_weights"] = loss_weights
    return build(TrainRunConfig, {**run, "dataset": dataset, "teacher": f"data/teacher/{dataset}.zarr",
                                  "mlm_views": "static",
                                  "optim": optim, "objective": objective}, f"{section}.runs.{name}")


def epoch(r: TrainingRun, device: torch.device) -> float:
    """Seconds of one epoch of the library's step on a freshly built run."""
    r.trainable.train()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)
    sync()
    t = time.perf_counter()
    for source, rows, arrays in r.data:
        train_step(r, source, rows, arrays)
    sync()
    return time.perf_counter() - t


def bench_set(what: str, dataset: str, section: str, run_name: str, params: dict, tmp: Path, minilm: Path,
              device: torch.device, rows: int, repeats: int, bench,
              loss_weights: dict[str, float] | None = None) -> dict:
    tc = params["teacher_cache"]
    entry = build(TeacherCacheDatasetConfig, tc["datasets"][dataset], f"teacher_cache.datasets.{dataset}")
    L = (params["tokenize"]["datasets"][dataset].get("max_seq_len") or params["tokenize"]["max_seq_len"])
    teacher = make_teacher(tmp / "models" / "teacher" / f"{dataset}_{entry.head}", minilm, entry.head)
    kind = KIND[entry.head]
    tokens = make_tokens(tmp / "tokens" / dataset, teacher, kind, rows, 16, L)
    run = run_config(params, section, run_name, dataset, loss_weights)
    shard = 64
    loader = build(LoaderConfig, {"block_rows": 64, "buffer_blocks": 4, "streams": 1}, "loader")
    store = tmp / f"{dataset}.zarr"
    threads = torch.get_num_threads()
    t = time.perf_counter()
    build_teacher_cache(dataset, tokens, teacher, entry, str(device), tc["batch_size"], shard, store,
                        cpu_threads=threads)
    build_s = time.perf_counter() - t
    opened = open_store(store)
    row_bytes = opened.info()["bytes_per_row"]  # the rows' files, not the constants held once
    settings = LiveSettings(dataset, teacher, entry, tc["batch_size"], shard, threads)
    times: dict[str, list[float]] = {"cached": [], "live": []}
    setup: dict[str, float] = {}
    for i in range(repeats + 1):  # the first pair untimed: lazy inits, the allocator, first kernels
        for way, source in (("cached", store), ("live", settings)):
            t = time.perf_counter()
            r = build_run(f"{dataset}-{way}", model_cfg=run.model, run=run, loader_cfg=loader, device=str(device),
                          tokens_dir=tokens, store_path=source, prepared_dir=None, ckpt_dir=tmp / f"ck_{way}_{i}")
            setup[way] = time.perf_counter() - t
            s = epoch(r, device)
            if i:
                times[way].append(s)
            del r
            free(device)
    c, v = statistics.median(times["cached"]), statistics.median(times["live"])
    steps = -(-rows // run.optim.batch_size)
    spec = opened.manifest.signals
    config = json.loads((teacher / "config.json").read_text())
    masked = np.full(rows, int(0.15 * (L - 2))) if kind == "mlm" else None
    flops = row_flops(config, spec, entry.head, Rows(rows, "tokens", "", L, spec.mlm_max_masked,
                                                     np.full(rows, L), masked))
    gpu = cached_vs_live(flops, row_bytes, bench) if bench is not None else None
    return {"what": what, "dataset": dataset, "run": f"{section}.runs.{run_name}", "rows": rows, "L": L,
            "steps": steps, "build_s": build_s, "row_bytes": row_bytes, "cached_s": c, "live_s": v,
            "live_setup_s": setup["live"], "cached_setup_s": setup["cached"], "flops_per_row": flops, "gpu": gpu}


def report(res: dict) -> None:
    c, v, n = res["cached_s"], res["live_s"], res["steps"]
    print(f"\n   {res['what']} ({res['dataset']}: {res['run']}'s student and objective, L {res['L']})")
    print(f"     cache build (one-off)   {res['build_s']:7.2f} s   ({res['row_bytes'] / 1024:.1f} KiB/row on disk)")
    print(f"     epoch from the cache    {c:7.2f} s   ({n} steps, {1e3 * c / n:.0f} ms/step)")
    print(f"     epoch, teacher live     {v:7.2f} s   ({1e3 * v / n:.0f} ms/step; setup {res['live_setup_s']:.1f} s: "
          f"loading the teacher, fitting the constants)")
    print(f"     live / cached           {v / c:7.2f}x    here (the teacher's forward on this device each step)")
    g = res["gpu"]
    if g is None:
        print("     GPU box: no benchmark JSON with read figures (python benchmarks/at_scale.py writes it)")
        return
    faster = "live" if g["live_rows_per_s"] > g["cached_rows_per_s"] else "the cache"
    print(f"     GPU box (projected): live teacher {g['live_rows_per_s']:,.0f} rows/s "
          f"({res['flops_per_row'] / 1e9:.2f} GFLOP a row); this cache {g['cached_rows_per_s']:,.0f} rows/s from the "
          f"benchmark's disk ({g['cached_bound']}-bound, {g['cached_vs_live']:.2f}x live), "
          f"{g['nvme_rows_per_s']:,.0f} from a 3 GB/s NVMe ({g['nvme_vs_live']:.2f}x): {faster} is faster there")


def main() -> None:
    args = arguments(__doc__, **{
        "--rows": {"type": int, "default": 256, "help": "training rows (a multiple of 64)"},
        "--params": {"type": Path, "default": Path("params.yaml"), "help": "the params whose signal sets to time"},
        "--bench": {"type": Path, "default": Path("benchmarks/results/at_scale.json"),
                    "help": "machine benchmark JSON for the GPU-box projection"}}).parse_args()
    device = start(args)
    logging.getLogger("distillpipe.store.anchor").setLevel(logging.ERROR)  # temporary stores: unanchored, as meant
    rows, repeats = (64, 1) if args.quick else (args.rows, args.repeats)
    if rows < 64 or rows % 64:
        raise SystemExit(f"--rows must be a multiple of 64 (the loader's block rows), got {rows}")
    params = yaml.safe_load(args.params.read_text())
    bench = load_bench(args.bench)
    minilm = resolve_model("embedded:minilm-l6")
    print(f"\nOne training epoch, targets read from the teacher cache vs computed by the teacher live on each batch: "
          f"{rows} random rows, median of {repeats} (interleaved); the embedded MiniLM-L6 teacher")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for what, dataset, (section, name), weights in SETS:
            report(bench_set(what, dataset, section, name, params, Path(tmp), minilm, device, rows, repeats, bench,
                             weights))
    print("\n   A live epoch pays the teacher's forward on every step; a cached one pays reading the row. On a CPU the "
          "forward dominates;\n   on the GPU box the projection says which wins (distillpipe plan gives it per run).")
    print(f"\ndone in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
