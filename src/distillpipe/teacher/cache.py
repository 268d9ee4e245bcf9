"""The ``teacher_cache`` stage's driver: run the teacher once over a tokens split and store its signals.

The unit of work is a shard of ``shard_rows`` consecutive rows: :func:`cache_shard` computes it
(:func:`distillpipe.teacher.shard.compute_shard`) and writes its files and completion marker itself
(:func:`distillpipe.store.writer.write_shard`). It runs in this process (``cluster.kind: inprocess``,
where the next shard's compute overlaps the previous shard's writing) or as one dask task per shard on
the machine's cluster (:mod:`distillpipe.scale.cluster`); a worker process loads the teacher once and
keeps it for every shard it gets.

The driver takes the store's lock (one writer per store) before anything else, then asks a worker (or this
process) how it loads the teacher, builds the manifest from the answer (teacher weights and tokenizer, tokens
content, split, signals, compute precision and batch size, the producing code), creates or resumes the store,
hands out the pending shards and folds their markers into the manifest. A worker refuses a shard when
its code or compute settings differ from the manifest's, so a store never mixes them. The bytes are
the same whatever the number of workers and the order in which shards finish.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distillpipe.assets import tokenizer_sha256, weights_sha256
from distillpipe.compact import Constants
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.data.schema import read_meta
from distillpipe.errors import DiskFull, disk_full_cause, free_space
from distillpipe.identity import stage_code
from distillpipe.progress import Progress
from distillpipe.runtime import torch_threads
from distillpipe.scale.cluster import open_client, run_tasks
from distillpipe.scale.machine import ClusterSettings
from distillpipe.store import constants as store_constants
from distillpipe.store.lock import StoreLock
from distillpipe.store.manifest import Manifest, TeacherInfo
from distillpipe.store.resume import create_or_resume
from distillpipe.store.schema import ROW_INDEX, SignalSpec, constant_names
from distillpipe.store.shards import marked_shards
from distillpipe.store.writer import StoreSummary, StoreWriter, write_shard
from distillpipe.teacher.capture import signal_names
from distillpipe.teacher.estimate import estimated_bytes, fmt_bytes
from distillpipe.teacher.fit import fit_constants
from distillpipe.teacher.load import load_teacher
from distillpipe.teacher.shard import compute_shard
from distillpipe.teacher.targets import (
    TeacherCacheError,
    TeacherFacts,
    describe,
    masked_counts,
    signal_spec,
    split_rows,
)

log = logging.getLogger(__name__)

STAGE = "teacher_cache"
"""The stage whose whole import closure is the manifest's ``code`` (:func:`producer_code`)."""
MAX_ROUNDS = 3
"""Rounds of resubmitting shards that finished without a marker (a lost worker's late second attempt can
remove the marker of the first one and then die before writing its own)."""


def producer_code() -> dict[str, str]:
    """{source file: sha256} of the code that decides a store's bytes (the manifest's ``code``): the
    ``teacher_cache`` stage's whole import closure, the files ``dvc.yaml`` lists as its code deps. Not
    only the shard computation and the writer: this driver picks the rows (:func:`row_subset`), the
    loader decides the weights the teacher computes with, the command passes the params; an edit to any
    of them must rebuild, never resume (an earlier narrower closure let a changed ``row_subset`` resume
    a store of other rows under an equal manifest)."""
    return stage_code(STAGE)


# --------------------------------------------------------------------------------------------
# the work: one shard, in any process
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardJob:
    """Everything a process needs to compute and write shards of one store (small and picklable)."""

    store: str
    tokens_dir: str
    split: str
    teacher_dir: str
    head: str
    device: str
    """As configured (``auto`` is resolved by each worker: its own GPU on a dask-cuda worker)."""
    batch_size: int
    cpu_threads: int
    pad_id: int
    code: dict[str, str]
    """The driver's producer code: a worker with other code refuses to compute."""
    max_rows: int | None = None
    """Cache only these evenly spaced rows of the split (:func:`row_subset`); None: every row."""
    n_rows: int = 0
    shard_rows: int = 1
    spec: SignalSpec | None = None
    compute: dict[str, Any] | None = None
    """The manifest's compute settings: a worker that would compute otherwise refuses."""


@dataclass
class _Loaded:
    key: tuple
    model: torch.nn.Module
    rows: Any
    facts: TeacherFacts
    lock: threading.Lock
    """One capture at a time per teacher: capture hooks the model, so threads must not share it at once."""
    subset: Any = None
    """The cached rows of the split when ``max_rows`` is set (``rows`` holds only them); None: every row."""
    constants: tuple[str, Constants] | None = None
    """The store's constants on the teacher's device, with the digest of the marker they were read under."""


_LOADED: _Loaded | None = None
_LOADED_LOCK = threading.Lock()


def _loaded(job: ShardJob) -> _Loaded:
    """This process's teacher and tokens for ``job``, loaded on first use and kept (one teacher per
    process: another job's replaces it)."""
    global _LOADED

    key = (job.teacher_dir, job.head, job.device, job.tokens_dir, job.split, job.max_rows, job.batch_size,
           job.cpu_threads)
    with _LOADED_LOCK:
        if _LOADED is None or _LOADED.key != key:
            _LOADED = None  # free the previous teacher before loading the next one
            mine = producer_code()
            if mine != job.code:
                differ = sorted(k for k in set(mine) | set(job.code) if mine.get(k) != job.code.get(k))
                raise TeacherCacheError(f"this worker runs other distillpipe code than the driver ({differ}); "
                                        "install the same version of distillpipe on every worker")
            model, _ = load_teacher(job.teacher_dir, job.head, job.device)
            facts = describe(model, job.batch_size, job.cpu_threads)
            rows, subset = split_rows(Path(job.store).stem, job.tokens_dir, job.split, job.max_rows)
            if subset is not None:
                rows = rows.select(subset)
            _LOADED = _Loaded(key, model, rows, facts, threading.Lock(), subset)
        return _LOADED


def teacher_facts(job: ShardJob) -> TeacherFacts:
    """Load the teacher in this process (it is kept for the shards to come) and describe it."""
    return _loaded(job).facts


def fit_job(job: ShardJob) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The constants of ``job``'s store (:func:`distillpipe.teacher.fit.fit_constants`), computed in this process
    with the shards' compute settings (one dask task)."""
    state = _loaded(job)
    with state.lock, torch_threads(job.compute["cpu_threads"]):
        return fit_constants(state.model, state.rows, job.spec, job.batch_size, job.pad_id)


def _job_constants(job: ShardJob, state: _Loaded) -> Constants | None:
    """The store's constants on the teacher's device, read from the store once per process (again when its
    constants marker changed: a rebuilt store's fit)."""
    if not constant_names(job.spec):
        return None
    digest = store_constants.marker_digest(job.store)
    if state.constants is None or state.constants[0] != digest:
        device = next(state.model.parameters()).device
        state.constants = (digest, store_constants.load(job.store, job.spec).to(device))
    return state.constants[1]


def compute_job_shard(job: ShardJob, i: int) -> dict[str, Any]:
    """The arrays of shard ``i`` of ``job``'s store, computed in this process."""
    state = _loaded(job)
    if job.compute != state.facts.compute:
        raise TeacherCacheError(f"this worker would compute shard {i} with {state.facts.compute}, but the store's "
                                f"manifest says {job.compute}: every worker of one build must use the same device "
                                "type and batch size")
    start, stop = i * job.shard_rows, min(job.n_rows, (i + 1) * job.shard_rows)
    constants = _job_constants(job, state)
    with state.lock, torch_threads(job.compute["cpu_threads"]):
        arrays = compute_shard(state.model, state.rows, start, stop, job.spec, job.batch_size, job.pad_id, constants)
    if state.subset is not None:  # positions in the subset -> rows of the tokens split
        arrays[ROW_INDEX] = state.subset[arrays[ROW_INDEX]]
    return arrays


def cache_shard(job: ShardJob, i: int) -> dict[str, Any]:
    """Compute shard ``i`` and write its files and marker (one dask task); returns the marker."""
    return write_shard(job.store, i, compute_job_shard(job, i))


# --------------------------------------------------------------------------------------------
# the driver
# --------------------------------------------------------------------------------------------


@dataclass
class CacheSummary:
    name: str
    store: StoreSummary
    computed_rows: int
    seconds: float

    def one_line(self) -> str:
        s = self.store
        rate = self.computed_rows / self.seconds if self.seconds > 0 else 0.0
        return (f"teacher_cache {self.name}: {s.rows:,} rows in {s.shards} shards, "
                f"{s.bytes_on_disk / 2**20:.1f} MiB on "
                f"disk ({s.bytes_on_disk / max(s.rows, 1) / 1024:.1f} KiB/row); computed {self.computed_rows:,} rows "
                f"in {self.seconds:.1f} s ({rate:.0f} rows/s)")


def build_teacher_cache(name: str, tokens_dir: str | Path, teacher_dir: str | Path, cfg: TeacherCacheDatasetConfig,
                        device: str, batch_size: int, shard_rows: int, out: str | Path, *, cpu_threads: int,
                        cluster: ClusterSettings | None = None) -> CacheSummary:
    """Create or resume ``out`` and compute every shard not yet complete: in this process (``cluster`` None or
    ``inprocess``) or as one dask task per shard on the cluster (a machine setting, never a param: it changes
    no byte). The store's lock is taken first, before the teacher loads: a second writer of the store is refused
    at once, not after loading a teacher (a GPU load for nothing at BERT-Large size); this process keeps it
    through the build."""
    with StoreLock(out) as lock:
        return _build_locked(name, tokens_dir, teacher_dir, cfg, device, batch_size, shard_rows, out, lock,
                             cpu_threads=cpu_threads, cluster=cluster)


def _build_locked(name: str, tokens_dir: str | Path, teacher_dir: str | Path, cfg: TeacherCacheDatasetConfig,
                  device: str, batch_size: int, shard_rows: int, out: str | Path, lock: StoreLock, *, cpu_threads: int,
                  cluster: ClusterSettings | None) -> CacheSummary:
    t0 = time.time()
    tokens_dir, teacher_dir, out = Path(tokens_dir), Path(teacher_dir), Path(out)
    meta = read_meta(tokens_dir)
    rows, subset = split_rows(name, tokens_dir, cfg.split, cfg.max_rows)
    if subset is not None:
        log.info("caching %d evenly spaced rows of %d (max_rows)", len(subset), len(rows))
        rows = rows.select(subset)
    tok_sha = tokenizer_sha256(teacher_dir)
    if tok_sha != meta["tokenizer"]["sha256"]:
        raise TeacherCacheError(
            f"{tokens_dir} was tokenized with another tokenizer ({meta['tokenizer']['spec']}) than the teacher in "
            f"{teacher_dir} uses; set tokenize.tokenizer to this teacher and re-run tokenize")
    job = ShardJob(store=str(out.resolve()), tokens_dir=str(tokens_dir.resolve()), split=cfg.split,
                   teacher_dir=str(teacher_dir.resolve()), head=cfg.head, device=device, batch_size=batch_size,
                   cpu_threads=cpu_threads, pad_id=int(meta["tokenizer"]["pad_id"]), code=producer_code(),
                   max_rows=cfg.max_rows if subset is not None else None)
    inprocess = cluster is None or cluster.kind == "inprocess"
    with nullcontext() if inprocess else open_client(cluster) as client:
        facts = teacher_facts(job) if inprocess else client.submit(teacher_facts, job, pure=False).result()
        spec = signal_spec(cfg, facts, meta, rows)
        manifest = Manifest(
            teacher=TeacherInfo(name=teacher_dir.name, weights_sha256=weights_sha256(teacher_dir),
                                tokenizer_sha256=tok_sha, config=facts.config),
            tokens_fingerprint=meta["fingerprint"], split=cfg.split, signals=spec, compute=facts.compute,
            code=job.code, n_rows=len(rows), shard_rows=shard_rows,
            row_subset=None if subset is None else {"max_rows": len(subset), "rule": "evenly_spaced"})
        job = replace(job, n_rows=len(rows), shard_rows=shard_rows, spec=spec, compute=facts.compute)
        with disk_full_message(name, out, manifest, rows), create_or_resume(out, manifest, lock=lock) as writer:
            if store_constants.read_marker(out) is None:  # a new store: its constants before any shard
                _write_constants(job, spec, out, inprocess, client)
            pending = writer.pending_shards()
            n_shards = manifest.n_shards
            if len(pending) < n_shards:
                log.info("resuming %s: %d of %d shards already complete", out, n_shards - len(pending), n_shards)
            where = "this process" if inprocess else f"dask cluster ({cluster.kind})"
            log.info("caching %s for %s on %s, %s: %d shards of %d rows to compute",
                     ", ".join(signal_names(spec)), name, facts.device,
                     where, len(pending), shard_rows)
            bar = Progress(total=sum(_rows(manifest, i) for i in pending), desc=f"teacher_cache {name}", unit="row")
            progress = _Progress(bar, manifest)
            t_compute = time.time()
            try:
                if inprocess:
                    # as on a dask worker: of threads_per_worker, one computes and the others write shards
                    _run_inprocess(job, pending, writer, progress,
                                   writers=max(1, cluster.threads_per_worker - 1) if cluster is not None else 1)
                else:
                    _run_on_cluster(client, job, name, pending, writer, progress, cluster.retries)
            finally:
                bar.close()  # also when a shard fails: an error message then starts on a line of its own
            seconds = time.time() - t_compute
            summary = writer.finalize()
    log.debug("teacher_cache %s done in %.1f s", name, time.time() - t0)
    return CacheSummary(name, summary, progress.rows, seconds)


@contextmanager
def disk_full_message(name: str, out: Path, manifest: Manifest, rows: Any) -> Iterator[None]:
    """Turn a full disk (or quota) anywhere in the block, from creating the store to its last manifest save, in this
    process or on a worker, into one :class:`~distillpipe.errors.DiskFull` naming the store, the space its unfinished
    shards need (``distillpipe plan``'s estimate of their bytes on disk: :mod:`distillpipe.teacher.estimate`), the
    space free and how to go on. What was written stays consistent: a shard counts as complete only by its marker,
    written after its files (:func:`~distillpipe.store.writer.write_shard`), and a write that failed leaves no file
    behind but a ``*.partial`` the resume removes."""
    try:
        yield
    except Exception as e:
        cause = disk_full_cause(e)
        if cause is None:
            raise
        done = set(marked_shards(out, manifest.n_shards)) if out.is_dir() else set()
        pending = [i for i in range(manifest.n_shards) if i not in done]
        positions = np.concatenate([np.arange(*manifest.shard_rows_range(i)) for i in pending] or [np.zeros(0, int)])
        part = rows.select(positions)
        lengths = np.asarray(part.with_format("arrow")["length"].to_numpy(zero_copy_only=False), dtype=np.int64)
        need = estimated_bytes(manifest.signals, lengths, masked_counts(part) if manifest.signals.mlm_topk else None,
                               manifest.shard_rows)
        _, free = free_space(out)
        needs = (f"needs ~{fmt_bytes(need)} more for its {len(pending)} unfinished shard(s) of {manifest.n_shards} "
                 "(distillpipe plan's estimate of their bytes on disk)" if pending else
                 "has every shard written but could not save its manifest (a few kB)")
        raise DiskFull(
            f"no space left on device writing {cause.filename or out}: the teacher cache {out} {needs} and "
            f"{fmt_bytes(free)} is free on its disk. Make that room there (or move the store to a larger disk), then "
            f"run `dvc repro teacher_cache@{name}` again"
            + (f": its {len(done)} complete shard(s) are kept and only the others are computed" if done else "")
            ) from e


def _write_constants(job: ShardJob, spec: SignalSpec, out: Path, inprocess: bool, client: Any) -> None:
    names = constant_names(spec)
    if names:
        t0 = time.time()
        log.info("computing the store's constants (%s) on %s", ", ".join(sorted({n.split("/")[1] for n in names})),
                 "this process" if inprocess else "the cluster")
        arrays, info = fit_job(job) if inprocess else client.submit(fit_job, job, pure=False).result()
        log.info("constants: %.1f MiB in %.1f s", sum(a.nbytes for a in arrays.values()) / 2**20, time.time() - t0)
    else:
        arrays, info = {}, {}
    store_constants.write_constants(out, arrays, info)


class _Progress:
    """Rows and MB written so far, on the progress bar."""

    def __init__(self, bar: Any, manifest: Manifest):
        self.bar, self.manifest, self.rows, self.bytes = bar, manifest, 0, 0

    def done(self, i: int, marker: dict[str, Any]) -> None:
        n = _rows(self.manifest, i)
        self.rows += n
        self.bytes += sum(rec["size"] for rec in marker["files"].values() if rec)
        self.bar.update(n)
        self.bar.set_postfix(MB=f"{self.bytes / 2**20:.0f}")


def _run_inprocess(job: ShardJob, pending: list[int], writer: StoreWriter, progress: _Progress, writers: int) -> None:
    run_shards(lambda i: compute_job_shard(job, i), job.store, pending,
               lambda i, marker: _record(writer, progress, i, marker), writers=writers)


def run_shards(compute: Callable[[int], dict[str, Any]], store: str, pending: list[int],
               done: Callable[[int, dict[str, Any]], None], *, writers: int | None = 1) -> None:
    """Compute the ``pending`` shards one after another in this thread (``compute(i)`` -> arrays) while a pool of
    ``writers`` threads writes the computed ones (:func:`write_shard`); ``done(i, marker)`` is called in this thread
    in shard order. At most ``writers`` computed shards wait in memory besides the one being computed."""
    writers = max(1, writers or 1)
    with ThreadPoolExecutor(max_workers=writers, thread_name_prefix="shard-writer") as pool:
        in_flight: deque[tuple[int, Future]] = deque()
        for i in pending:
            arrays = compute(i)
            while len(in_flight) >= writers:
                j, future = in_flight.popleft()
                done(j, future.result())
            in_flight.append((i, pool.submit(write_shard, store, i, arrays)))
        while in_flight:
            j, future = in_flight.popleft()
            done(j, future.result())


def _run_on_cluster(client: Any, job: ShardJob, name: str, pending: list[int], writer: StoreWriter,
                    progress: _Progress, retries: int) -> None:
    """One task per shard; then any shard that finished without a marker is submitted again."""
    build = uuid.uuid4().hex[:8]  # task keys unique to this build: a long-lived scheduler remembers old ones
    todo = list(pending)
    for attempt in range(MAX_ROUNDS):
        for i, marker in run_tasks(client, cache_shard, todo, retries=retries, args=(job,),
                                   key=lambda i: f"teacher_cache-{name}-{build}-{attempt}-{i}"):
            _record(writer, progress, i, marker)
        writer.refresh()
        todo = writer.drop_unmarked()
        if not todo:
            return
        log.warning("teacher_cache %s: shards %s finished without a marker (a lost worker's late attempt removed "
                    "it); computing them again", name, todo)


def _record(writer: StoreWriter, progress: _Progress, i: int, marker: dict[str, Any]) -> None:
    writer.record([i])
    progress.done(i, marker)


def _rows(manifest: Manifest, i: int) -> int:
    start, stop = manifest.shard_rows_range(i)
    return stop - start
