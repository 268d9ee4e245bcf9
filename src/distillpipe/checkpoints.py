"""Atomic training checkpoints with ``resume: auto`` semantics.

A checkpoint is one ``step-<n>.pt`` file written to a temp name and renamed into place, so a
kill at any moment leaves either the old or the new checkpoint, never a torn one. Only the
newest ``keep`` files are kept.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
_NAME = re.compile(r"^step-(\d+)\.pt$")


def save_checkpoint(folder: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step:09d}.pt"
    tmp = path.with_name(path.name + ".partial")
    torch.save(state, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


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
