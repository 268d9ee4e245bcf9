"""Compact teacher targets against the full ones: bytes a row, and what a student trained on them learns, measured
against the FULL targets on held-out rows.

For each set (the WaLDORf layer terms: ``train@waldorf-layers`` on wiki_qa; the MiniALBERT terms: ``train@minialbert``
on wiki_mini), the real ``teacher_cache`` path (:func:`distillpipe.teacher.cache.build_teacher_cache`) builds, from the
repository's teachers and tokens, a train-split store per variant: ``full`` (dense float16 hidden states and attention
maps: the targets as the teacher computed them) and compact ones (hidden states as coordinates in the teacher's
principal subspace, attention maps as low-rank factors, int8 or float16: ``--variants``), and one dense store of the
dev split. A student is trained on each train store with the same seed, batches and steps (the training loop's own
parts: :func:`distillpipe.train.build.build_run`, :func:`distillpipe.train.loop.train_step`), then every distillation
term of its objective is computed on the dev rows against the dense dev store (the embedding output is derived in
every store, checked against the teacher's own while caching). A student trained in a subspace has never been asked
for the part of a state outside it, so its prediction of a teacher state is its projection's output put into the
subspace it was trained in (``mu + U U^T (W_h s - mu)``); the full-target student's is ``W_h s``. Reported per variant:
bytes a row on disk (row arrays; the constants once a store), each term and the weighted distillation loss on dev,
the ratio to the full-target student's, and the paired task comparison on dev (WaLDORf: SQuAD v2 F1 and HasAns span
F1, paired bootstrap; MiniALBERT: masked-token accuracy, McNemar).

Needs the embedded pipeline's inputs in ``--repo`` (after ``dvc repro``: data/tokens, data/prepared, models/teacher).
Usage:
    python benchmarks/fidelity.py [--repo .] [--sets waldorf,minialbert] [--steps 256] [--variants default]
        [--params params.yaml] [--work /tmp/fidelity] [--out benchmarks/results/fidelity.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import dataclasses
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from distillpipe.config.base import load_section
from distillpipe.config.teacher_cache import TeacherCacheConfig
from distillpipe.config.train import TrainConfig
from distillpipe.data.collate import IGNORE, collate
from distillpipe.evaluate.intervals import mcnemar, paired
from distillpipe.evaluate.student import score_student
from distillpipe.store import constants as store_constants
from distillpipe.store.reader import open_store
from distillpipe.store.schema import EMBEDDINGS, constant_names
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.train.build import build_run
from distillpipe.train.data import teacher_targets
from distillpipe.train.loop import train_step
from distillpipe.train.terms import BY_NAME, Step

SETS = {"waldorf": ("wiki_qa", "waldorf-layers"), "minialbert": ("wiki_mini", "minialbert")}
VARIANTS = {
    "full": {"hidden_rank": None, "attn_rank": None, "precision": "float16"},
    "default": {},  # the repository's params
    "h32": {"hidden_rank": 32}, "h64": {"hidden_rank": 64}, "h128": {"hidden_rank": 128}, "h192": {"hidden_rank": 192},
    "a4": {"attn_rank": 4}, "a8": {"attn_rank": 8}, "a16": {"attn_rank": 16},
    "f16": {"precision": "float16"},
}
"""Changes to the repository's signals: ``hidden_rank``, ``attn_rank``, and ``precision`` of hidden states and
attention (the others as in params.yaml)."""
RESAMPLES = 2000


def signals_for(base, change: dict):
    s = base.signals
    p = s.precision
    if "precision" in change:
        p = dataclasses.replace(p, hidden=change["precision"], attention=change["precision"])
    return dataclasses.replace(s, hidden_rank=change.get("hidden_rank", s.hidden_rank),
                               attn_rank=change.get("attn_rank", s.attn_rank), precision=p)


def build(repo: Path, tc: TeacherCacheConfig, dataset: str, variant: str, work: Path, *, split: str = "train") -> Path:
    cfg = tc.datasets[dataset]
    change = VARIANTS["full"] if split != "train" else VARIANTS[variant]
    cfg = dataclasses.replace(cfg, split=split, signals=signals_for(cfg, change),
                              max_rows=cfg.max_rows if split == "train" else None)
    out = work / f"{dataset}-{variant if split == 'train' else split}.zarr"
    t0 = time.time()
    build_teacher_cache(dataset, repo / "data" / "tokens" / dataset, repo / "models" / "teacher" / cfg.teacher, cfg,
                        "cpu", tc.batch_size, tc.shard_rows, out, cpu_threads=tc.cpu_threads)
    print(f"  built {out.name} in {time.time() - t0:.0f} s", flush=True)
    return out


def row_bytes(store_path: Path) -> float:
    info = open_store(store_path).info()
    return sum(a["bytes_stored"] for a in info["arrays"]) / info["n_rows"]


class InSubspace(nn.Module):
    """A trained projection W_h seen in one layer's subspace: ``mu + U U^T (W_h s - mu)``."""

    def __init__(self, proj: nn.Module, mean: torch.Tensor, basis: torch.Tensor):
        super().__init__()
        self.proj, self.mean, self.basis = proj, mean, basis

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.proj(h) - self.mean
        return self.mean + (x @ self.basis) @ self.basis.T


def train(repo: Path, params: Path, name: str, store: Path, steps: int, work: Path):
    tcfg = load_section(params, "train", TrainConfig)
    run = tcfg.runs[name]
    optim = dataclasses.replace(run.optim, max_steps=steps, epochs=max(run.optim.epochs, 64), eval_every=0,
                                patience=None)
    run = dataclasses.replace(run, optim=optim)
    r = build_run(name, model_cfg=run.model, run=run, loader_cfg=tcfg.loader, device="cpu",
                  tokens_dir=repo / "data" / "tokens" / run.dataset, store_path=store,
                  prepared_dir=repo / "data" / "prepared" / run.dataset, ckpt_dir=work / f"ckpt-{store.stem}")
    r.trainable.train()
    t0 = time.time()
    while r.step < r.total:
        for source, rows, arrays in r.data:
            train_step(r, source, rows, arrays)
            if r.step >= r.total:
                break
    print(f"  trained on {store.name}: {r.step} steps in {time.time() - t0:.0f} s, last loss "
          f"{np.mean([row['loss'] for row in r.steps_log[-10:]]):.4f}", flush=True)
    return r


@torch.no_grad()
def dev_terms(r, train_store: Path, dev_store: Path, tokens: Path, batch_size: int = 32) -> tuple[dict, list]:
    """Each distillation term of ``r``'s objective on the dev rows, against the dense dev targets (means over
    batches, weighted by rows), and the masked-token correctness of an MLM student (for McNemar)."""
    from datasets import load_from_disk

    obj, student = r.trainable.objective, r.student
    student.eval()
    dev = open_store(dev_store)
    spec = dev.manifest.signals
    train_spec = open_store(train_store).manifest.signals
    train_c = store_constants.load(train_store, train_spec) if train_spec.hidden_rank else None
    dev_c = store_constants.load(dev_store, spec) if constant_names(spec) else None
    rows = load_from_disk(str(tokens))["dev"]
    cols = rows.select_columns([c for c in ("input_ids", "token_type_ids", "length", "masked_positions",
                                            "masked_labels", "start_positions", "end_positions")
                                if c in rows.column_names])
    sums: dict[str, float] = {}
    n_rows, correct = 0, []
    for a in range(0, dev.n_rows, batch_size):
        b = min(dev.n_rows, a + batch_size)
        arrays = dev.read(list(dev.layout), a, b)
        idx = arrays.pop("row_index").tolist()
        batch, targets = collate(cols[idx], kind=r.task.kind, pad_id=r.task.pad_id, labeled=True, pairs=False)
        targets |= teacher_targets(arrays, batch["attention_mask"], spec.pool)
        if dev_c is not None and dev_c.embeddings is not None:
            targets[EMBEDDINGS] = dev_c.embeddings(batch["input_ids"], batch["token_type_ids"],
                                                   batch["attention_mask"])
        out = student(batch, return_hidden=True)
        for term in obj.terms():
            name, _, block = term.partition("/")
            if name == "hard":
                continue
            proj = obj.hidden_proj
            if block:
                j = int(block)
                t = obj.cfg.layer_map[j]
                if name == "hidden" and train_c is not None:
                    proj = InSubspace(obj.hidden_proj, *train_c.subspaces[t])
                step = Step(out, targets, targets["attention_mask"], 1.0, r.task.kind, spec, obj.cfg.hidden_loss, proj,
                            obj.embed_proj)
                value = BY_NAME[name].loss(step, j, t)
            else:
                step = Step(out, targets, targets["attention_mask"], 1.0, r.task.kind, spec, obj.cfg.hidden_loss, proj,
                            obj.embed_proj)
                value = BY_NAME[name].loss(step)
            sums[term] = sums.get(term, 0.0) + float(value) * (b - a)
        if r.task.kind == "mlm":
            labels = targets["mlm_labels"]
            keep = labels != IGNORE
            correct.append((out.mlm_logits.argmax(-1)[keep] == labels[keep]).numpy())
        n_rows += b - a
    student.train()
    return {k: v / n_rows for k, v in sums.items()}, correct


def weighted(r, terms: dict) -> float:
    w = r.trainable.objective.cfg.loss_weights
    return sum(float(w[k.partition("/")[0]]) * v for k, v in terms.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=Path("."))
    ap.add_argument("--params", type=Path, default=None, help="params.yaml (default: the repository's)")
    ap.add_argument("--sets", default="waldorf,minialbert")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--variants", default="default", help="compact variants besides full (comma-separated: "
                    + ", ".join(v for v in VARIANTS if v != "full") + ")")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fidelity.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(2)
    repo = args.repo.resolve()
    work = args.work or Path(tempfile.mkdtemp(prefix="fidelity-"))
    work.mkdir(parents=True, exist_ok=True)
    params = (args.params or repo / "params.yaml").resolve()
    tc = load_section(params, "teacher_cache", TeacherCacheConfig)
    results = {"steps": args.steps, "sets": {}}
    for set_name in args.sets.split(","):
        dataset, run_name = SETS[set_name]
        tokens = repo / "data" / "tokens" / dataset
        print(f"== {set_name}: {run_name} on {dataset}, {args.steps} steps", flush=True)
        dev_store = work / f"{dataset}-dev.zarr"
        if not dev_store.exists():
            build(repo, tc, dataset, "full", work, split="dev")
        per = {}
        records, correct = {}, {}
        full_run = None
        for variant in ["full", *args.variants.split(",")]:
            store = work / f"{dataset}-{variant}.zarr"
            if not store.exists():
                build(repo, tc, dataset, variant, work)
            r = train(repo, params, run_name, store, args.steps, work)
            terms, correct[variant] = dev_terms(r, store, dev_store, tokens)
            if variant == "full":
                full_run = r
            elif variant == "default" and open_store(store).manifest.signals.hidden_rank:
                # the full-target student's prediction put into the same subspaces: how much of a compact student's
                # hidden terms is that projection alone (it drops what no student trained in the subspace predicts)
                projected, _ = dev_terms(full_run, store, dev_store, tokens)
                per["full, seen in the default's subspaces"] = {"terms": projected,
                                                                 "distillation": weighted(full_run, projected)}
            if r.task.kind == "qa":
                records[variant] = score_student(r.student, open_tokens(tokens), kind="qa", pad_id=r.task.pad_id,
                                                 device=torch.device("cpu"), batch_size=32, pairs=False,
                                                 prepared_dir=repo / "data" / "prepared" / dataset,
                                                 split="dev").examples
            signals = open_store(store).manifest.signals
            fit = store_constants.read_marker(store)["info"].get("hidden", {})
            per[variant] = {"hidden_rank": signals.hidden_rank, "attn_rank": signals.attn_rank,
                            "precision": dataclasses.asdict(signals.precision), "bytes_per_row": row_bytes(store),
                            "variance_kept": {k: v["variance_kept"] for k, v in fit.items()},
                            "terms": terms, "distillation": weighted(r, terms)}
        full = per["full"]["distillation"]
        for variant, p in per.items():
            p["ratio_to_full"] = p["distillation"] / full
            if variant == "full" or "hidden_rank" not in p:
                continue
            if records:
                p["task"] = {m: dataclasses.asdict(paired(m, "qa", records[variant], records["full"],
                                                          n_resamples=RESAMPLES, confidence=0.95, seed=0,
                                                          key=f"{set_name}/{variant}/{m}"))
                             for m in ("f1", "HasAns_span_f1")}
            elif correct["full"]:
                a, b = np.concatenate(correct[variant]), np.concatenate(correct["full"])
                p["task"] = {"mlm_accuracy": {"compact": float(a.mean()), "full": float(b.mean()),
                                              "mcnemar_p": mcnemar(a, b), "n": int(len(a))}}
        results["sets"][set_name] = per
        print(f"{'variant':<10} {'h_rank':>6} {'a_rank':>6} {'prec':>7} {'B/row':>9} {'distill':>9} {'ratio':>7}  "
              "terms")
        for variant, p in per.items():
            if "hidden_rank" not in p:
                print(f"{variant}: {p['distillation']:.4f} ({p['ratio_to_full']:.4f}) "
                      + ", ".join(f"{k} {v:.4f}" for k, v in p["terms"].items()))
                continue
            print(f"{variant:<10} {str(p['hidden_rank']):>6} {str(p['attn_rank']):>6} {p['precision']['hidden']:>7} "
                  f"{p['bytes_per_row']:>9,.0f} {p['distillation']:>9.4f} {p['ratio_to_full']:>7.4f}  "
                  + ", ".join(f"{k} {v:.4f}" for k, v in p["terms"].items()))
            if "task" in p:
                print(f"{'':<10} task vs full: {json.dumps(p['task'])}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {args.out}")


def open_tokens(tokens: Path):
    from datasets import load_from_disk

    return load_from_disk(str(tokens))["dev"]


if __name__ == "__main__":
    main()
