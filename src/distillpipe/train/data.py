"""Training data for students: token rows joined with their teacher-cache rows.

A :class:`Source` is one dataset: its tokens (``data/tokens/<name>``) and its teacher cache
(``data/teacher/<name>.zarr``), opened with the manifest checked against the tokens (same tokens
fingerprint and tokenizer: a stale cache is refused, naming the field). The cache drives the
order: the block loader yields shuffled cache rows and their ``row_index``; the matching token rows
are fetched from the (memory-mapped) Arrow split.

Rows without ground truth (augmented questions: a ``labeled`` column that is false, or a tokens
meta.json with ``labeled: false``) get IGNORE labels, so only teacher losses apply to them
(WaLDORf eq. (8)).

:class:`Mixture` interleaves the batches of several sources (a dataset and its augmented,
unlabeled rows, each with its own cache: nothing is computed twice) in a seeded order fixed per
epoch, so its position is two integers.

Collation is :func:`distillpipe.data.collate.collate` (evaluation uses it too), plus :func:`teacher_targets`, the
batch's teacher-cache rows cropped to its length.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distillpipe.assets import load_tokenizer
from distillpipe.data.collate import TrainDataError
from distillpipe.data.masking import MaskingSpec, fresh_views
from distillpipe.data.schema import read_meta
from distillpipe.pooling import n_groups
from distillpipe.store import constants as store_constants
from distillpipe.store.loader import BlockLoader, RowTable
from distillpipe.store.reader import TeacherStore, open_store
from distillpipe.store.schema import (
    ATTN_PROBS,
    ATTN_SCORES,
    EMBEDDINGS,
    END_LOGITS,
    HIDDEN,
    LENGTH,
    START_LOGITS,
    SignalSpec,
    array_group,
    constant_names,
    dense_scores,
    signal_arrays,
    subspace_arrays,
)
from distillpipe.teacher.live import LiveTeacher

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class SourceInfo:
    name: str
    kind: str
    """Tokens kind: 'mlm', 'classification' or 'qa'."""
    task_type: str
    labeled: bool
    """False for augmented rows: no ground truth, teacher losses only (WaLDORf eq. (8))."""
    signals: SignalSpec
    meta: dict


class Source:
    """One dataset's token rows and where their teacher targets come from: its teacher cache (``teacher`` a store
    path), or the teacher itself, run on each batch (``teacher`` a :class:`~distillpipe.teacher.live.LiveTeacher`).
    ``loader`` iterates the rows in seeded shuffled blocks; a live source reads the same rows in the same order as
    a cache of them would give (:class:`~distillpipe.store.loader.RowTable`), and :meth:`complete` adds their
    targets, so the training loop cannot tell the two apart."""

    def __init__(self, name: str, tokens_dir: str | Path, teacher: str | Path | LiveTeacher, names: Sequence[str], *,
                 batch_size: int, seed: int, block_rows: int, buffer_blocks: int, streams: int,
                 num_workers: int = 0, rank: int = 0, world: int = 1, fresh_masks: bool = False):
        """``batch_size`` is the global batch; this process (``rank`` of ``world``) gets its streams' part of it,
        read by ``num_workers`` DataLoader workers (see :mod:`distillpipe.store.loader`). ``fresh_masks`` (MLM rows,
        a live teacher): each epoch masks every block anew (:func:`~distillpipe.data.masking.fresh_views`), and the
        teacher scores the masks the student sees."""
        from datasets import load_from_disk

        tokens_dir = Path(tokens_dir)
        meta = read_meta(tokens_dir)
        expected = {"teacher": {"tokenizer_sha256": meta["tokenizer"]["sha256"]},
                    "tokens_fingerprint": meta["fingerprint"], "split": "train"}
        self.live: LiveTeacher | None = teacher if isinstance(teacher, LiveTeacher) else None
        self.store: TeacherStore | None = None
        if self.live is None:
            self.store = open_store(Path(teacher), expected)  # refuses a stale or unfinished cache, naming the field
            signals, available, where = self.store.manifest.signals, set(self.store.layout), str(teacher)
            rows_source: Path | RowTable = Path(teacher)
        else:
            signals, available = self.live.spec, set(signal_arrays(self.live.spec))
            where, rows_source = f"the live teacher {self.live.teacher_dir}", self.live.rows
        missing = [n for n in names if n not in available]
        if missing:
            raise TrainDataError(
                f"{where} has no {missing} (it has {sorted(available)}): the loss terms of this run need "
                f"them; add the signals to teacher_cache.datasets.{name}.signals or set their loss_weights to 0")
        data = load_from_disk(str(tokens_dir))
        if "train" not in data:
            raise TrainDataError(f"{tokens_dir} has no train split (splits: {list(data)})")
        self.rows = data["train"]
        n_rows = self.store.n_rows if self.store is not None else self.live.rows.n_rows
        if n_rows > len(self.rows):
            raise TrainDataError(f"{where} has {n_rows} rows but {tokens_dir} train has {len(self.rows)}")
        self.info = SourceInfo(name=name, kind=meta["kind"], task_type=meta["task_type"],
                               labeled=bool(meta.get("labeled", True)), signals=signals, meta=meta)
        self.pad_id = int(meta["tokenizer"]["pad_id"])
        read = ["length"] if self.live is not None else list(dict.fromkeys(["length", *names]))
        try:
            self.loader = BlockLoader(rows_source, read, block_rows=block_rows, buffer_blocks=buffer_blocks, seed=seed,
                                      expected=expected, batch_size=batch_size, streams=streams,
                                      num_workers=num_workers, rank=rank, world=world)
        except ValueError as e:  # sizes that do not fit together: the message names the params to change
            raise TrainDataError(f"{name}: {e}") from None
        self.columns = _columns(self.info.kind, self.rows.column_names)
        self.views: tuple[MaskingSpec, int] | None = None
        """With fresh masks: the tokenize stage's masking and its static views per block."""
        if fresh_masks:
            self.views = self._masking(tokens_dir, meta)
            self.columns += ["block_id", "view"]
        self._cols = self.rows.select_columns(self.columns)
        if self.live is not None:
            self.constants = self.live.constants
        else:
            self.constants = store_constants.load(teacher, signals) if constant_names(signals) else None
        """The subspaces and derived embedding layer (the store's, checked against its constants marker, or the live
        teacher's own fit), moved to the training device by :meth:`to`."""

    @property
    def teacher_config(self) -> dict:
        """The teacher's model config (a regression task's bin width is in it)."""
        return dict(self.store.manifest.teacher.config) if self.store is not None else self.live.facts.config

    def identity(self) -> Any:
        """What decides this source's targets, as digests (part of a run's identity)."""
        return self.store.content_sha256() if self.store is not None else self.live.identity

    def without_embedding_targets(self) -> Source:
        """Stop deriving the teacher's embedding output for every batch (a run with no embedding loss: the cache's
        tables served ``embedding_init`` at most)."""
        if self.constants is not None and self.constants.embeddings is not None:
            self.constants = replace(self.constants, embeddings=None)
        return self

    def to(self, device: torch.device) -> Source:
        if self.constants is not None:
            self.constants = self.constants.to(device)
        return self

    def complete(self, batch: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]) -> None:
        """Add to a collated batch's ``targets`` (on the device) what the cache does not hold as rows: with a live
        teacher every signal, computed on this batch; each layer's subspace under its constant names, and the
        embedding output (:mod:`distillpipe.compact`)."""
        if self.live is not None:
            targets.update(self.live.targets(batch))
        c = self.constants
        if c is None:
            return
        for j, pair in c.subspaces.items():
            targets.update(zip(subspace_arrays(j), pair))
        if c.embeddings is not None:
            with torch.no_grad():
                targets[EMBEDDINGS] = c.embeddings(batch["input_ids"], batch["token_type_ids"],
                                                   batch["attention_mask"])

    def _masking(self, tokens_dir: Path, meta: dict) -> tuple[MaskingSpec, int]:
        """The masking the tokenize stage applied to these rows (its params, recorded in the tokens' meta, and the
        tokenizer's special tokens), to draw new views with; refused where fresh masks cannot be right."""
        if self.live is None:
            raise TrainDataError(f"{self.info.name}: fresh MLM masks need the teacher live (a run's teacher: "
                                 "models/teacher/<name>): a cache holds the teacher's outputs at the static masks only")
        p = meta.get("params") or {}
        if self.info.kind != "mlm" or not {"block_id", "view"} <= set(self.rows.column_names) or "mask_prob" not in p:
            raise TrainDataError(f"{tokens_dir} is not an MLM corpus of the tokenize stage (kind {self.info.kind}): "
                                 "fresh masks re-mask its blocks; set mlm_views: static")
        tok, _ = load_tokenizer(str(self.live.teacher_dir))  # the tokens' tokenizer (live_teacher checked its digest)
        spec = MaskingSpec.build(mask_prob=p["mask_prob"], mask_token_fraction=p["mask_token_fraction"],
                                 random_token_fraction=p["random_token_fraction"], seed=p["seed"],
                                 mask_id=int(meta["tokenizer"]["mask_id"]), special_ids=tok.all_special_ids,
                                 vocab_size=len(tok))
        return spec, int(p["mask_views"])

    def batches(self) -> Iterator[tuple[dict, dict]]:
        for row_index, arrays in self.loader:
            rows = self._cols[row_index.tolist()]
            if self.views is not None:  # this epoch's masks (epoch 0: the static ones)
                spec, views = self.views
                rows = fresh_views(rows, spec, "train", views, self.loader.epoch)
            yield rows, arrays


def _columns(kind: str, available: Sequence[str]) -> list[str]:
    cols = ["input_ids", "token_type_ids", "length"] + (["labeled"] if "labeled" in available else [])
    if kind == "mlm":
        cols += ["masked_positions", "masked_labels"]
    elif kind == "classification":
        cols += ["label"] + [c for c in ("a_input_ids", "b_input_ids") if c in available]
    elif kind == "qa":
        cols += ["start_positions", "end_positions"]
    return cols


class Mixture:
    """The batches of several sources interleaved in a seeded order, one epoch per ``for`` loop; resumable.
    Each batch comes from one source (so it has one kind and one labeled flag)."""

    def __init__(self, sources: Sequence[Source], seed: int):
        self.sources = list(sources)
        self.seed = seed
        self.epoch = 0
        self.position = 0

    def order(self, epoch: int) -> np.ndarray:
        """Source id of every batch of ``epoch``: each source's batches, shuffled together."""
        counts = []
        for s in self.sources:
            s.loader.set_epoch(epoch)
            counts.append(len(s.loader))
        ids = np.repeat(np.arange(len(counts)), counts)
        if len(counts) > 1:
            ids = np.random.default_rng([self.seed, epoch, 7919]).permutation(ids)
        return ids

    def __len__(self) -> int:
        """Batches in the current epoch."""
        return len(self.order(self.epoch))

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def __iter__(self) -> Iterator[tuple[Source, dict, dict]]:
        order = self.order(self.epoch)
        for i, s in enumerate(self.sources):  # where each source stood at this position of the epoch
            s.loader.set_epoch(self.epoch)
            s.loader.batches_consumed = int((order[: self.position] == i).sum())
        iters = [s.batches() for s in self.sources]
        for sid in order[self.position:]:
            rows, arrays = next(iters[sid])
            self.position += 1  # counted before the caller sees it: a state saved now includes it
            yield self.sources[sid], rows, arrays
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "sources": [s.info.name for s in self.sources],
                "loaders": [s.loader.state_dict() for s in self.sources]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["sources"] != [s.info.name for s in self.sources] or state["seed"] != self.seed:
            raise ValueError(f"cannot resume: the checkpoint mixes {state['sources']} (seed {state['seed']}), this "
                             f"run {[s.info.name for s in self.sources]} (seed {self.seed})")
        for s, ls in zip(self.sources, state["loaders"], strict=True):
            s.loader.load_state_dict(ls)  # checks the loader settings are the checkpoint's
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def teacher_targets(arrays: dict[str, np.ndarray], attention_mask: torch.Tensor, pool: int) -> dict[str, torch.Tensor]:
    """The teacher-cache rows of a collated batch as loss targets, cropped to the batch's length T (the columns of
    ``attention_mask``, (B, T)): (N, L) arrays to (B, T), pooled (N, L/p, ...) ones to (B, ceil(T/p), ...) as the
    capture pooled them (:func:`distillpipe.pooling.n_groups`), low-rank factors along their last axis, float16 as
    float32. The cache's ``length`` is
    checked against the token rows', not returned."""
    B, T = attention_mask.shape
    Tp = n_groups(T, pool)
    targets: dict[str, torch.Tensor] = {}
    for name, a in arrays.items():
        if name == LENGTH:
            continue
        t = torch.from_numpy(np.ascontiguousarray(a))
        if t.dtype == torch.float16:
            t = t.float()
        group = array_group(name)
        if name in (START_LOGITS, END_LOGITS):
            t = t[:, :T]
        elif group == HIDDEN:
            t = t[:, :Tp]
        elif dense_scores(name):
            t = t[:, :, :Tp, :Tp]
        elif group == ATTN_SCORES:
            t = t[..., :Tp]  # factors (B, H, r, Lp) -> (B, H, r, Tp)
        elif group == ATTN_PROBS and name.count("/") == 1:
            t = t[:, :, :T, :T]  # (B, H, L, L) -> (B, H, T, T): positions, never heads
        elif group == ATTN_PROBS:
            t = t[..., :T]  # factors (B, H, r, L) -> (B, H, r, T)
        targets[name] = t
    if LENGTH in arrays and not np.array_equal(arrays[LENGTH], attention_mask.sum(dim=1).numpy()):
        raise TrainDataError("teacher cache rows do not match the token rows (lengths differ): the cache "
                             "is not from these tokens; re-run teacher_cache")
    return targets
