"""The ``teacher_cache`` stage's driver: run the teacher once over a tokens split and store its signals.

The unit of work is a shard of ``shard_rows`` consecutive rows, computed by
:func:`distillpipe.teacher.shard.compute_shard` and written by
:func:`distillpipe.store.writer.write_shard`. The driver takes the store's lock (one writer per
store), creates or resumes the store against a manifest that names everything that decides its
bytes (teacher weights and tokenizer, tokens content, split, signals, compute precision and batch
size, and the producing code), runs the pending shards in order and hands each to a writer thread,
so encoding and disk I/O of shard i overlap the teacher's compute of shard i+1. Fanning shards out
over processes or dask workers is the same two calls per shard, with the driver folding completion
markers into the manifest (``StoreWriter.refresh``).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from distillpipe.assets import tokenizer_sha256, weights_sha256
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.data.schema import read_meta
from distillpipe.errors import UserError
from distillpipe.identity import code_digests
from distillpipe.runtime import resolve_device
from distillpipe.store.manifest import Manifest, TeacherInfo
from distillpipe.store.schema import SignalSpec
from distillpipe.store.writer import StoreSummary, create_or_resume
from distillpipe.teacher.capture import CaptureRequest, signal_names, teacher_head
from distillpipe.teacher.load import load_teacher
from distillpipe.teacher.shard import compute_shard

log = logging.getLogger(__name__)

PRODUCER_MODULES = ("distillpipe.teacher.shard", "distillpipe.store.writer")
"""Computing a shard and encoding it: their import closure decides the bytes. How the teacher was loaded
is recorded by its effect (:func:`compute_settings`), and the driver (this module: which shards, threads,
progress) is left out: it cannot change a stored byte, and at scale a rebuild costs GPU hours."""


class TeacherCacheError(UserError, ValueError):
    """The teacher, the tokens and the requested signals do not fit together."""


def producer_code() -> dict[str, str]:
    """{source file: sha256} of the code that decides a store's bytes (the manifest's ``code``)."""
    return code_digests(PRODUCER_MODULES)


def compute_settings(model: torch.nn.Module, batch_size: int) -> dict[str, object]:
    """How the values are computed (the manifest's ``compute``): the precision (bf16 autocast on CUDA, fp32 on
    CPU: :func:`distillpipe.runtime.autocast`), the attention kernel and weight dtype the teacher was loaded
    with, and the batch size (padding and kernel choice follow it)."""
    param = next(model.parameters())
    return {"precision": "bf16-autocast" if param.device.type == "cuda" else "fp32",
            "attn_implementation": str(model.config._attn_implementation), "weights_dtype": str(param.dtype),
            "batch_size": int(batch_size)}


def signal_spec(cfg: TeacherCacheDatasetConfig, model: torch.nn.Module, tokens_meta: dict, rows) -> SignalSpec:
    """The store's signal spec for ``cfg`` on this teacher and these tokens."""
    mc = model.config
    s = cfg.signals
    head = teacher_head(model)
    task = "none"
    if s.logits:
        task = "qa" if head == "qa" else "classification"
    max_masked = 0
    if s.mlm_topk:
        if "masked_positions" not in rows.column_names:
            raise TeacherCacheError(f"signals.mlm_topk needs MLM tokens (with masked_positions); "
                                    f"{tokens_meta['name']} is {tokens_meta['kind']}")
        max_masked = max((len(p) for p in rows["masked_positions"]), default=0)
    return SignalSpec(
        max_seq_len=int(tokens_meta["max_seq_len"]), pool=s.pool, task=task,
        n_classes=int(mc.num_labels) if task == "classification" else 0,
        vocab_size=int(mc.vocab_size), mlm_topk=s.mlm_topk, mlm_max_masked=max_masked,
        hidden_layers=tuple(s.hidden_layers), hidden_size=int(mc.hidden_size),
        attn_layers=tuple(s.attn_layers), n_heads=int(mc.num_attention_heads),
        attn_probs_layers=tuple(s.attn_layers) if s.attn_probs else (),
        embedding_size=int(mc.hidden_size) if s.embeddings else 0,
    )


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
                        device: str, batch_size: int, shard_rows: int, out: str | Path) -> CacheSummary:
    """Create or resume ``out`` and compute every shard not yet complete."""
    from datasets import load_from_disk

    t0 = time.time()
    tokens_dir, teacher_dir, out = Path(tokens_dir), Path(teacher_dir), Path(out)
    meta = read_meta(tokens_dir)
    data = load_from_disk(str(tokens_dir))
    if cfg.split not in data:
        raise TeacherCacheError(f"teacher_cache.datasets.{name}.split={cfg.split!r}: "
                                f"{tokens_dir} has splits {list(data)}")
    rows = data[cfg.split]
    tok_sha = tokenizer_sha256(teacher_dir)
    if tok_sha != meta["tokenizer"]["sha256"]:
        raise TeacherCacheError(
            f"{tokens_dir} was tokenized with another tokenizer ({meta['tokenizer']['spec']}) than the teacher in "
            f"{teacher_dir} uses; set tokenize.tokenizer to this teacher and re-run tokenize")
    dev = resolve_device(device)
    model, _ = load_teacher(teacher_dir, cfg.head, dev)
    spec = signal_spec(cfg, model, meta, rows)
    manifest = Manifest(
        teacher=TeacherInfo(name=teacher_dir.name, weights_sha256=weights_sha256(teacher_dir),
                            tokenizer_sha256=tok_sha, config=model.config.to_diff_dict()),
        tokens_fingerprint=meta["fingerprint"], split=cfg.split, signals=spec,
        compute=compute_settings(model, batch_size), code=producer_code(), n_rows=len(rows), shard_rows=shard_rows)
    writer = create_or_resume(out, manifest)
    pending = writer.pending_shards()
    n_shards = manifest.n_shards
    if len(pending) < n_shards:
        log.info("resuming %s: %d of %d shards already complete", out, n_shards - len(pending), n_shards)
    log.info("caching %s for %s on %s: %s",
             ", ".join(signal_names(CaptureRequest.from_signal_spec(spec), teacher_head(model))),
             name, next(model.parameters()).device, f"{len(pending)} shards of {shard_rows} rows to compute")

    pad_id = int(meta["tokenizer"]["pad_id"])
    computed = 0
    bar = tqdm(total=sum(_rows(manifest, i) for i in pending), desc=f"teacher_cache {name}", unit="row")
    written_mb = 0.0
    t_compute = time.time()
    with writer, ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-writer") as pool:
        in_flight: Future | None = None
        for i in pending:
            start, stop = manifest.shard_rows_range(i)
            arrays = compute_shard(model, rows, start, stop, spec, batch_size, pad_id)
            if in_flight is not None:
                in_flight.result()  # at most one shard waits in memory while the next computes
            in_flight = pool.submit(writer.write_shard, i, arrays)
            computed += stop - start
            written_mb += sum(a.nbytes for a in arrays.values()) / 2**20
            bar.update(stop - start)
            bar.set_postfix(MB=f"{written_mb:.0f}")
        if in_flight is not None:
            in_flight.result()
        bar.close()
        seconds = time.time() - t_compute
        summary = writer.finalize()
    log.debug("teacher_cache %s done in %.1f s", name, time.time() - t0)
    return CacheSummary(name, summary, computed, seconds)


def _rows(manifest: Manifest, i: int) -> int:
    start, stop = manifest.shard_rows_range(i)
    return stop - start
