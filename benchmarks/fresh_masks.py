"""Fresh MLM masks each epoch against the static views, paired by seed, on the embedded CMOW/CBOW-Hybrid.

The embedded general distillation (``train.runs.hybrid``: MLM CE at the masks + the teacher's top-k MLM KD, the
``wiki`` corpus: ``--rows`` of its rows, evenly spaced as the entry's ``max_rows`` picks them), trained for
``--epochs`` epochs with the teacher live, twice per
seed: ``mlm_views: static`` (each block's K static views every epoch: the targets a cache holds) and ``fresh``
(every block masked anew each epoch, the teacher scoring the new masks). Scored on the dev split at its static
masks (the run's own dev evaluation: masked-token loss and accuracy), the same for both. Prints each seed's pair,
and the mean paired difference with its 95% t-interval (SciPy).

Needs a repository where the embedded pipeline ran (``data/tokens/wiki``, ``models/teacher/wiki``: ``make repro``).
Usage: python benchmarks/fresh_masks.py --repo . [--params params.yaml] [--rows 256] [--epochs 8] [--seeds 0,1,2]
                                         [--quick]
(~25 minutes on 2 CPU cores: the live MiniLM forward is most of a step.) ``--quick``: 64 rows, 2 epochs, one seed.
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from scipy import stats

from distillpipe.config.base import build
from distillpipe.config.run import LoaderConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.teacher.live import LiveSettings
from distillpipe.train.loop import train_student

METRICS = ("mlm_loss", "mlm_accuracy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=Path("."), help="where data/tokens/wiki and models/teacher/wiki are")
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--run", default="hybrid", help="the train run (its dataset an MLM corpus)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--rows", type=int, default=256, help="the corpus rows trained on (the entry's max_rows rule)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="64 rows, 2 epochs, one seed: a smoke run")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads or len(os.sched_getaffinity(0)))
    seeds = [0] if a.quick else [int(s) for s in a.seeds.split(",")]
    epochs, a.rows = (2, 64) if a.quick else (a.epochs, a.rows)
    params = yaml.safe_load(a.params.read_text())
    base = params["train"]["runs"][a.run]
    dataset = base["dataset"]
    tc = params["teacher_cache"]
    entry = build(TeacherCacheDatasetConfig, {**tc["datasets"][dataset], "max_rows": a.rows},
                  f"teacher_cache.datasets.{dataset}")
    teacher = a.repo / "models" / "teacher" / entry.teacher
    tokens = a.repo / "data" / "tokens" / dataset
    settings = LiveSettings(dataset, teacher, entry, tc["batch_size"], tc["shard_rows"], tc["cpu_threads"])
    loader = build(LoaderConfig, params["train"]["loader"], "train.loader")
    print(f"device cpu, torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}; "
          f"train.runs.{a.run} on {dataset} ({entry.max_rows or 'all'} rows), {epochs} epochs, teacher "
          f"{entry.teacher} live, seeds {seeds}{', QUICK' if a.quick else ''}")
    results: dict[str, dict[int, dict]] = {"static": {}, "fresh": {}}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for views in ("static", "fresh"):
                optim = {**base["optim"], "epochs": epochs, "max_steps": None, "eval_every": 0, "patience": None,
                         "checkpoint_minutes": 10**6, "seed": seed}
                run = build(TrainRunConfig, {**base, "teacher": f"models/teacher/{entry.teacher}",
                                             "mlm_views": views, "optim": optim}, f"train.runs.{a.run}")
                out = Path(tmp) / f"{views}{seed}"
                t = time.perf_counter()
                s = train_student(f"{a.run}-{views}", model_cfg=run.model, run=run, loader_cfg=loader, device="cpu",
                                  tokens_dir=tokens, store_path=settings, prepared_dir=None, out_dir=out / "s",
                                  ckpt_dir=out / "ck", live_dir=out / "live")
                results[views][seed] = {**{m: s.dev[m] for m in METRICS}, "steps": s.steps,
                                        "seconds": time.perf_counter() - t}
                print(f"  seed {seed} {views:6s}: " + ", ".join(f"{m} {s.dev[m]:.4f}" for m in METRICS)
                      + f" ({s.steps} steps, {time.perf_counter() - t:.0f} s)", flush=True)
    print("\nfresh - static, paired by seed (dev, the static dev masks):")
    summary = {}
    for m in METRICS:
        d = np.array([results["fresh"][s][m] - results["static"][s][m] for s in seeds])
        if len(d) > 1:
            lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d)) if d.std() else (d[0], d[0])
        else:
            lo = hi = float(d[0])
        summary[m] = {"mean": float(d.mean()), "ci95": [float(lo), float(hi)], "per_seed": d.tolist()}
        print(f"  {m:13s} {d.mean():+.4f}  95% CI [{lo:+.4f}, {hi:+.4f}]  per seed " +
              " ".join(f"{x:+.4f}" for x in d))
    print(f"\ndone in {time.perf_counter() - t0:.0f} s")
    if a.json:
        a.json.write_text(json.dumps({"epochs": epochs, "seeds": seeds, "results": results, "summary": summary},
                                     indent=1) + "\n")


if __name__ == "__main__":
    main()
