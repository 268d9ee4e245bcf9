"""Atomic training checkpoints with ``resume: auto`` semantics.

A checkpoint is one ``step-<n>.pt`` file written to a temp name and renamed into place, so a
kill at any moment leaves either the old or the new checkpoint, never a torn one; so does a full disk,
which stops the run with one message (the space needed and free). Only the newest ``keep`` files are kept.
:func:`resume_or_restart` is the resume decision of every training loop: the newest checkpoint if the run
that wrote it had the same identity, else a fresh start.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from distillpipe.errors import DiskFull, disk_full_cause, free_space

log = logging.getLogger(__name__)
_NAME = re.compile(r"^step-(\d+)\.pt$")


def save_checkpoint(folder: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``state`` as ``<folder>/step-<step>.pt`` (temp file, fsync, rename), then drop all but the newest
    ``keep``. A full disk raises :class:`~distillpipe.errors.DiskFull` naming the file, the space it needs and the
    space free, and leaves the folder as it was (the partial file is removed; older checkpoints stay)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step:09d}.pt"
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as f:  # a file object: torch.save to a path reports a full disk without its errno
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        if disk_full_cause(e) is None:
            raise
        where, free = free_space(folder)
        kept = list_checkpoints(folder)
        raise DiskFull(
            f"no space left on device writing checkpoint {path}: it needs ~{_mb(state_bytes(state))} (its tensors) "
            f"and {_mb(free)} is free on {where}. Free that much there, then run the stage again: it resumes from "
            + (f"{kept[-1].name} (kept until a newer checkpoint is complete)" if kept else "the start")) from e
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def state_bytes(state: Any) -> int:
    """Bytes of the tensor storages in ``state`` (dicts, lists and tuples walked; a storage shared by several
    tensors counted once, as torch.save writes it): about the size of its checkpoint file."""
    seen: dict[tuple[str, int], int] = {}

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            seen[(str(x.device), storage.data_ptr())] = storage.nbytes()
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(state)
    return sum(seen.values())


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def list_checkpoints(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def load_latest(folder: str | Path) -> dict[str, Any] | None:
    """The newest readable checkpoint in ``folder`` (stray ``*.partial`` files are removed), or None."""
    folder = Path(folder)
    if folder.is_dir():
        for stray in folder.glob("*.partial"):
            stray.unlink(missing_ok=True)
    for path in reversed(list_checkpoints(folder)):
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # a damaged file: fall back to the previous one, loudly
            log.warning("checkpoint %s is unreadable (%s); trying an older one", path, e)
            continue
        log.info("found checkpoint %s", path)
        return state
    return None


def clear_checkpoints(folder: str | Path) -> None:
    for p in list_checkpoints(folder):
        p.unlink(missing_ok=True)


def identity_changes(old: Any, new: dict[str, Any]) -> list[str]:
    """Names of the identity fields that differ (all of them for a checkpoint without an identity)."""
    if not isinstance(old, dict):
        return ["identity (a checkpoint of an older version)"]
    return [k for k in new if old.get(k) != new[k]]


def resume_or_restart(folder: str | Path, identity: dict[str, Any] | str, *, key: str, covers: str = "",
                      main: bool = True, barrier: Callable[[], None] | None = None) -> dict[str, Any] | None:
    """The newest checkpoint in ``folder`` when the run that wrote it had this ``identity`` (which the checkpoint
    holds under ``key``); otherwise None, with the folder's checkpoints removed and a warning naming what differs.

    ``identity``: a dict of digests, whose changed fields are named; or one digest of everything, for which
    ``covers`` says what went into it. Under torchrun every process calls this: ``main`` (rank 0) warns and
    removes, after ``barrier`` has let every process read the checkpoint."""
    state = load_latest(folder)
    if state is None:
        return None
    old = state.get(key)
    changed = identity_changes(old, identity) if isinstance(identity, dict) else [] if old == identity else [covers]
    if not changed:
        return state
    if main:
        log.warning("checkpoint in %s was made with other %s: starting over", folder, ", ".join(changed))
    if barrier is not None:
        barrier()  # every process has read it before the main one removes it
    if main:
        clear_checkpoints(folder)
    return None
