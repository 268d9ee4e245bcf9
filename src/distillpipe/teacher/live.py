"""The teacher run live: a student run's targets computed on each of its batches instead of read from a cache.

A cache pays for itself when reading a row is cheaper than recomputing it; for a small teacher on a GPU, or a run
that wants a new view of its data each epoch, the teacher itself is the faster source (``distillpipe plan`` says
which, per store). :func:`live_teacher` sets up what the ``teacher_cache`` build would cache for the run's dataset
(``teacher_cache.datasets.<dataset>``): the same teacher, loaded on the student's device in ``eval()``; the same
rows (``max_rows``' evenly spaced subset) laid out in the same shards, so the block loader gives the same batches
(:class:`~distillpipe.store.loader.RowTable`); the same signal spec and the same constants, fitted by the build's
own fit on the same rows with the same compute settings. :meth:`LiveTeacher.targets` then runs the build's capture
(:func:`~distillpipe.teacher.capture.capture_batch`) on each batch: one code path makes a signal, whether it is
written to a store or fed to a loss, so the targets equal the cache's up to the float16 rounding of the values
(a row's signals do not depend on its batch's padding), and the int8 steps where the store codes them int8: live
targets are the float16 values a store would encode.

Under DDP each process holds its own replica of the teacher (its weights on its device, as the student's). A
checkpoint holds no teacher state: the teacher is read again on resume.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distillpipe.assets import tokenizer_sha256, weights_sha256
from distillpipe.compact import Constants
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.data.schema import read_meta
from distillpipe.runtime import torch_threads
from distillpipe.store.constants import as_constants
from distillpipe.store.loader import RowTable
from distillpipe.store.schema import LENGTH, SignalSpec, constant_names
from distillpipe.teacher.capture import capture_batch
from distillpipe.teacher.fit import fit_constants
from distillpipe.teacher.load import load_teacher
from distillpipe.teacher.targets import TeacherCacheError, TeacherFacts, describe, signal_spec, split_rows

log = logging.getLogger(__name__)


@dataclass
class LiveTeacher:
    """A loaded teacher and what it computes for a run's batches (build it with :func:`live_teacher`)."""

    teacher_dir: Path
    model: torch.nn.Module
    spec: SignalSpec
    constants: Constants | None
    rows: RowTable
    """The rows a cache of this dataset would hold, in its shards: what the block loader reads."""
    facts: TeacherFacts
    identity: dict[str, Any]
    """What decides the targets (teacher, tokens, rows, spec, compute, constants), as digests: part of a run's
    identity, as a store's content digest is."""

    def targets(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The teacher's signals on a collated student batch (on the teacher's device), named and shaped as a cache's
        rows collated for that batch: float16 values as float32, cropped to the batch's length."""
        mask = batch["attention_mask"]
        inputs = {"input_ids": batch["input_ids"], "token_type_ids": batch["token_type_ids"],
                  "attention_mask": mask.long()}
        if self.spec.mlm_topk:
            positions = batch["mlm_positions"]  # (B, M), -1 in unused slots
            inputs["masked_positions"], inputs["masked_valid"] = positions.clamp(min=0), positions >= 0
        signals = capture_batch(self.model, inputs, self.spec, constants=self.constants)
        # out of inference mode (a loss may save a target for its backward): float16 values widened as collate does
        return {name: t.float() if t.dtype == torch.float16 else t.clone()
                for name, t in signals.items() if name != LENGTH}


@dataclass(frozen=True)
class LiveSettings:
    """What a run needs to run its teacher live: the dataset's ``teacher_cache`` entry and the section's settings that
    decide a cache's rows and bits (``batch_size``: the fit's batches; ``shard_rows``: the rows' layout, so the
    batches; ``cpu_threads``: the fit's threads on CPU), and the teacher folder."""

    name: str
    teacher_dir: Path
    cfg: TeacherCacheDatasetConfig
    batch_size: int
    shard_rows: int
    cpu_threads: int


def live_teacher(s: LiveSettings, tokens_dir: str | Path, device: str) -> LiveTeacher:
    """The teacher of ``teacher_cache.datasets.<s.name>`` loaded on ``device`` for a run on ``tokens_dir``, with the
    rows, spec and constants the build would make."""
    t0 = time.time()
    name, cfg, batch_size, shard_rows, cpu_threads = s.name, s.cfg, s.batch_size, s.shard_rows, s.cpu_threads
    tokens_dir, teacher_dir = Path(tokens_dir), Path(s.teacher_dir)
    meta = read_meta(tokens_dir)
    tok_sha = tokenizer_sha256(teacher_dir)
    if tok_sha != meta["tokenizer"]["sha256"]:
        raise TeacherCacheError(
            f"{tokens_dir} was tokenized with another tokenizer ({meta['tokenizer']['spec']}) than the teacher in "
            f"{teacher_dir} uses; set tokenize.tokenizer to this teacher and re-run tokenize")
    rows, subset = split_rows(name, tokens_dir, cfg.split, cfg.max_rows)
    if cfg.split != "train":
        raise TeacherCacheError(f"teacher_cache.datasets.{name}.split={cfg.split!r}: a student trains on the train "
                                "split, so a live teacher computes its targets there")
    if subset is not None:
        rows = rows.select(subset)
    model, _ = load_teacher(teacher_dir, cfg.head, device)
    facts = describe(model, batch_size, cpu_threads)
    spec = signal_spec(cfg, facts, meta, rows)
    arrays, info = {}, {}
    if constant_names(spec):
        cuda = facts.compute["cpu_threads"] is None
        with torch_threads(None if cuda else cpu_threads):  # as the build fits them: the same bits
            arrays, info = fit_constants(model, rows, spec, batch_size, int(meta["tokenizer"]["pad_id"]))
    constants = as_constants(arrays, info, spec).to(next(model.parameters()).device) if arrays else None
    lengths = np.asarray(rows.with_format("arrow")["length"].to_numpy(zero_copy_only=False), dtype=np.int32)
    row_index = np.arange(len(lengths), dtype=np.int64) if subset is None else subset.astype(np.int64)
    digest = hashlib.sha256()
    for key in sorted(arrays):
        digest.update(key.encode() + np.ascontiguousarray(arrays[key]).tobytes())
    identity = {"teacher": {"name": teacher_dir.name, "weights_sha256": weights_sha256(teacher_dir),
                            "tokenizer_sha256": tok_sha},
                "tokens_fingerprint": meta["fingerprint"], "split": cfg.split,
                "rows": {"n": len(lengths), "max_rows": cfg.max_rows, "shard_rows": shard_rows},
                "signals": spec.to_dict(), "compute": facts.compute, "constants": digest.hexdigest()}
    log.info("live teacher %s on %s for %s: %d rows, spec ready in %.1f s", teacher_dir, facts.device, name,
             len(lengths), time.time() - t0)
    return LiveTeacher(teacher_dir, model, spec, constants, RowTable(row_index, lengths, shard_rows), facts, identity)
