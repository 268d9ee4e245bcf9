"""Files of one work shard, and the completion markers that make shard writes safe to resume.

Each work shard ``i`` is exactly one file per array: ``<array>/c/<i>/0/.../0`` (Zarr v3 default
chunk-key encoding with "/" separator, shards spanning every non-row axis). After the writer of
shard ``i`` has written all of its arrays it writes ``shards_done/<i>.json`` (temp file +
``os.replace``, so it is atomic) recording the size and digest of each of those files (``null`` for
a file Zarr did not create because every inner chunk equals the fill value): the crc32c of its chunks' crc32c values
and its index (:mod:`distillpipe.store.codec`), computed while writing at no cost, checked by reading the file once.
The marker is the only thing that makes a shard count as complete:

* a writer killed at any point leaves no marker (or the previous one, removed before rewriting),
  so the shard is redone;
* markers of different shards are different files, so any number of processes can write disjoint
  shards at once; only the driver folds markers into the manifest's ``completed_shards``;
* on resume a marker is checked against the files (size always, digest unless asked not to), so a
  missing, truncated or altered shard file un-marks its shard and it is recomputed.

Marker contents are a deterministic function of the shard's bytes (no times, hosts or pids), so a
resumed store is byte-identical to an uninterrupted one, markers included.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from distillpipe.store.codec import layout_codec
from distillpipe.store.schema import ArraySpec

log = logging.getLogger(__name__)

MARKER_DIR = "shards_done"
PARTIAL_SUFFIX = ".partial"


def shard_key(spec: ArraySpec, i: int) -> str:
    """Store-relative path of array ``spec``'s file for shard ``i``."""
    return "/".join([spec.name, "c", str(i), *["0"] * (len(spec.shape) - 1)])


def marker_path(root: Path, i: int) -> Path:
    return root / MARKER_DIR / f"{i}.json"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file and ``os.replace`` (readers see old or new)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_marker(root: Path, marker: dict[str, Any]) -> None:
    write_atomic(marker_path(root, marker["shard"]), json.dumps(marker, indent=1, sort_keys=True) + "\n")


def read_marker(root: Path, i: int) -> dict[str, Any] | None:
    """The marker of shard ``i``, or None if absent or unreadable (an unreadable marker is logged
    and treated as absent: the shard is redone)."""
    path = marker_path(root, i)
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("shard %d: unreadable completion marker %s (%s); the shard will be recomputed", i, path, e)
        return None
    if not isinstance(marker, dict) or marker.get("shard") != i or not isinstance(marker.get("files"), dict):
        log.warning("shard %d: malformed completion marker %s; the shard will be recomputed", i, path)
        return None
    return marker


def marked_shards(root: Path, n_shards: int) -> list[int]:
    """Shard indices that have a marker file (not yet checked), sorted."""
    folder = root / MARKER_DIR
    if not folder.is_dir():
        return []
    found = []
    for entry in os.scandir(folder):
        stem, ext = os.path.splitext(entry.name)
        if ext == ".json" and stem.isdigit() and int(stem) < n_shards:
            found.append(int(stem))
    return sorted(found)


def marker_problems(
    root: Path, layout: list[ArraySpec], i: int, marker: dict[str, Any], *, checksum: bool
) -> list[str]:
    """Why shard ``i``'s files do not match its marker (empty list = they match)."""
    expected_keys = {shard_key(s, i) for s in layout}
    if set(marker["files"]) != expected_keys:
        return [f"marker lists {sorted(marker['files'])}, the layout needs {sorted(expected_keys)}"]
    problems = []
    specs = {shard_key(s, i): s for s in layout}
    for key, rec in marker["files"].items():
        path = root / key
        if rec is None:
            if path.exists():
                problems.append(f"{key}: exists but the marker says the shard was empty")
            continue
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            problems.append(f"{key}: missing")
            continue
        if size != rec["size"]:
            problems.append(f"{key}: {size} bytes, marker says {rec['size']} (truncated or rewritten)")
        elif checksum:
            try:
                digest = layout_codec(specs[key])[1].file_digest(path)
            except (OSError, ValueError) as e:
                problems.append(f"{key}: {e}")
                continue
            if digest != rec.get("crc32c"):
                problems.append(f"{key}: digest {digest} differs from marker {rec.get('crc32c')}")
    return problems


def verify_shards(
    root: Path, layout: list[ArraySpec], shards: list[int], *, checksum: bool, threads: int = 8
) -> tuple[list[int], dict[int, list[str]]]:
    """Check the markers of ``shards`` against the files: (good shards, {bad shard: problems}).

    Checking digests reads every byte of every checked shard (crc32c runs at ~14 GB/s a core and releases the GIL on
    large chunks, so ``threads`` files are checked at once; the disk is the bound); pass ``checksum=False`` to check
    sizes only, which costs one ``stat`` per file.
    """

    def check(i: int) -> list[str]:
        marker = read_marker(root, i)
        if marker is None:
            return ["no readable completion marker"]
        return marker_problems(root, layout, i, marker, checksum=checksum)

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        results = list(pool.map(check, shards))
    good = [i for i, p in zip(shards, results) if not p]
    bad = {i: p for i, p in zip(shards, results) if p}
    return good, bad


def remove_shard(root: Path, layout: list[ArraySpec], i: int) -> None:
    """Forget shard ``i``: its marker first (so a crash in between cannot leave a marker for
    missing data), then its files."""
    marker_path(root, i).unlink(missing_ok=True)
    for s in layout:
        (root / shard_key(s, i)).unlink(missing_ok=True)


def remove_partials(root: Path) -> list[Path]:
    """Delete every file or folder under ``root`` whose name ends with ``.partial`` (temp files of
    writes that were killed: Zarr's ``LocalStore`` and our markers both write ``*.partial`` then
    rename). Only safe while no writer is running."""
    removed = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            if name.endswith(PARTIAL_SUFFIX):
                (Path(dirpath) / name).unlink(missing_ok=True)
                removed.append(Path(dirpath) / name)
        for name in list(dirnames):
            if name.endswith(PARTIAL_SUFFIX):
                shutil.rmtree(Path(dirpath) / name, ignore_errors=True)
                removed.append(Path(dirpath) / name)
                dirnames.remove(name)
    return removed


def tree_bytes(path: Path) -> int:
    """Total size of the files under ``path`` (apparent sizes, not disk blocks)."""
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total
