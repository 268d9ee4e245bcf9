"""Planning the teacher caches before anything runs (``distillpipe plan``): rows, arrays, bytes, files, memory, time.

For every ``teacher_cache.datasets`` item, from params.yaml and whatever inputs already exist (it only reads):

* **rows**: counted in the tokens folder (``data/tokens/<name>``: its split, ``max_rows`` applied with the very
  rule the build uses, :func:`~distillpipe.data.subset.row_subset`); else estimated from the prepared folder
  (``data/prepared/<name>``) and the tokenize params at
  :data:`~distillpipe.teacher.rows.CHARS_PER_TOKEN`; else unknown.
* **the signal spec** the build would make: the same function (:func:`~distillpipe.teacher.cache.spec_for`) with
  the teacher's sizes from ``models/teacher/<teacher>/config.json`` and M (the most masked positions of a row) from
  the tokens, or bounded by the tokenize params' masking when there are no tokens yet.
* **bytes**: per row and array as stored, uncompressed, from :func:`~distillpipe.store.schema.stored_layout` (a
  signal of a compressed precision is its int8/uint8 values and its scales): the exact size of the data. On disk
  it is *estimated* as the bytes of the real values (:mod:`distillpipe.teacher.estimate`): padding, unused MLM
  slots and ``-inf`` score blocks compress to almost nothing (lz4) or are not stored (a raw array's blocks of padding
  positions: its real positions count rounded up to a block), dense float16 (and int8) activations do not compress
  (measured: see :data:`COMPRESSED_TOLERANCE`), the MLM top-k arrays do, by a measured factor (:data:`COMPRESSION`);
  plus the files' framing (index entries, crc32c values, Blosc headers).
* **reading it back**, from the benchmark JSON too: a student on the GPU box reads the cache at min(disk read bytes/s,
  cores left / loader CPU s a byte) / bytes on disk a row; where the teacher run live (GPU FLOP/s / FLOPs a row) is
  faster, a warning says so with both rates.
* **constants**: what the store holds once (the subspaces' means and bases, the teacher's embedding tables, float32:
  :func:`~distillpipe.teacher.estimate.constant_shapes`), in the totals; where a store already exists, each
  subspace's variance kept and the spectrum of its fit (``constants.json``).
* **files**: per shard one data file per array (at most: a shard whose every inner chunk is the fill value writes
  none) and one marker ``shards_done/<i>.json``, plus a ``zarr.json`` for the root, every group and every array,
  and for the constants a ``zarr.json`` and at most one chunk file each, and ``constants.json``.
* **memory per worker** = 2 x (one shard of every array, uncompressed, float16) + 4 bytes x the teacher's parameters
  (fp32): a shard is held twice while written (the float16 arrays, and their encoded files, with the int8 codes of a
  compressed precision, at most the float16 bytes again: :func:`distillpipe.store.writer.write_shard`).
* **time**, from the machine benchmark JSON (``benchmarks/at_scale.py`` writes it): rows/s = the least of
  compute (FLOP/s / :func:`forward_flops` a row), the host side (cores / (CPU s a byte x uncompressed bytes a row))
  and the disk (write bytes/s / estimated bytes on disk a row); once for the measured machine, once projected to the
  benchmark's GPU with its ``projection_cores``.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from distillpipe.config.base import load_params, load_section
from distillpipe.config.run import teacher_is_live
from distillpipe.config.teacher_cache import TeacherCacheConfig, TeacherCacheDatasetConfig
from distillpipe.config.tokenize import TokenizeConfig
from distillpipe.store import constants as store_constants
from distillpipe.store.schema import SignalSpec
from distillpipe.store.shards import tree_bytes
from distillpipe.teacher.arch import config_signals, normalized_config, refusal
from distillpipe.teacher.bench import Bench, cached_vs_live, load_bench, reading_rates, throughput
from distillpipe.teacher.estimate import ArrayPlan, array_plans, constant_shapes, float16_row_bytes, fmt_bytes
from distillpipe.teacher.rows import Rows, count_rows
from distillpipe.teacher.targets import TeacherCacheError, TeacherSizes, spec_for

log = logging.getLogger(__name__)

WEIGHT_BYTES = 4
"""Bytes a teacher parameter takes in memory: the loader keeps fp32 weights (autocast decides the compute dtype)."""
COMPRESSED_TOLERANCE = (0.8, 1.15)
"""Bytes of the data files on disk / the on-disk estimate that tests/teacher/test_plan.py accepts for stores of
activations. Measured on whole stores of format 4 (Blosc lz4 everywhere): 0.97-0.99 with MiniLM-L6 on the embedded
data (wiki MLM top-k 0.99, wiki_mini attention probabilities 0.99, wiki_qa hidden, scores and embeddings 0.97),
0.85-1.14 with the tiny test teachers (chunks of a few KB, where lz4's weaker hold on short runs shows). Format 5 (raw
per-position arrays, framing counted): 1.03-1.06 with the tiny test teachers (MLM top-k, attention probabilities,
int8). The estimate is high for small integer
arrays (row indices and lengths compress to a quarter)."""


# --------------------------------------------------------------------------------------------
# the teacher: sizes, parameters, FLOPs (BERT architecture, from config.json)
# --------------------------------------------------------------------------------------------


def _bert_sizes(config: Mapping) -> tuple[int, int, int, int, int]:
    """(d, n_layers, heads, d_ff, vocab) of a BERT-architecture config.json; KeyError names a missing key."""
    return (int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["num_attention_heads"]),
            int(config["intermediate_size"]), int(config["vocab_size"]))


def num_labels(config: Mapping) -> int:
    """transformers' ``num_labels``: the size of ``id2label`` (config.json leaves it out at its default of 2)."""
    return len(config["id2label"]) if config.get("id2label") else int(config.get("num_labels", 2))


def teacher_sizes(config: Mapping, head: str) -> TeacherSizes:
    d, _, heads, _, vocab = _bert_sizes(config)
    return TeacherSizes(head=head, num_labels=num_labels(config), vocab_size=vocab, hidden_size=d, n_heads=heads)


def teacher_params(config: Mapping, head: str) -> int:
    """Parameters of the teacher as the build loads it with ``head`` (BERT architecture): embeddings (word, position,
    type, LayerNorm), per layer Q, K, V, O, FFN and two LayerNorms, then the pooler (``base``, ``classification``)
    and the head; the MLM decoder's weight is the tied word embedding (only its bias counts) unless untied."""
    d, n_layers, _, ff, vocab = _bert_sizes(config)
    n = (vocab + int(config["max_position_embeddings"]) + int(config["type_vocab_size"])) * d + 2 * d
    n += n_layers * (4 * (d * d + d) + (d * ff + ff) + (ff * d + d) + 2 * 2 * d)
    if head in ("base", "classification"):
        n += d * d + d  # pooler
    if head == "classification":
        n += d * num_labels(config) + num_labels(config)
    elif head == "qa":
        n += d * num_labels(config) + num_labels(config)  # the start/end head: num_labels = 2
    elif head == "mlm":
        n += d * d + d + 2 * d + vocab + (0 if config.get("tie_word_embeddings", True) else vocab * d)
    return n


def forward_flops(config: Mapping, seq_len: int, head: str, masked: float = 0, *, layers: int | None = None) -> float:
    """FLOPs of one BERT-architecture forward of one row of ``seq_len`` tokens, a multiply-add counting 2.

    Per layer and token: the Q, K, V and output projections 4 d^2, the FFN 2 d d_ff, the attention scores and the
    weighted sum 2 L d; all x 2. Then the head: ``mlm`` at ``masked`` positions (the capture runs it there only) the
    transform d^2 and the decoder d V; ``classification`` the pooler d^2 and the classifier d C on [CLS]; ``qa`` the
    span head d C a token (C = ``num_labels`` = 2: start, end); ``base`` none. ``layers``: run only the first
    ``layers`` encoder layers (the capture stops after the deepest layer it needs when there is no head). Embedding
    look-ups, LayerNorms, softmax and biases are left out (O(L d), under 1 % of a layer)."""
    d, n_layers, _, ff, vocab = _bert_sizes(config)
    L = seq_len
    n = n_layers if layers is None else layers
    flops = n * 2 * (L * (4 * d * d + 2 * d * ff) + 2 * L * L * d)
    if head == "mlm":
        flops += 2 * masked * (d * d + d * vocab)
    elif head == "classification":
        flops += 2 * (d * d + d * num_labels(config))
    elif head == "qa":
        flops += 2 * L * d * num_labels(config)
    elif head != "base":
        raise ValueError(f"unknown head {head!r}")
    return float(flops)


# --------------------------------------------------------------------------------------------
# one item
# --------------------------------------------------------------------------------------------


@dataclass
class ItemPlan:
    name: str
    teacher: str
    rows: Rows
    shard_rows: int
    spec: SignalSpec | None = None
    arrays: list[ArrayPlan] = field(default_factory=list)
    teacher_params: int | None = None
    flops_per_row: float | None = None
    rates: dict[str, dict[str, Any]] = field(default_factory=dict)
    constants: dict[str, int] = field(default_factory=dict)
    """Bytes of each constant the store holds once (float32)."""
    fit: dict[str, Any] | None = None
    """The subspace fit of the store already built (``constants.json``'s ``info.hidden``): variance kept, spectrum."""
    reading: dict[str, Any] | None = None
    """On the GPU box: a student's epoch from this cache against the teacher run live (bench.cached_vs_live)."""
    """``here`` / ``gpu``: {rows_per_s, seconds (None: rows unknown), bound}."""
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """What would make the build fail."""

    @property
    def n_shards(self) -> int | None:
        return None if self.rows.n is None else -(-self.rows.n // self.shard_rows)

    @property
    def row_bytes(self) -> int | None:
        return sum(a.row_bytes for a in self.arrays) if self.spec else None

    @property
    def est_row_bytes(self) -> float | None:
        return sum(a.est_row_bytes for a in self.arrays) if self.spec else None

    @property
    def nbytes(self) -> int | None:
        """Uncompressed bytes of every array, the constants included: exact."""
        if self.rows.n is None or not self.spec:
            return None
        return self.rows.n * self.row_bytes + sum(self.constants.values())

    @property
    def est_bytes(self) -> float | None:
        """Estimated bytes of the data files on disk (constants: as they are, float32 weights do not compress)."""
        if self.rows.n is None or not self.spec:
            return None
        return self.rows.n * self.est_row_bytes + sum(self.constants.values())

    @property
    def group_row_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.arrays:
            out[a.group] = out.get(a.group, 0) + a.row_bytes
        return out

    @property
    def files(self) -> dict[str, int] | None:
        """Files in the store: ``data`` (at most; see the module docstring), ``markers``, ``metadata``, ``total``."""
        if self.n_shards is None or not self.spec:
            return None
        names = [a.name for a in self.arrays] + list(self.constants)
        groups = {"/".join(n.split("/")[:k]) for n in names for k in range(1, n.count("/") + 1)}
        out = {"data": len(self.arrays) * self.n_shards + len(self.constants),
               "markers": self.n_shards + 1,  # shards_done/<i>.json, constants.json
               "metadata": 1 + len(groups) + len(names)}
        return {**out, "total": sum(out.values())}

    @property
    def memory_bytes(self) -> int | None:
        """Per worker: 2 x one shard of every array + WEIGHT_BYTES x the teacher's parameters."""
        if not self.spec or self.teacher_params is None:
            return None
        shard = min(self.shard_rows, self.rows.n) if self.rows.n is not None else self.shard_rows
        return 2 * shard * float16_row_bytes(self.spec) + WEIGHT_BYTES * self.teacher_params

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "teacher": self.teacher,
            "rows": {"n": self.rows.n, "how": self.rows.how, "note": self.rows.note,
                     "max_seq_len": self.rows.max_seq_len, "max_masked": self.rows.max_masked},
            "spec": self.spec.to_dict() if self.spec else None,
            "arrays": [{**asdict(a), "row_shape": list(a.row_shape), "est_row_bytes": a.est_row_bytes}
                       for a in self.arrays],
            "group_row_bytes": self.group_row_bytes, "row_bytes": self.row_bytes, "est_row_bytes": self.est_row_bytes,
            "bytes": self.nbytes, "est_bytes": self.est_bytes, "shard_rows": self.shard_rows,
            "shards": self.n_shards, "files": self.files, "teacher_params": self.teacher_params,
            "memory_bytes": self.memory_bytes, "flops_per_row": self.flops_per_row, "rates": self.rates,
            "reading": self.reading, "constants": self.constants, "fit": self.fit,
            "notes": self.notes, "problems": self.problems,
        }


def plan_item(name: str, cfg: TeacherCacheDatasetConfig, shard_rows: int, tokenize: TokenizeConfig, root: Path,
              bench: Bench | None) -> ItemPlan:
    """What item ``name`` would build, with the inputs under ``root`` as they are now."""
    tokens, prepared = root / "data" / "tokens" / name, root / "data" / "prepared" / name
    try:
        rows = count_rows(name, cfg, tokenize, tokens, prepared)
    except (TeacherCacheError, FileNotFoundError) as e:  # the build would fail the same way: say it, plan the rest
        rows = Rows(None, "unknown", str(e), None, 0)
    item = ItemPlan(name, cfg.teacher, rows, shard_rows)
    config_path = root / "models" / "teacher" / cfg.teacher / "config.json"
    if not config_path.is_file():
        item.notes.append(f"{config_path} not found: teacher sizes unknown (run teacher_import / teacher_finetune "
                          "first)")
        return item
    if rows.max_seq_len is None:
        item.notes.append("sequence length unknown: no tokens and no tokenize params for this dataset")
        return item
    config = json.loads(config_path.read_text(encoding="utf-8"))
    refused = refusal(config, config_signals(cfg.signals), f"teacher_cache.datasets.{name}")
    if refused is not None:  # the build would refuse it at its first batch: say so now, in its words (arch.py)
        item.problems.append(refused)
        return item
    config = normalized_config(config)  # DistilBERT's dim/n_layers/n_heads as BERT's names
    try:
        sizes = teacher_sizes(config, cfg.head)
        n_layers = int(config["num_hidden_layers"])
        item.teacher_params = teacher_params(config, cfg.head)
    except KeyError as e:
        item.notes.append(f"{config_path} has no {e.args[0]!r}: sizes unknown")
        return item
    s = cfg.signals
    if s.mlm_topk and rows.how == "tokens" and rows.masked is None:
        item.problems.append(f"signals.mlm_topk needs MLM tokens (with masked_positions); {tokens} has none")
        return item
    try:
        item.spec = spec_for(s, sizes, rows.max_seq_len, rows.max_masked)
    except ValueError as e:
        item.problems.append(f"the build would refuse these signals: {e}")
        return item
    if s.mlm_topk and rows.how != "tokens":
        item.notes.append(f"M = {rows.max_masked} is the tokenize params' bound (the tokens decide it)")
    deepest = max((*s.hidden_layers, *s.attn_layers), default=0)
    if deepest > n_layers:
        item.problems.append(f"signals name layer {deepest}, the teacher has {n_layers} layers")
    item.arrays = array_plans(item.spec, rows.lengths, rows.masked, shard_rows)
    try:
        item.constants = {n: 4 * int(np.prod(shape)) for n, shape in constant_shapes(item.spec, config).items()}
    except KeyError as e:
        item.notes.append(f"{config_path} has no {e.args[0]!r}: the embedding tables' size is unknown")
    if item.spec.hidden_rank:
        item.notes.append(f"the subspace fit runs the teacher over {item.spec.hidden_fit_rows:,} more rows first (up "
                          f"to layer {max(item.spec.hidden_layers)})")
        built = store_constants.read_marker(root / "data" / "teacher" / f"{name}.zarr")
        item.fit = (built or {}).get("info", {}).get("hidden")
    if rows.lengths is None:
        item.notes.append("no tokens: padding unknown, so the on-disk estimate counts every position as real (high "
                          "for rows shorter than L)")
    item.flops_per_row = row_flops(config, item.spec, cfg.head, rows)
    if bench is not None:
        for where, flops_per_s, cores in (("here", bench.forward_flops_per_s, bench.cores),
                                          ("gpu", bench.gpu_flops_per_s, bench.projection_cores)):
            item.rates[where] = throughput(item.flops_per_row, item.row_bytes, item.est_row_bytes, flops_per_s,
                                           cores, bench, rows.n)
        item.reading = cached_vs_live(item.flops_per_row, item.est_row_bytes, bench)
    return item


def row_flops(config: Mapping, spec: SignalSpec, head: str, rows: Rows) -> float:
    """FLOPs the build spends on a row, on average: the forward the capture runs (:func:`forward_flops` at each
    row's length; the head only when its logits are cached; else up to the deepest cached layer), plus the
    capture's recomputed Q K^T for each cached attention layer (2 L^2 d). L is the padded length when the lengths
    are unknown; batches are padded to their longest row (length-bucketed), so this is a slight underestimate."""
    n_layers, d = int(config["num_hidden_layers"]), int(config["hidden_size"])
    if spec.mlm_topk:
        run, layers = "mlm", None
    elif spec.task != "none":
        run, layers = head, None
    else:
        run = "base"
        layers = min(n_layers, max((*spec.hidden_layers, *spec.attn_layers, *spec.attn_probs_layers), default=0))
    n_attn = len(spec.attn_layers) + len(spec.attn_probs_layers)
    if rows.lengths is not None and rows.lengths.size:
        lengths, counts = np.unique(rows.lengths, return_counts=True)
    else:
        lengths, counts = np.array([spec.max_seq_len]), np.array([1])
    masked = float(rows.masked.mean()) if rows.masked is not None and rows.masked.size else spec.mlm_max_masked
    per_length = [forward_flops(config, int(L), run, masked, layers=layers) + n_attn * 2 * int(L) ** 2 * d
                  for L in lengths]
    return float(np.dot(per_length, counts) / counts.sum())


@dataclass
class RunPlan:
    """A student run that distils from a dataset's teacher targets (a ``train`` or ``finetune`` run): where they come
    from now (its ``teacher`` param), and what each source costs a step, here and on the GPU box."""

    section: str
    name: str
    dataset: str
    teacher: str
    """The run's ``teacher`` param: its dataset's cache, or a teacher folder run live."""
    batch_size: int
    teacher_dir: str
    """The folder the run would run live: ``models/teacher/<teacher_cache.datasets.<dataset>.teacher>``."""
    rates: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``here`` / ``gpu``: :func:`~distillpipe.teacher.bench.reading_rates` of the dataset's targets."""

    @property
    def live(self) -> bool:
        return teacher_is_live(self.teacher)

    def faster(self, where: str) -> str | None:
        """``live`` or ``cache``: the faster source on ``where`` (None: not measured)."""
        r = self.rates.get(where)
        return None if r is None else "live" if r["live_rows_per_s"] > r["cached_rows_per_s"] else "cache"

    def step_seconds(self, where: str, source: str) -> float | None:
        """The teacher's share of one step (a global batch of targets) from ``source`` (``live``/``cache``)."""
        r = self.rates.get(where)
        return None if r is None else self.batch_size / r["live_rows_per_s" if source == "live" else
                                                          "cached_rows_per_s"]

    def switch(self, to: str) -> str:
        """The one params change that moves the run to ``to`` (``live``/``cache``), as a command."""
        value = self.teacher_dir if to == "live" else f"data/teacher/{self.dataset}.zarr"
        return f"dvc exp run -S '{self.section}.runs.{self.name}.teacher={value}'"

    def to_dict(self) -> dict[str, Any]:
        return {"section": self.section, "name": self.name, "dataset": self.dataset, "teacher": self.teacher,
                "live": self.live, "batch_size": self.batch_size, "rates": self.rates,
                "faster": {w: self.faster(w) for w in self.rates},
                "step_seconds": {w: {src: self.step_seconds(w, src) for src in ("cache", "live")} for w in self.rates}}


def plan_runs(params: Path, items: list[ItemPlan], bench: Bench | None) -> list[RunPlan]:
    """Every ``train`` and ``finetune`` run of ``params`` whose dataset has a ``teacher_cache`` entry, with the
    rates of its dataset's targets from either source (``train_aug`` and ``train_lm`` runs read caches only)."""
    data = load_params(params)
    by_name = {i.name: i for i in items}
    out = []
    for section in ("train", "finetune"):
        for name, run in ((data.get(section) or {}).get("runs") or {}).items():
            item = by_name.get(run.get("dataset"))
            if item is None or "teacher" not in run:
                continue
            r = RunPlan(section, name, item.name, str(run["teacher"]), int(run["optim"]["batch_size"]),
                        f"models/teacher/{item.teacher}")
            if bench is not None and item.flops_per_row is not None:
                for where, flops_per_s, cores in (("here", bench.forward_flops_per_s, bench.cores),
                                                  ("gpu", bench.gpu_flops_per_s, bench.projection_cores)):
                    rates = reading_rates(item.flops_per_row, item.est_row_bytes, flops_per_s, cores, bench)
                    if rates is not None:
                        r.rates[where] = rates
            out.append(r)
    return out


# --------------------------------------------------------------------------------------------
# every item
# --------------------------------------------------------------------------------------------


@dataclass
class Plan:
    items: list[ItemPlan]
    bench: Bench | None
    disk_path: str
    """The nearest existing folder of ``data/teacher``, whose disk the stores go to."""
    disk_free: int
    existing_bytes: int
    """Bytes of stores already under data/teacher: a resume keeps them, a rebuild frees them first."""
    warnings: list[str]
    runs: list[RunPlan] = field(default_factory=list)
    """The student runs that read the items' targets, with either source's cost (:class:`RunPlan`)."""

    def total(self, attr: str) -> float | None:
        """Sum of an item attribute; None when any item's is unknown."""
        values = [getattr(i, attr) for i in self.items]
        return None if any(v is None for v in values) else sum(values)

    def seconds(self, where: str) -> float | None:
        values = [i.rates.get(where, {}).get("seconds") for i in self.items]
        return None if not self.bench or any(v is None for v in values) else sum(values)

    def to_dict(self) -> dict[str, Any]:
        files = [i.files for i in self.items]
        return {"items": [i.to_dict() for i in self.items],
                "bench": asdict(self.bench) if self.bench else None,
                "totals": {"rows": self.total_rows, "bytes": self.total("nbytes"), "est_bytes": self.total("est_bytes"),
                           "files": None if None in files else sum(f["total"] for f in files),
                           "seconds_here": self.seconds("here"), "seconds_gpu": self.seconds("gpu")},
                "disk": {"path": self.disk_path, "free": self.disk_free, "existing_stores": self.existing_bytes},
                "runs": [r.to_dict() for r in self.runs], "warnings": self.warnings}

    @property
    def total_rows(self) -> int | None:
        values = [i.rows.n for i in self.items]
        return None if None in values else sum(values)


def plan_caches(params: Path, root: Path, bench_path: Path) -> Plan:
    """The plan of every ``teacher_cache.datasets`` item of ``params``, for the repository at ``root``."""
    cache_cfg = load_section(params, "teacher_cache", TeacherCacheConfig)
    tokenize = load_section(params, "tokenize", TokenizeConfig)
    bench = load_bench(bench_path)
    items = [plan_item(name, cfg, cache_cfg.shard_rows, tokenize, root, bench)
             for name, cfg in cache_cfg.datasets.items()]
    out = root / "data" / "teacher"
    disk = out
    while not disk.exists():
        disk = disk.parent
    free = shutil.disk_usage(disk).free
    existing = sum(tree_bytes(out / f"{i.name}.zarr") for i in items) if out.is_dir() else 0
    plan = Plan(items, bench, str(disk), free, existing, [], plan_runs(params, items, bench))
    for i in items:
        plan.warnings += [f"{i.name}: {p}" for p in i.problems]
        r = i.reading
        runs = [run for run in plan.runs if run.dataset == i.name]
        if r is not None and r["live_rows_per_s"] > r["cached_rows_per_s"]:
            cached = [run for run in runs if not run.live]
            follow = (": switch the runs that read it with " + " ".join(
                [cached[0].switch("live")] + [f"-S '{x.section}.runs.{x.name}.teacher={x.teacher_dir}'"
                                              for x in cached[1:]])) if cached else \
                (": every run of it already does" if runs else "")
            plan.warnings.append(
                f"{i.name}: on the GPU box the live teacher ({r['live_rows_per_s']:,.0f} rows/s) is faster than a "
                f"student reading this cache ({r['cached_rows_per_s']:,.0f} rows/s, {r['cached_bound']}-bound): for "
                "these signals, distil from the live teacher (docs/students.md), or store them compact (hidden_rank, "
                f"attn_rank, int8: docs/precision.md) or on a faster disk{follow}")
        elif r is not None:
            plan.warnings += [f"{run.section}.runs.{run.name}: runs its teacher live, but on the GPU box reading "
                              f"{i.name}'s cache is faster ({r['cached_rows_per_s']:,.0f} rows/s against "
                              f"{r['live_rows_per_s']:,.0f}): {run.switch('cache')}" for run in runs if run.live]
    # the items whose size is known: with one unknown, the stores need more than that
    est = sum(i.est_bytes for i in items if i.est_bytes is not None)
    upper = sum(i.nbytes for i in items if i.nbytes is not None)
    unknown = sum(i.nbytes is None for i in items)
    more = f" (and {unknown} item(s) of unknown size)" if unknown else ""
    room = free + existing
    if est > room:
        plan.warnings.append(f"the stores need ~{fmt_bytes(est)}{more} on disk but {disk} has {fmt_bytes(room)} free "
                             "(counting the stores already there): they will not fit")
    elif upper > room:
        plan.warnings.append(f"the stores may not fit: up to {fmt_bytes(upper)}{more} uncompressed, {fmt_bytes(room)} "
                             f"free on {disk} (counting the stores already there)")
    for w in plan.warnings:
        log.warning("%s", w)
    return plan
