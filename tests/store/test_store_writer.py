"""Writer: round trip, SIGKILL + resume byte-identity, damaged shards, concurrent writers, rebuilds."""

import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from store_helpers import HERE, build_store, full_arrays, open_for_writing, shard_arrays, tiny_manifest, tree_files

from distillpipe.store.manifest import StoreIncomplete
from distillpipe.store.reader import open_store
from distillpipe.store.resume import create_or_resume
from distillpipe.store.shards import marked_shards, marker_path
from distillpipe.store.writer import write_shard

HELPER = str(HERE / "store_helpers.py")
N, SHARD_ROWS = 500, 128


def _run_helper(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, HELPER, *map(str, args)], capture_output=True, text=True, timeout=120)


def _stats(root: Path, shards: list[int]) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every data file of ``shards``: unchanged iff the file was not rewritten."""
    out = {}
    for p in root.rglob("*"):
        parts = p.relative_to(root).parts
        if p.is_file() and "c" in parts and int(parts[parts.index("c") + 1]) in shards:
            out[str(p)] = (p.stat().st_ino, p.stat().st_mtime_ns)
    return out


def test_round_trip_reads_back_what_was_written(reference_store):
    store = open_store(reference_store, tiny_manifest())
    ref = full_arrays(store.manifest)
    got = store.read(store.arrays, 0, N)
    for name in store.arrays:
        assert got[name].dtype == ref[name].dtype and np.array_equal(got[name], ref[name]), name
    part = store.read(["hidden/L1", "row_index"], 120, 260)  # across two shard boundaries
    assert np.array_equal(part["hidden/L1"], ref["hidden/L1"][120:260])
    assert store.manifest.completed_shards == (0, 1, 2, 3)
    assert store.verify() == {}


def test_sigkill_mid_shard_then_resume_is_byte_identical(reference_store, tmp_path, caplog):
    path = tmp_path / "s.zarr"
    # The writer kills itself inside shard 2, right after writing its hidden/L1 file.
    proc = _run_helper("write", path, N, SHARD_ROWS, 2, "hidden/L1")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert marked_shards(path, 4) == [0, 1]
    assert (path / "hidden/L1/c/2/0/0").is_file() and not (path / "embeddings/c/2/0/0").exists()
    with pytest.raises(StoreIncomplete, match="2 of 4 shards complete; run `dvc repro teacher_cache`"):
        open_store(path)
    # leftovers of writes killed mid-file (Zarr and the markers write *.partial, then rename)
    (path / "hidden/L1/c/2/0/0.4f2a9c.partial").write_bytes(b"half a shard")
    (path / "shards_done/2.json.77aa.partial").write_text("{")
    (path / "tmpdir.partial").mkdir()
    before = _stats(path, [0, 1])

    manifest = tiny_manifest()
    with caplog.at_level(logging.INFO, logger="distillpipe.store"):
        writer = create_or_resume(path, manifest)
    assert "removed 3 stray *.partial" in caplog.text
    assert not [p for p in path.rglob("*") if p.name.endswith(".partial")]
    calls = []
    for i in writer.pending_shards():
        calls.append(i)
        writer.write_shard(i, shard_arrays(manifest, i))
    writer.finalize()

    assert calls == [2, 3]  # only the shards that were not complete were recomputed
    assert _stats(path, [0, 1]) == before  # ... and the complete ones were not rewritten
    assert tree_files(path) == tree_files(reference_store)  # every file, markers and metadata included


def test_damaged_shards_are_detected_and_recomputed(reference_store, store_copy, caplog):
    manifest = tiny_manifest()
    truncated = store_copy / "hidden/L3/c/1/0/0"
    truncated.write_bytes(truncated.read_bytes()[:-7])
    flipped = store_copy / "attn_probs/L2/c/3/0/0/0"  # same size, other bytes: only the checksum sees it
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    (store_copy / "logits/c/0/0").unlink()

    with caplog.at_level(logging.WARNING, logger="distillpipe.store"):
        writer = create_or_resume(store_copy, manifest, checksum=False)
    assert writer.pending_shards() == [0, 1]
    writer.close()
    assert "shard 0 is damaged" in caplog.text and "logits/c/0/0: missing" in caplog.text
    assert "shard 1 is damaged" in caplog.text and "truncated" in caplog.text
    bad = open_store(store_copy, allow_incomplete=True).verify()
    assert list(bad) == [3] and len(bad[3]) == 1
    assert re.fullmatch(r"attn_probs/L2/c/3/0/0/0: inner chunk \d+ fails its crc32c", bad[3][0]), bad

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="distillpipe.store"):
        writer = create_or_resume(store_copy, manifest)  # checksums on: the flipped byte is found too
    assert writer.pending_shards() == [0, 1, 3]
    assert "shard 3 is damaged" in caplog.text and "crc32c" in caplog.text
    for i in writer.pending_shards():
        writer.write_shard(i, shard_arrays(manifest, i))
    writer.finalize()
    assert tree_files(store_copy) == tree_files(reference_store)


def test_concurrent_writer_processes(reference_store, tmp_path):
    path = tmp_path / "s.zarr"
    writer = open_for_writing(path, tiny_manifest())  # the driver creates the store
    procs = [
        subprocess.Popen([sys.executable, HELPER, "worker", str(path), *shards], stderr=subprocess.PIPE, text=True)
        for shards in (["0", "2"], ["3", "1"])
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    assert writer.pending_shards() == [0, 1, 2, 3]  # the driver has not folded the markers yet
    assert writer.refresh() == [0, 1, 2, 3]
    writer.finalize()
    assert tree_files(path) == tree_files(reference_store)


def test_two_attempts_at_one_shard_at_once_cannot_corrupt_it(reference_store, tmp_path):
    """A lost dask worker that comes back writes the shard a second time while its replacement does: the
    files are published atomically and both attempts write the same bytes, so files and marker agree."""
    path = tmp_path / "s.zarr"
    writer = open_for_writing(path, tiny_manifest())
    procs = [subprocess.Popen([sys.executable, HELPER, "repeat", str(path), "2", "15"], stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=180) == 0, p.stderr.read()
    assert writer.refresh() == [2]
    assert not list(path.rglob("*.partial"))
    for i in writer.pending_shards():
        writer.write_shard(i, shard_arrays(writer.manifest, i))
    writer.finalize()
    assert open_store(path, verify=True).manifest.complete
    assert tree_files(path) == tree_files(reference_store)


def test_params_change_rebuilds_with_warning(store_copy, caplog):
    changed = tiny_manifest(tokens_fingerprint="tok-fp-2")
    with caplog.at_level(logging.WARNING, logger="distillpipe.store"):
        writer = create_or_resume(store_copy, changed)
    assert "params, inputs or code changed: rebuilding the teacher cache" in caplog.text
    assert "tokens_fingerprint: cache has tok-fp-1, expected tok-fp-2" in caplog.text
    assert writer.pending_shards() == [0, 1, 2, 3] and marked_shards(store_copy, 4) == []
    assert not (store_copy / "logits/c/0/0").exists()


def test_resume_of_complete_store_keeps_everything(reference_store, store_copy, caplog):
    os.unlink(store_copy / "zarr.json")  # lose the driver's progress record entirely ...
    with pytest.raises(FileExistsError, match="not a teacher cache"):
        create_or_resume(store_copy, tiny_manifest())  # ... then it is not recognised: refuse, never delete
    (store_copy / "zarr.json").write_bytes((reference_store / "zarr.json").read_bytes())
    writer = create_or_resume(store_copy, tiny_manifest())
    assert writer.pending_shards() == []
    writer.finalize()
    assert tree_files(store_copy) == tree_files(reference_store)


def test_interrupted_creation_is_rebuilt(store_copy, caplog):
    # a root group without a manifest: creation was killed before the manifest went in (it goes last)
    (store_copy / "zarr.json").write_bytes((store_copy / "hidden/zarr.json").read_bytes())
    with pytest.raises(ValueError, match="without a teacher-cache manifest"):
        open_store(store_copy)
    with caplog.at_level(logging.WARNING, logger="distillpipe.store"):
        writer = create_or_resume(store_copy, tiny_manifest())
    assert "no readable manifest" in caplog.text and "rebuilding" in caplog.text
    assert writer.pending_shards() == [0, 1, 2, 3]


def test_a_store_of_the_previous_format_is_rebuilt_naming_why(store_copy, caplog):
    """Format 6 changed what the arrays hold (compact forms, constants): a store of format 4 is refused by readers
    and rebuilt by the stage, each saying why (never read with the wrong codecs)."""
    import json

    meta = json.loads((store_copy / "zarr.json").read_text())
    meta["attributes"]["manifest"]["format_version"] = 4
    (store_copy / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="format version 4; this distillpipe reads version 6 .*compact.* is rebuilt"):
        open_store(store_copy)
    with caplog.at_level(logging.WARNING, logger="distillpipe.store"):
        writer = create_or_resume(store_copy, tiny_manifest())
    assert "format version 4" in caplog.text and "rebuilding" in caplog.text
    assert writer.pending_shards() == [0, 1, 2, 3]
    writer.close()


def test_direct_and_buffered_writes_make_the_same_files(reference_store, tmp_path, monkeypatch):
    """O_DIRECT (aligned segments, the last padded then cut back) and the buffered writev fallback give the same
    files; files of every size land whole (a tiny marker-sized one, one over a segment)."""
    import distillpipe.store.writer as writer_mod

    monkeypatch.setattr(writer_mod, "_SEGMENT", 8192)  # many segments per file, frames split across them
    monkeypatch.setattr(writer_mod, "_DIRECT", __import__("threading").local())  # a fresh buffer of that size
    direct = build_store(tmp_path / "direct.zarr", tiny_manifest())
    if getattr(writer_mod._DIRECT, "refused", False):
        pytest.skip(f"{tmp_path} takes no O_DIRECT: both stores were written through the page cache")
    monkeypatch.setattr(writer_mod, "_O_DIRECT", 0)
    buffered = build_store(tmp_path / "buffered.zarr", tiny_manifest())
    assert tree_files(direct) == tree_files(buffered) == tree_files(reference_store)
    sizes = sorted(len(b) for k, b in tree_files(direct).items() if "/c/" in k)
    assert sizes[0] < 4096 < 8192 < sizes[-1], sizes


def test_nonfinite_check_agrees_with_numpy_on_every_float16():
    """The writer's two-reduction check against np.isfinite over all 65,536 float16 bit patterns, with and without
    -inf allowed (attention scores), one pattern at a time among finite values."""
    from distillpipe.store.writer import _refuse_nonfinite

    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    base = np.zeros(7, dtype=np.float16)
    for allow in (False, True):
        refused = []
        for v in every:
            a = base.copy()
            a[3] = v
            try:
                _refuse_nonfinite(a, "x", allow_neg_inf=allow, i=0)
            except ValueError:
                refused.append(True)
            else:
                refused.append(False)
        want = ~np.isfinite(every) & ~(np.isneginf(every) if allow else False)
        assert np.array_equal(np.array(refused), want), allow


def test_write_shard_validates_its_input(tmp_path):
    manifest = tiny_manifest()
    path = tmp_path / "s.zarr"
    create_or_resume(path, manifest)
    arrays = shard_arrays(manifest, 3)
    with pytest.raises(ValueError, match=r"arrays missing \['logits'\]"):
        write_shard(path, 3, {k: v for k, v in arrays.items() if k != "logits"})
    with pytest.raises(ValueError, match=r"hidden/L1 has shape \(128, 4, 8\), expected \(116, 4, 8\)"):
        write_shard(path, 3, {**arrays, "hidden/L1": np.zeros((128, 4, 8), np.float16)})
    with pytest.raises(TypeError, match="mlm/topk_ids has dtype float32"):
        write_shard(path, 3, {**arrays, "mlm/topk_ids": arrays["mlm/topk_ids"].astype(np.float32)})
    too_big = arrays["mlm/topk_ids"].astype(np.int32)
    too_big[0, 0, 0] = 70_000
    with pytest.raises(ValueError, match="mlm/topk_ids has values 0..70000 that do not fit the stored uint16"):
        write_shard(path, 3, {**arrays, "mlm/topk_ids": too_big})
    # float32 teacher outputs are cast to the stored float16, int32 ids/positions narrowed when they fit
    wide = {"hidden/L1": np.float32, "mlm/topk_ids": np.int32, "mlm/positions": np.int32, "row_index": np.int32}
    marker = write_shard(path, 3, {**arrays, **{k: arrays[k].astype(t) for k, t in wide.items()}})
    assert marker["shard"] == 3 and marker["rows"] == [384, 500]
    got = open_store(path, allow_incomplete=True).read(list(wide), 384, 500)
    assert all(got[k].dtype == arrays[k].dtype and np.array_equal(got[k], arrays[k]) for k in wide)


def test_write_shard_refuses_nan_and_inf_but_keeps_masked_scores(tmp_path):
    """float16 overflow or a broken teacher must not reach the store: nan and inf are refused in every float array,
    after the cast (a float32 70000.0 becomes float16 inf); attention scores keep -inf, their masked blocks."""
    manifest = tiny_manifest()
    path = tmp_path / "s.zarr"
    create_or_resume(path, manifest)
    arrays = shard_arrays(manifest, 1)
    scores = arrays["attn_scores/L2"]
    assert np.isneginf(scores).any()  # the fixture has masked blocks: they must pass
    for name, value in [("hidden/L1", np.nan), ("attn_probs/L2", -np.inf), ("attn_scores/L2", np.inf),
                        ("attn_scores/L2", np.nan), ("attn_scores/L2", -np.nan), ("hidden/L3", -np.nan),
                        ("mlm/logsumexp", np.inf), ("logits", 70000.0)]:
        bad = arrays[name].astype(np.float32 if value == 70000.0 else arrays[name].dtype)
        bad.flat[5] = value
        with pytest.raises(ValueError, match=f"shard 1: {name} holds 1 nan/inf values"):
            write_shard(path, 1, {**arrays, name: bad})
        assert not (path / "shards_done" / "1.json").exists()
    write_shard(path, 1, arrays)
    assert np.array_equal(open_store(path, allow_incomplete=True).read(["attn_scores/L2"], 128, 256)["attn_scores/L2"],
                          scores)


def test_recorded_shards_reach_the_manifest_at_close_and_the_markers_at_once(tmp_path, monkeypatch):
    """The manifest is rewritten every SAVE_EVERY_S, not per shard (per shard was quadratic in shards); in
    between, the markers are the record: a reader and a resume see every written shard."""
    import zarr

    from distillpipe.store import writer as writer_mod
    from distillpipe.store.manifest import MANIFEST_KEY

    monkeypatch.setattr(writer_mod, "SAVE_EVERY_S", 1e9)
    manifest, path = tiny_manifest(), tmp_path / "s.zarr"

    def on_disk() -> list[int]:
        return zarr.open_group(str(path), mode="r").attrs.asdict()[MANIFEST_KEY]["completed_shards"]

    w = create_or_resume(path, manifest)
    for i in (2, 0):
        w.write_shard(i, shard_arrays(manifest, i))
    assert w.manifest.completed_shards == (0, 2) and w.pending_shards() == [1, 3]
    assert on_disk() == []  # not yet saved ...
    assert open_store(path, allow_incomplete=True).manifest.completed_shards == (0, 2)  # ... yet seen
    with pytest.raises(IndexError, match="out of range"):
        w.record([4])
    w.close()
    assert on_disk() == [0, 2]
    w = create_or_resume(path, manifest)  # resume: the two shards are kept
    assert w.pending_shards() == [1, 3]
    monkeypatch.setattr(writer_mod, "SAVE_EVERY_S", 0.0)
    w.write_shard(1, shard_arrays(manifest, 1))
    assert on_disk() == [0, 1, 2]  # due: saved at once
    w.write_shard(3, shard_arrays(manifest, 3))
    w.finalize()
    assert on_disk() == [0, 1, 2, 3] and open_store(path, manifest).manifest.complete


def test_a_resume_and_a_rebuild_never_write_through_a_link(tmp_path):
    """With DVC's hardlink/symlink cache types a store's files are links into the cache: a write into an existing
    file would change the cache for everyone. Every file (data, markers, manifest) is replaced by a rename, never
    written in place; so a hardlinked copy of the store (the "cache") keeps its bytes through a resume that
    re-saves the manifest and writes a lost shard, and through a rebuild. (DVC also copies a persisted output
    out of the cache before it re-runs the stage; tests/test_dvc_links.py checks the whole flow.)"""
    manifest, path, cache = tiny_manifest(), tmp_path / "s.zarr", tmp_path / "cache"
    w = create_or_resume(path, manifest)
    for i in range(manifest.n_shards):
        w.write_shard(i, shard_arrays(manifest, i))
    w.finalize()
    for p in [p for p in path.rglob("*") if p.is_file()]:
        (cache / p.relative_to(path)).parent.mkdir(parents=True, exist_ok=True)
        os.link(p, cache / p.relative_to(path))
    before = tree_files(cache)
    for p in [p for p in path.rglob("*") if p.is_file() and "/c/2" in p.as_posix()] + [marker_path(path, 2)]:
        p.unlink()  # a build killed before shard 2
    w = create_or_resume(path, manifest)  # resume: saves the manifest (shards 0, 1, 3), writes shard 2
    assert w.pending_shards() == [2]
    assert tree_files(cache) == before  # (a final manifest equal to the first would hide an in-place write)
    w.write_shard(2, shard_arrays(manifest, 2))
    w.finalize()
    assert tree_files(cache) == before
    w = create_or_resume(path, tiny_manifest(tokens_fingerprint="tok-fp-2"))  # rebuild: other inputs
    for i in range(manifest.n_shards):
        w.write_shard(i, shard_arrays(manifest, i, seed=1))
    w.finalize()
    assert tree_files(cache) == before
