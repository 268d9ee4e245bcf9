"""Reading a teacher-cache store: open with validation, read row ranges, inspect.

:func:`open_store` refuses, each with a message that says how to fix it (all user errors, exit 2):

* a store that is being written right now (its lock is held: :mod:`distillpipe.store.lock`);
* a store that does not match what the caller expects, naming every differing manifest field;
* a store whose build has not finished (unless ``allow_incomplete``);
* a damaged store: every completed shard's files must exist with the sizes its completion marker
  recorded (one ``stat`` per file, always on), and with ``verify=True`` their digests too (reads every
  byte: a training run does it when it resumes, ``distillpipe inspect --verify`` on demand).

Bytes that changed without changing a file's size are caught when they are read: every inner chunk
carries a crc32c, and :meth:`TeacherStore.read` turns a failed read into
:class:`~distillpipe.store.manifest.StoreDamaged` naming the shards it touched. So no training step
ever sees a damaged value, and no zarr traceback reaches a user.

Readers see the float16 arrays of :func:`~distillpipe.store.schema.array_layout` whatever the store's precision: an
array stored compressed (:meth:`~distillpipe.store.schema.SignalSpec.encodings`) is decoded as it is read, piece by
piece in the codec threads, straight into the float16 output (:mod:`distillpipe.store.quant`).

Reads are row ranges of whole arrays; for training use the block loader (:mod:`distillpipe.store.loader`),
which reads chunk-aligned blocks: random single-row reads decode a whole inner chunk (8-64 rows) per
row and are tens of times slower.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from distillpipe.store import constants
from distillpipe.store.anchor import explain_missing
from distillpipe.store.codec import ShardCodec, codec_pool, codec_threads
from distillpipe.store.lock import StoreLocked, writer_active
from distillpipe.store.manifest import MANIFEST_KEY, Manifest, StoreDamaged, StoreIncomplete, check_manifest
from distillpipe.store.quant import decode
from distillpipe.store.schema import CODECS, CONSTANTS, ArraySpec, array_layout, constant_names, stored_layout
from distillpipe.store.shards import marked_shards, read_marker, shard_key, tree_bytes, verify_shards

log = logging.getLogger(__name__)


class TeacherStore:
    """A validated, read-only teacher cache. Create it with :func:`open_store`.

    Holds an open Zarr group: open one per process (DataLoader workers open their own)."""

    def __init__(self, root: Path, manifest: Manifest):
        self.root = root
        self.manifest = manifest
        self.layout: dict[str, ArraySpec] = {
            s.name: s for s in array_layout(manifest.signals, manifest.n_rows, manifest.shard_rows)
        }
        """What readers see (float16 whatever the precision)."""
        self.stored: dict[str, ArraySpec] = {
            s.name: s for s in stored_layout(manifest.signals, manifest.n_rows, manifest.shard_rows)
        }
        """The Zarr arrays on disk."""
        self.encodings = manifest.signals.encodings()
        self._group = zarr.open_group(str(root), mode="r")
        self._arrays: dict[str, Any] = {}
        self._codecs: dict[str, ShardCodec] = {}

    @property
    def n_rows(self) -> int:
        return self.manifest.n_rows

    @property
    def arrays(self) -> tuple[str, ...]:
        """Names of the stored arrays, in layout order."""
        return tuple(self.layout)

    def _array(self, name: str) -> Any:
        if name not in self.stored:
            raise KeyError(f"{self.root} has no array {name!r}; it has {list(self.layout)}")
        if name not in self._arrays:
            self._arrays[name] = self._group[name]
        return self._arrays[name]

    def read(self, names: Iterable[str], start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows ``[start, stop)`` of each array in ``names``. Rows of shards that are not complete
        (only possible with ``allow_incomplete``) read as the arrays' fill values. A chunk that fails
        its checksum or cannot be decoded raises :class:`StoreDamaged` naming its shard."""
        return self.read_blocks(names, [(start, stop)])

    def read_blocks(self, names: Iterable[str], blocks: Iterable[tuple[int, int]],
                    out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The rows of several ranges ``[(start, stop), ...]``, one after the other, in one array per name
        (each row decoded straight into its place: no concatenation). ``out``: arrays to read into (at least as many
        rows, the arrays' dtype and row shape; the result's arrays are their first rows), so that a reader that
        reads window after window reuses its memory instead of faulting in fresh pages each time."""
        blocks = list(blocks)
        for start, stop in blocks:
            if not 0 <= start <= stop <= self.n_rows:
                raise IndexError(f"rows [{start}, {stop}) out of range for {self.root} with {self.n_rows} rows")
        n = sum(b - a for a, b in blocks)
        result, pieces = {}, []
        for name in names:
            if name not in self.layout:
                raise KeyError(f"{self.root} has no array {name!r}; it has {list(self.layout)}")
            spec = self.layout[name]
            if out is not None and name in out:
                rows = out[name][:n]
                assert rows.shape == (n, *spec.shape[1:]) and rows.dtype == spec.dtype and rows.flags.c_contiguous
            else:
                rows = np.empty((n, *spec.shape[1:]), dtype=spec.dtype)
            for part in self._parts(name):
                self._codec(part)  # opened here, not by the pool's threads
            at = 0
            for start, stop in blocks:
                pieces += self._pieces(name, start, stop, rows[at:at + stop - start])
                at += stop - start
            result[name] = rows
        pool = codec_pool()
        if len(pieces) >= codec_threads():
            # Enough shard files to keep every thread busy: each thread reads and decodes whole pieces, so the reads
            # of several files are in flight at once (a disk gives its bandwidth only at a queue depth > 1) and
            # overlap the decoding of others.
            for _ in pool.map(lambda piece: self._decode(*piece, None), pieces):
                pass
        else:  # few pieces: one read at a time, each piece's chunks decoded in parallel
            for piece in pieces:
                self._decode(*piece, pool)
        return result

    def _pieces(self, name: str, start: int, stop: int, out: np.ndarray) -> list[tuple]:
        """Rows [start, stop) of ``name`` as (name, shard, first, stop within the shard, out) per shard file."""
        per_shard = self.manifest.shard_rows
        return [(name, i, max(start, i * per_shard) - i * per_shard, min(stop, (i + 1) * per_shard) - i * per_shard,
                 out[max(start, i * per_shard) - start:min(stop, (i + 1) * per_shard) - start])
                for i in range(start // per_shard, -(-stop // per_shard))]

    def _parts(self, name: str) -> tuple[str, ...]:
        """The stored arrays holding ``name``: itself, or its values and scales."""
        e = self.encodings.get(name)
        return (name,) if e is None else (e.values, e.scale)

    def _decode(self, name: str, i: int, a: int, b: int, out: np.ndarray, pool: Any) -> None:
        """Rows [a, b) of shard i of ``name`` into ``out``; a compressed array's values and scales are read into
        buffers of this piece's rows and decoded into ``out`` (in this thread: pieces run on the codec threads)."""
        e = self.encodings.get(name)
        if e is None:
            self._read(name, i, a, b, out, pool)
            return
        values = np.empty(out.shape, dtype=self.stored[e.values].dtype)
        scales = np.empty(out.shape[:-1], dtype=self.stored[e.scale].dtype)
        self._read(e.values, i, a, b, values, pool)
        self._read(e.scale, i, a, b, scales, pool)
        if pool is None or len(out) < 2:
            decode(e.kind, values, scales, out)
            return
        step = -(-len(out) // codec_threads())  # this piece alone: its rows decoded on every codec thread
        for _ in pool.map(lambda r: decode(e.kind, values[r:r + step], scales[r:r + step], out[r:r + step]),
                          range(0, len(out), step)):
            pass

    def _read(self, name: str, i: int, a: int, b: int, out: np.ndarray, pool: Any) -> None:
        spec = self.stored[name]
        try:
            self._codec(name).decode_rows(self.root / shard_key(spec, i), a, b, out, pool)
        except Exception as e:  # crc32c mismatch, truncated shard index, undecodable chunk...
            raise StoreDamaged.of_shards(str(self.root), {
                i: [f"{shard_key(spec, i)}: unreadable ({type(e).__name__}: {e})"]}) from e

    def _codec(self, name: str) -> ShardCodec:
        """The array's shard codec (:mod:`distillpipe.store.codec`: Zarr's format, read without Zarr's per-read
        cost), from the array's own Zarr metadata."""
        if name not in self._codecs:
            self._codecs[name] = ShardCodec(self._array(name).metadata)
        return self._codecs[name]

    def content_sha256(self) -> str:
        """Digest of what the store holds: the manifest's identity and the digest of every completed
        shard's files as their markers record them (no file is read: pair it with ``verify``)."""
        h = hashlib.sha256(json.dumps(self.manifest.identity(), sort_keys=True).encode())
        h.update((constants.marker_digest(self.root) or "no constants").encode())
        for i in self.manifest.completed_shards:
            marker = read_marker(self.root, i)
            h.update(json.dumps(marker, sort_keys=True).encode() if marker else b"missing")
        return h.hexdigest()

    def verify(self, *, checksum: bool = True) -> dict[int | str, list[str]]:
        """Check every completed shard's files against its completion marker, and the constants against theirs:
        {shard (or ``"constants"``): problems} for the damaged ones (empty when all are intact)."""
        shards = list(self.manifest.completed_shards)
        _, bad = verify_shards(self.root, list(self.stored.values()), shards, checksum=checksum)
        problems = constants.problems(self.root, constant_names(self.manifest.signals), checksum=checksum)
        if problems:
            bad[CONSTANTS] = problems
        return bad

    def constants(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The store's constants ({name: array}, checked against their sha256) and how they were made (the
        subspace fit's report, the embedding layer's settings): :mod:`distillpipe.store.constants`."""
        return constants.read_constants(self.root, constant_names(self.manifest.signals))

    def info(self) -> dict[str, Any]:
        """Everything ``distillpipe inspect`` shows: manifest, arrays (shape, dtype as read, precision as stored,
        chunks, shards, stored bytes, bytes a row on disk, compression ratio against float16), shards, bytes on disk
        and per row."""
        arrays = []
        stored_total = raw_total = 0
        done = self.manifest.completed_shards
        rows_done = sum(b - a for a, b in map(self.manifest.shard_rows_range, done))
        for spec in self.layout.values():
            parts = [self.stored[p] for p in self._parts(spec.name)]
            stored = sum(_size(self.root / shard_key(p, i)) for p in parts for i in range(self.manifest.n_shards))
            raw = spec.row_nbytes * rows_done
            stored_total, raw_total = stored_total + stored, raw_total + raw
            e = self.encodings.get(spec.name)
            arrays.append({
                "name": spec.name, "shape": list(spec.shape), "dtype": str(spec.dtype),
                "precision": str(spec.dtype) if e is None else str(parts[0].dtype),
                "stored_as": [p.name for p in parts], "codec": "/".join(dict.fromkeys(p.codec for p in parts)),
                "codec_chain": [codec_chain(p) for p in parts], "chunks": list(spec.chunks),
                "shards": list(spec.shards),
                "fill_value": spec.fill_value, "bytes_per_row_raw": spec.row_nbytes,
                "bytes_per_row_stored_raw": sum(p.row_nbytes for p in parts), "bytes_stored": stored,
                "bytes_per_row": stored / rows_done if rows_done else None,
                "compression_ratio": raw / stored if stored else None,
            })  # fmt: skip
        on_disk = tree_bytes(self.root)
        marker = constants.read_marker(self.root) or {"arrays": {}, "info": {}}
        const_bytes = tree_bytes(self.root / CONSTANTS) if (self.root / CONSTANTS).is_dir() else 0
        return {
            "constants": {"arrays": marker["arrays"], "info": marker.get("info", {}), "bytes_on_disk": const_bytes},
            "path": str(self.root),
            "manifest": self.manifest.to_dict(),
            "n_rows": self.n_rows,
            "n_shards": self.manifest.n_shards,
            "completed_shards": len(done),
            "rows_complete": rows_done,
            "arrays": arrays,
            "bytes_on_disk": on_disk,
            "bytes_per_row": (on_disk - const_bytes) / rows_done if rows_done else None,
            "bytes_per_row_raw": sum(s.row_nbytes for s in self.layout.values()),
            "compression_ratio": raw_total / stored_total if stored_total else None,
        }


def open_store(
    path: str | Path, expected: Manifest | Mapping[str, Any] | None = None, *, allow_incomplete: bool = False,
    check_files: bool = True, verify: bool = False,
) -> TeacherStore:
    """Open the teacher cache at ``path`` read-only.

    ``expected``: a :class:`Manifest` (compared on every identity field) or a dict holding the
    manifest fields the caller cares about, nested like the manifest (e.g. ``{"teacher":
    {"tokenizer_sha256": ...}, "tokens_fingerprint": ..., "signals": {...}}``); only the fields it
    names are compared. Raises :class:`~distillpipe.store.lock.StoreLocked` while a writer holds the
    store (unless ``allow_incomplete``: inspecting a build in progress),
    :class:`~distillpipe.store.manifest.ManifestMismatch` naming every differing field,
    :class:`~distillpipe.store.manifest.StoreIncomplete` when shards are missing (unless
    ``allow_incomplete``, for inspection) and :class:`~distillpipe.store.manifest.StoreDamaged` when a
    completed shard's files are missing or have other sizes than recorded (``check_files``; with
    ``verify`` also other digests: a chunk failing its crc32c, or other chunks than the marker's).
    """
    root = Path(path)
    owner = writer_active(root)
    if owner is not None and not allow_incomplete:  # inspecting a build in progress is fine; using it is not
        raise StoreLocked(f"teacher cache {root} is being written right now ({owner}); wait for the teacher_cache "
                          "stage to finish")
    if not (root / "zarr.json").is_file():  # what git's dvc.lock says of it when it names it (store/anchor.py)
        raise FileNotFoundError(explain_missing(root) or
                                f"no teacher cache at {root}: run `dvc repro teacher_cache` (or `dvc pull` it from the "
                                "remote)")
    attrs = zarr.open_group(str(root), mode="r").attrs.asdict()
    if MANIFEST_KEY not in attrs:
        raise ValueError(f"{root} is a Zarr group without a teacher-cache manifest; its creation was interrupted "
                         "or it is not a teacher cache: run `dvc repro teacher_cache`")  # fmt: skip
    manifest = Manifest.from_dict(attrs[MANIFEST_KEY])
    if expected is not None:
        check_manifest(expected, manifest, where=str(root))
    # Markers written by workers after the driver's last manifest update still count.
    done = sorted(set(manifest.completed_shards) | set(marked_shards(root, manifest.n_shards)))
    manifest = manifest.with_completed(done)
    if not manifest.complete and not allow_incomplete:
        raise StoreIncomplete(str(root), len(done), manifest.n_shards)
    store = TeacherStore(root, manifest)
    if check_files or verify:
        bad = store.verify(checksum=verify)
        if bad:
            raise StoreDamaged.of_shards(str(root), bad)
    return store


def format_info(info: Mapping[str, Any]) -> str:
    """Human-readable text of :meth:`TeacherStore.info`."""
    m = info["manifest"]
    t, s = m["teacher"], m["signals"]
    lines = [
        f"teacher cache  {info['path']}",
        f"format         v{m['format_version']} (written by distillpipe {m['code_version']})",
        f"teacher        {t['name']}  weights {t['weights_sha256'][:12]}…  tokenizer {t['tokenizer_sha256'][:12]}…",
        f"tokens         {m['tokens_fingerprint'][:12]}… (split {m['split']})",
        f"computed       {', '.join(f'{k} {v}' for k, v in m['compute'].items())}",
        f"code           {len(m['code'])} files, digest {_digest(m['code'])[:12]}…",
        f"signals        task={s['task']} pool={s['pool']} L={s['max_seq_len']} hidden={s['hidden_layers']} "
        f"attn_scores={s['attn_layers']} attn_probs={s['attn_probs_layers']} mlm_topk={s['mlm_topk']} "
        f"embeddings={s['embedding_size']}",
        f"compact        hidden_rank={s['hidden_rank'] or 'full'} (fitted on {s['hidden_fit_rows']} rows) "
        f"attn_rank={s['attn_rank'] or 'dense'} embeddings={'derived' if s['embedding_size'] else '-'}",
        f"precision      {', '.join(f'{k} {v}' for k, v in s['precision'].items())}",
        f"rows           {info['n_rows']:,} in {info['n_shards']} shards of {m['shard_rows']:,}; "
        f"{info['completed_shards']} shards complete ({info['rows_complete']:,} rows)",
        f"on disk        {_mib(info['bytes_on_disk'])}, {_num(info['bytes_per_row'])} bytes/row "
        f"(raw {info['bytes_per_row_raw']:,} bytes/row), compression {_ratio(info['compression_ratio'])}",
        f"constants      {_mib(info['constants']['bytes_on_disk'])} once ({len(info['constants']['arrays'])} arrays: "
        f"{', '.join(sorted({n.split('/')[1] for n in info['constants']['arrays']})) or 'none'})",
        "",
        f"{'array':<20} {'shape':<24} {'dtype':<8} {'stored':<8} {'codec':<18} {'chunks':<20} {'shards':<20} "
        f"{'on disk':>11} {'bytes/row':>10} {'ratio':>7}",
    ]
    for a in info["arrays"]:
        lines.append(
            f"{a['name']:<20} {_shape(a['shape']):<24} {a['dtype']:<8} {a['precision']:<8} {a['codec']:<18} "
            f"{_shape(a['chunks']):<20} {_shape(a['shards']):<20} {_mib(a['bytes_stored']):>11} "
            f"{_num(a['bytes_per_row']):>10} {_ratio(a['compression_ratio']):>7}"
        )
    fit = info["constants"]["info"].get("hidden", {})
    if fit:
        lines.append("")
        for layer, f in fit.items():
            spectrum = sorted(f["spectrum"].items(), key=lambda kv: int(kv[0]))
            lines.append(f"fit hidden/{layer}: the top {f['rank']} principal components keep "
                         f"{100 * f['variance_kept']:.1f}% of the variance ({f['positions']:,} positions of "
                         f"{f['rows']:,} rows); kept at r = " + ", ".join(f"{r}: {100 * v:.1f}%" for r, v in spectrum))
    emb = info["constants"]["info"].get("embeddings")
    if emb:
        lines.append(f"derived embeddings: LayerNorm(word[ids] + position[pos] + token_type[types]), eps "
                     f"{emb['eps']:g}, positions {emb['positions']}")
    chains = {a["codec"]: a["codec_chain"][0] for a in info["arrays"]}
    lines.append("")
    lines += [f"codec {name}: {chain}" for name, chain in chains.items()]
    for name, e in m.get("encoding", {}).items():
        lines.append(f"  {name} = {e['values']}, {e['scale']}: {e['formula']}")
    for group, formula in m.get("compact", {}).items():
        lines.append(f"compact {group}: {formula}")
    return "\n".join(lines)


def codec_chain(spec: ArraySpec) -> str:
    """The Zarr codec chain of an inner chunk of ``spec``, in words (what ``inspect`` shows)."""
    blosc = CODECS[spec.codec]
    mid = "" if blosc is None else f"blosc({blosc[0]}, clevel {blosc[1]}, {blosc[2]}) -> "
    return f"bytes -> {mid}crc32c per inner chunk (chunks of fill values only are not stored)"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _shape(shape: list[int]) -> str:
    return "(" + ", ".join(str(x) for x in shape) + ")"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"
