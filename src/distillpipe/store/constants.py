"""The arrays a teacher-cache store holds once, not per row (:func:`~distillpipe.store.schema.constant_names`): each
cached layer's principal subspace (mean and basis) and the teacher's embedding tables.

They are plain Zarr arrays under ``constants/``, one chunk each (``bytes`` -> ``crc32c``: float32 weights do not
compress), written once by the build's driver before any shard (the shards' coordinates are in these bases) and
recorded in ``constants.json`` at the store's root: each array's shape, dtype and the sha256 of its values, and
``info``, how they were made (the subspace fit's sample and variance kept, the embedding layer's eps and position
rule). The marker is written last, so a store without one has no constants yet. Reading checks every array against
its sha256 (the largest, an embedding table of BERT-Large, is 125 MB, read once per training process), so constants
that changed on disk are refused, as a damaged shard is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from zarr.codecs import Crc32cCodec

from distillpipe.compact import EMBEDDING_TABLES, Constants, DerivedEmbeddings
from distillpipe.store.codec import CHUNK_KEY_ENCODING
from distillpipe.store.manifest import DAMAGE_FIX, StoreDamaged
from distillpipe.store.schema import EMBEDDING_CONSTANTS, SignalSpec, constant_names, subspace_arrays
from distillpipe.store.shards import write_atomic

MARKER = "constants.json"


def _sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).view(np.uint8).reshape(-1)).hexdigest()


def write_constants(root: str | Path, arrays: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``arrays`` (names under ``constants/``, little-endian) and then the marker; returns the marker. Arrays
    of a previous attempt are overwritten (an interrupted write left no marker)."""
    root = Path(root)
    group = zarr.open_group(str(root), mode="r+")
    records = {}
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        z = group.create_array(name, shape=a.shape, chunks=a.shape, dtype=a.dtype, compressors=(Crc32cCodec(),),
                               fill_value=0, chunk_key_encoding=CHUNK_KEY_ENCODING, overwrite=True,
                               config={"write_empty_chunks": True})  # a file per constant, zeros too
        z[...] = a
        records[name] = {"shape": list(a.shape), "dtype": a.dtype.str, "sha256": _sha256(a)}
    marker = {"arrays": records, "info": _json(info)}
    write_atomic(root / MARKER, json.dumps(marker, indent=1, sort_keys=True) + "\n")
    return marker


def read_marker(root: str | Path) -> dict[str, Any] | None:
    """The store's constants marker, or None when it has none (or an unreadable one)."""
    try:
        marker = json.loads((Path(root) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("arrays"), dict) else None


def marker_digest(root: str | Path) -> str | None:
    """The sha256 of the store's constants marker as it is on disk (None without one): what changes when the
    constants do."""
    try:
        return hashlib.sha256((Path(root) / MARKER).read_bytes()).hexdigest()
    except OSError:
        return None


def problems(root: str | Path, names: Iterable[str], *, checksum: bool) -> list[str]:
    """Why the store's constants are not the ones ``names`` needs (empty: they are): no marker, other arrays, a
    missing file, or (``checksum``) values whose sha256 differs from the marker's."""
    root = Path(root)
    names = sorted(names)
    if not names:  # a store with nothing to keep once needs no constants (the build writes an empty marker)
        return []
    marker = read_marker(root)
    if marker is None:
        return [f"{MARKER}: missing or unreadable"]
    if sorted(marker["arrays"]) != names:
        return [f"{MARKER} lists {sorted(marker['arrays'])}, the signals need {names}"]
    out = []
    for name, rec in marker["arrays"].items():
        chunk = root / name / "c" / "/".join(["0"] * max(1, len(rec["shape"])))
        if not (root / name / "zarr.json").is_file() or not chunk.is_file():
            out.append(f"{name}: missing")
        elif checksum:
            try:
                a = _read(root, name)
            except Exception as e:  # a chunk failing its crc32c, undecodable metadata
                out.append(f"{name}: unreadable ({type(e).__name__}: {e})")
                continue
            if list(a.shape) != rec["shape"] or a.dtype.str != rec["dtype"] or _sha256(a) != rec["sha256"]:
                out.append(f"{name}: its values differ from the sha256 in {MARKER}")
    return out


def read_constants(root: str | Path, names: Iterable[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """({name: array} for ``names``, the marker's ``info``), every array checked against its sha256; raises
    :class:`~distillpipe.store.manifest.StoreDamaged` naming what is wrong."""
    root = Path(root)
    names = list(names)
    marker = read_marker(root)
    if marker is None:
        raise StoreDamaged(f"teacher cache {root} has no readable {MARKER} (its subspaces and embedding tables): "
                           + DAMAGE_FIX.format(path=root))
    out, bad = {}, []
    for name in names:
        rec = marker["arrays"].get(name)
        if rec is None:
            bad.append(f"{name}: not in {MARKER}")
            continue
        try:
            a = _read(root, name)
        except Exception as e:
            bad.append(f"{name}: unreadable ({type(e).__name__}: {e})")
            continue
        if list(a.shape) != rec["shape"] or a.dtype.str != rec["dtype"] or _sha256(a) != rec["sha256"]:
            bad.append(f"{name}: its values differ from the sha256 in {MARKER}")
            continue
        out[name] = a
    if bad:
        raise StoreDamaged(f"teacher cache {root}: damaged constants: {'; '.join(bad)}. "
                           + DAMAGE_FIX.format(path=root))
    return out, marker.get("info", {})


def load(root: str | Path, spec: SignalSpec) -> Constants:
    """The constants a store of ``spec`` needs, checked (:func:`read_constants`), as CPU tensors (``.to(device)``)."""
    arrays, info = read_constants(root, constant_names(spec))
    return as_constants(arrays, info, spec)


def as_constants(arrays: Mapping[str, np.ndarray], info: Mapping[str, Any], spec: SignalSpec) -> Constants:
    """:class:`~distillpipe.compact.Constants` from the arrays and info of a store's constants (or of a fit)."""
    subspaces = {}
    for j in spec.hidden_layers if spec.hidden_rank else ():
        mean, basis = subspace_arrays(j)
        subspaces[j] = (torch.from_numpy(np.asarray(arrays[mean])), torch.from_numpy(np.asarray(arrays[basis])))
    embeddings = None
    if spec.embedding_size:
        tables = {t: arrays[name] for t, name in zip(EMBEDDING_TABLES, EMBEDDING_CONSTANTS)}
        embeddings = DerivedEmbeddings(tables, **info["embeddings"])
    return Constants(subspaces=subspaces, embeddings=embeddings)


def _read(root: Path, name: str) -> np.ndarray:
    return np.asarray(zarr.open_array(str(root / name), mode="r")[...])


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))
