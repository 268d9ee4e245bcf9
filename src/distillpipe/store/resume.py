"""Opening a teacher-cache store for writing, the driver's side of :mod:`distillpipe.store.writer`:
:func:`create_or_resume` takes the store's lock, compares the manifest on disk with the new one, and creates the
store, resumes it (verified shards kept, damaged ones un-marked, ``*.partial`` leftovers removed) or rebuilds it
from empty, naming what changed.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import zarr

from distillpipe.store import constants
from distillpipe.store.codec import create_array
from distillpipe.store.lock import StoreLock
from distillpipe.store.manifest import MANIFEST_KEY, Manifest, diff_manifests
from distillpipe.store.schema import constant_names, stored_layout
from distillpipe.store.shards import (
    marked_shards,
    remove_partials,
    remove_shard,
    verify_shards,
)
from distillpipe.store.writer import StoreWriter

log = logging.getLogger(__name__)

def create_or_resume(path: str | Path, manifest: Manifest, *, checksum: bool = True,
                     lock: StoreLock | None = None) -> StoreWriter:
    """Open the store at ``path`` for writing ``manifest``'s cache, keeping any verified progress.

    * no store yet: create it (every array, empty);
    * a store whose manifest identity (see :mod:`distillpipe.store.manifest`) and array layout
      equal the new ones: resume. ``*.partial`` leftovers are removed, every marked shard is checked
      against its marker (every file's digest when ``checksum``, else sizes only; reading a
      hundreds-of-GB store takes minutes: the disk is the bound) and a damaged shard is logged,
      un-marked and left pending;
    * a store built from other params or inputs: log a WARNING naming the differing fields and
      rebuild it from empty.

    Takes the store's lock first (:class:`~distillpipe.store.lock.StoreLocked` when another process
    holds it), or uses ``lock``, the store's lock already held by this process (a driver takes it before
    loading the teacher); the returned writer holds it. ``manifest``'s own ``completed_shards`` is ignored;
    progress comes from the markers on disk.
    """
    root = Path(path)
    if lock is None:
        lock = StoreLock(root).acquire()
    elif not lock.held or lock.path != StoreLock(root).path:
        raise ValueError(f"create_or_resume({root}) was handed a lock that is not this store's, held: {lock.path}")
    try:
        return _open_for_writing(root, manifest.with_completed(()), lock, checksum=checksum)
    except BaseException:
        lock.release()
        raise


def _open_for_writing(root: Path, manifest: Manifest, lock: StoreLock, *, checksum: bool) -> StoreWriter:
    old = _existing_manifest(root)
    if old is not None:
        differences = diff_manifests(manifest.to_dict(), old.to_dict(), subset=False)
        differences_text = ("; ".join(str(d) for d in differences) or _layout_differences(root, manifest)
                            or _constants_differences(root, manifest, checksum=checksum))
        if differences_text:
            log.warning(
                "params, inputs or code changed: rebuilding the teacher cache %s (%s)", root, differences_text
            )
            old = None
    if old is None:
        if root.exists():
            shutil.rmtree(root)
        _create(root, manifest)
        log.info("created teacher cache %s: %d rows in %d shards", root, manifest.n_rows, manifest.n_shards)
        return StoreWriter(root, manifest, lock)
    return _resume(root, manifest, old, lock, checksum=checksum)


def _create(root: Path, manifest: Manifest) -> None:
    """Create the group and every array; the manifest goes in last, so a store without one is a
    creation that was interrupted."""
    root.mkdir(parents=True, exist_ok=True)
    group = zarr.open_group(str(root), mode="w")
    for spec in stored_layout(manifest.signals, manifest.n_rows, manifest.shard_rows):
        create_array(group, spec)
    group.attrs[MANIFEST_KEY] = manifest.to_dict()


def _existing_manifest(root: Path) -> Manifest | None:
    """The manifest of the store at ``root``; None when there is nothing to resume (absent,
    empty, or a creation that was interrupted). Refuses to delete a folder that is not a store."""
    if not root.exists():
        return None
    if not root.is_dir():
        raise FileExistsError(f"{root} exists and is not a folder; delete it or choose another teacher cache path")
    if not (root / "zarr.json").is_file():
        leftovers = [p.name for p in root.iterdir() if not p.name.endswith(".partial")]
        if leftovers:
            raise FileExistsError(
                f"{root} exists, is not a teacher cache (no zarr.json) and is not empty ({leftovers[:5]}); "
                "delete it or choose another path"
            )
        return None
    try:
        attrs = zarr.open_group(str(root), mode="r").attrs.asdict()
        return Manifest.from_dict(attrs[MANIFEST_KEY])
    except (KeyError, ValueError, TypeError) as e:  # unparseable metadata or manifest: rebuilt, saying why
        log.warning("teacher cache %s has no readable manifest (%s: %s); rebuilding it", root, type(e).__name__, e)
        return None


def _layout_differences(root: Path, manifest: Manifest) -> str:
    """Arrays whose metadata on disk differ from the layout ``manifest`` implies ('' = none)."""
    group = zarr.open_group(str(root), mode="r")
    problems = []
    for spec in stored_layout(manifest.signals, manifest.n_rows, manifest.shard_rows):
        try:
            a = group[spec.name]
        except KeyError:
            problems.append(f"{spec.name}: missing")
            continue
        have = (tuple(a.shape), tuple(a.chunks), tuple(a.shards or ()), np.dtype(a.dtype))
        if have != (spec.shape, spec.chunks, spec.shards, spec.dtype):
            problems.append(f"{spec.name}: shape/chunks/shards/dtype {have} on disk, layout wants "
                            f"{(spec.shape, spec.chunks, spec.shards, spec.dtype)}")  # fmt: skip
    return "; ".join(problems)


def _constants_differences(root: Path, manifest: Manifest, *, checksum: bool) -> str:
    """Why the store's constants cannot be resumed with ('' = they can): the shards' coordinates and factors are in
    their bases, so damaged or missing constants (with shards written) make every shard useless. No constants and no
    shard yet: an interrupted creation, resumed (the driver computes them)."""
    names = constant_names(manifest.signals)
    if not names:
        return ""
    if constants.read_marker(root) is None:
        if marked_shards(root, manifest.n_shards):
            return f"{constants.MARKER} is missing, but shards were written with the constants it recorded"
        return ""
    return "; ".join(constants.problems(root, names, checksum=checksum))


def _resume(root: Path, manifest: Manifest, old: Manifest, lock: StoreLock, *, checksum: bool) -> StoreWriter:
    removed = remove_partials(root)
    if removed:
        log.info("teacher cache %s: removed %d stray *.partial file(s) of interrupted writes", root, len(removed))
    layout = stored_layout(manifest.signals, manifest.n_rows, manifest.shard_rows)
    marked = marked_shards(root, manifest.n_shards)
    good, bad = verify_shards(root, layout, marked, checksum=checksum)
    for i, problems in bad.items():
        log.warning("teacher cache %s: shard %d is damaged, recomputing it: %s", root, i, "; ".join(problems))
        remove_shard(root, layout, i)
    lost = sorted(set(old.completed_shards) - set(good) - set(bad))
    if lost:
        log.warning("teacher cache %s: shards %s were recorded complete but lack a marker; recomputing", root, lost)
    writer = StoreWriter(root, manifest.with_completed(good), lock)
    writer._save(writer.manifest)
    log.info(
        "resuming teacher cache %s: %d of %d shards complete, %d to write",
        root, len(good), manifest.n_shards, manifest.n_shards - len(good),
    )  # fmt: skip
    return writer
