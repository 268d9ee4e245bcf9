"""Tiny store specs and deterministic random shard data for the store tests.

Also a script, so tests can write shards in real subprocesses (killed with SIGKILL, or several
concurrent writers):

    python store_helpers.py write  <store> <N> <shard_rows> [<kill_shard> <kill_after_array>]
    python store_helpers.py write-int8 ...   (the same with every quantizable signal compressed: INT8)
    python store_helpers.py write-compact ... (the same in the compact forms, int8, with constants)
    python store_helpers.py worker <store> <shard> [<shard> ...]
    python store_helpers.py hold   <store> <N> <shard_rows>   (open as the writer, say so, wait for stdin EOF)
    python store_helpers.py repeat <store> <shard> <times>     (write one shard again and again)
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

from distillpipe.store.manifest import Manifest, TeacherInfo
from distillpipe.store.schema import (
    ATTN_MASKED,
    EMBEDDING_CONSTANTS,
    MLM_UNUSED_POSITION,
    SignalPrecision,
    SignalSpec,
    array_layout,
    constant_names,
    dense_scores,
    subspace_arrays,
)

HERE = Path(__file__).resolve().parent


def tiny_spec(**overrides) -> SignalSpec:
    fields = dict(
        max_seq_len=16, pool=4, task="classification", n_classes=3, vocab_size=100, mlm_topk=5,
        mlm_max_masked=3, hidden_layers=(1, 3), hidden_size=8, attn_layers=(2,), n_heads=2,
        attn_probs_layers=(2,), embedding_size=0,
    )  # fmt: skip
    fields.update(overrides)
    return SignalSpec(**fields)


INT8 = SignalPrecision(hidden="int8", attention="int8", mlm_topk="uint8")
"""Every quantizable signal compressed."""
COMPACT = {"hidden_rank": 3, "hidden_fit_rows": 16, "attn_rank": 2}
"""tiny_spec overrides for the compact forms: hidden states in a 3-dimensional subspace, attention maps of rank 2."""


def tiny_constants(spec: SignalSpec, seed: int = 0) -> tuple[dict[str, np.ndarray], dict]:
    """Deterministic constants of the right shapes for a store of ``spec`` (subspaces with orthonormal bases, embedding
    tables) and their info, as :func:`distillpipe.store.constants.write_constants` takes them."""
    rng = np.random.default_rng([seed, 77])
    arrays: dict[str, np.ndarray] = {}
    for j in spec.hidden_layers if spec.hidden_rank else ():
        mean, basis = subspace_arrays(j)
        arrays[mean] = rng.standard_normal(spec.hidden_size).astype(np.float32)
        q, _ = np.linalg.qr(rng.standard_normal((spec.hidden_size, spec.hidden_rank)))
        arrays[basis] = q.astype(np.float32)
    if spec.embedding_size:
        e = spec.embedding_size
        shapes = {"word": (spec.vocab_size, e), "position": (spec.max_seq_len, e), "token_type": (2, e)}
        for name in EMBEDDING_CONSTANTS:
            key = name.rsplit("/", 1)[1]
            arrays[name] = (np.ones(e) if key == "norm_weight" else np.zeros(e) if key == "norm_bias"
                            else rng.standard_normal(shapes[key])).astype(np.float32)
    assert sorted(arrays) == sorted(constant_names(spec))
    info = {"embeddings": {"eps": 1e-12, "positions": "absolute", "pad_id": 0}} if spec.embedding_size else {}
    return arrays, info


def tiny_manifest(n_rows: int = 500, shard_rows: int = 128, **overrides) -> Manifest:
    teacher = overrides.pop("teacher", None) or TeacherInfo(
        name="tiny-bert", weights_sha256="a" * 64, tokenizer_sha256="3fa2" + "0" * 60,
        config={"num_hidden_layers": 4, "hidden_size": 8},
    )  # fmt: skip
    return Manifest(
        teacher=teacher,
        tokens_fingerprint=overrides.pop("tokens_fingerprint", "tok-fp-1"),
        split=overrides.pop("split", "train"),
        signals=overrides.pop("signals", None) or tiny_spec(),
        compute=overrides.pop("compute", None) or {"precision": "fp32", "batch_size": 8},
        code=overrides.pop("code", None) or {"distillpipe/teacher/shard.py": "ast-v1:" + "c0de" * 16},
        n_rows=n_rows,
        shard_rows=shard_rows,
    )


def row_index_of(rows: np.ndarray) -> np.ndarray:
    """Store row -> tokens row: distinct from the store row so tests can tell them apart."""
    return 1000 + 3 * rows.astype(np.int64)


def shard_arrays(manifest: Manifest, i: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random data for every array of shard i (a pure function of manifest, i, seed)."""
    start, stop = manifest.shard_rows_range(i)
    n = stop - start
    spec = manifest.signals
    rng = np.random.default_rng([seed, i])
    length = rng.integers(4, spec.max_seq_len + 1, size=n).astype(np.int32)
    out: dict[str, np.ndarray] = {}
    for a in array_layout(spec, manifest.n_rows, manifest.shard_rows):
        shape = (n, *a.row_shape)
        if a.name == "row_index":
            out[a.name] = row_index_of(np.arange(start, stop))
        elif a.name == "length":
            out[a.name] = length
        elif a.name == "mlm/positions":
            pos = np.sort(rng.integers(0, spec.max_seq_len, size=shape), axis=1).astype(a.dtype)
            pos[rng.random(shape) < 0.2] = MLM_UNUSED_POSITION
            out[a.name] = pos
        elif a.name == "mlm/topk_ids":
            out[a.name] = rng.integers(0, spec.vocab_size, size=shape).astype(a.dtype)
        elif dense_scores(a.name):
            x = rng.standard_normal(shape).astype(np.float16)
            lp = -(-length // spec.pool)  # pooled real length per row
            pos = np.arange(spec.pooled_len)
            masked = pos[None, :] >= lp[:, None]  # (n, Lp)
            out[a.name] = np.where(masked[:, None, :, None] | masked[:, None, None, :], ATTN_MASKED, x)
        else:
            x = (rng.standard_normal(shape) * 3).astype(a.dtype)
            # padding holds 0, as the capture writes it: whole chunks of it are left out of the files
            real = length if a.name.startswith("attn_probs/") else -(-length // spec.pool)
            if a.name.endswith(("/left", "/right")):  # factors (n, H, r, positions): 0 at padded positions
                pad = np.arange(a.row_shape[-1])[None, :] >= real[:, None]
                x = np.where(pad[:, None, None, :], 0, x).astype(a.dtype)
            elif a.name.startswith(("hidden/", "attn_probs/")):
                pad = np.arange(a.row_shape[-2 if a.name.startswith("attn_probs/") else 0])[None, :] >= real[:, None]
                if a.name.startswith("attn_probs/"):
                    x = np.where(pad[:, None, :, None] | pad[:, None, None, :], 0, x).astype(a.dtype)
                else:
                    x[pad] = 0
            out[a.name] = x
    return out


def build_store(path: Path, manifest: Manifest, seed: int = 0) -> Path:
    """Write (or finish) the store of ``manifest`` at ``path`` in-process: every pending shard, then finalize."""
    writer = open_for_writing(path, manifest, seed)
    for i in writer.pending_shards():
        writer.write_shard(i, shard_arrays(manifest, i, seed))
    writer.finalize()
    return path


def open_for_writing(path: Path, manifest: Manifest, seed: int = 0):
    """:func:`~distillpipe.store.resume.create_or_resume`, then, as the build's driver does, the store's constants
    before any shard (when it has none yet)."""
    from distillpipe.store.constants import read_marker, write_constants
    from distillpipe.store.resume import create_or_resume

    writer = create_or_resume(path, manifest)
    if read_marker(path) is None:
        write_constants(path, *tiny_constants(manifest.signals, seed))
    return writer


def full_arrays(manifest: Manifest, seed: int = 0) -> dict[str, np.ndarray]:
    """All shards' data concatenated: the reference a store must read back."""
    parts = [shard_arrays(manifest, i, seed) for i in range(manifest.n_shards)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def tree_files(root: Path) -> dict[str, bytes]:
    """Every file under root, by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _main(argv: list[str]) -> None:
    from distillpipe.store.writer import write_shard

    mode, store = argv[0], Path(argv[1])
    if mode in ("write", "write-int8", "write-compact"):
        precision = {"write": {}, "write-int8": {"precision": INT8},
                     "write-compact": {"precision": INT8, "embedding_size": 4, **COMPACT}}[mode]
        manifest = tiny_manifest(int(argv[2]), int(argv[3]), signals=tiny_spec(**precision))
        kill_shard, kill_after = (int(argv[4]), argv[5]) if len(argv) > 4 else (-1, "")
        writer = open_for_writing(store, manifest)
        pending = writer.pending_shards()
        print(json.dumps({"pending": pending}), flush=True)
        for i in pending:

            def maybe_die(name: str, nbytes: int, i: int = i) -> None:
                if i == kill_shard and name == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)

            writer.write_shard(i, shard_arrays(manifest, i), on_array_written=maybe_die)
        writer.finalize()
    elif mode == "worker":
        from distillpipe.store.writer import store_manifest

        manifest = store_manifest(store)  # a worker: the driver holds the store's lock
        for i in map(int, argv[2:]):
            write_shard(store, i, shard_arrays(manifest, i))
    elif mode == "repeat":
        from distillpipe.store.writer import store_manifest

        manifest = store_manifest(store)
        i, times = int(argv[2]), int(argv[3])
        data = shard_arrays(manifest, i)
        for _ in range(times):
            write_shard(store, i, data)
    elif mode == "hold":
        writer = open_for_writing(store, tiny_manifest(int(argv[2]), int(argv[3])))
        writer.write_shard(0, shard_arrays(writer.manifest, 0))
        print("holding", flush=True)
        sys.stdin.read()  # until the test closes our stdin (or kills us)
        writer.close()
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    _main(sys.argv[1:])
