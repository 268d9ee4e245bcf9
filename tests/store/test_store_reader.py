"""Reader: manifest validation on open, incomplete stores, inspect info."""

import json
import math
import re

import numpy as np
import pytest
from store_helpers import shard_arrays, tiny_manifest

from distillpipe.store.lock import StoreLocked
from distillpipe.store.manifest import ManifestMismatch, StoreDamaged, StoreIncomplete
from distillpipe.store.reader import format_info, open_store
from distillpipe.store.resume import create_or_resume


def test_open_refuses_a_mismatch_naming_the_fields(reference_store):
    expected = {
        "teacher": {"tokenizer_sha256": "9b1c" + "0" * 60},
        "tokens_fingerprint": "tok-fp-1",
        "signals": {"hidden_layers": [1, 2], "attn_layers": [2]},
    }
    with pytest.raises(ManifestMismatch) as e:
        open_store(reference_store, expected)
    assert [d.path for d in e.value.differences] == ["teacher.tokenizer_sha256", "signals.hidden_layers"]
    assert "teacher.tokenizer_sha256: cache has 3fa200000000…, expected 9b1c00000000…" in str(e.value)
    open_store(reference_store, {"tokens_fingerprint": "tok-fp-1"})  # matching subset: fine


def test_open_missing_and_incomplete(tmp_path):
    with pytest.raises(FileNotFoundError, match="dvc repro teacher_cache"):
        open_store(tmp_path / "nothing.zarr")
    manifest = tiny_manifest()
    path = tmp_path / "s.zarr"
    writer = create_or_resume(path, manifest)
    writer.write_shard(1, shard_arrays(manifest, 1))
    assert open_store(path, allow_incomplete=True).manifest.completed_shards == (1,)  # inspect a build
    with pytest.raises(StoreLocked, match=r"is being written right now \(pid \d+ on "):
        open_store(path)  # but never use it
    writer.close()
    with pytest.raises(StoreIncomplete, match=r"1 of 4 shards complete; run `dvc repro teacher_cache` to finish"):
        open_store(path)
    store = open_store(path, allow_incomplete=True)
    assert store.manifest.completed_shards == (1,)
    rows = store.read(["row_index", "attn_scores/L2"], 0, 200)
    assert (rows["row_index"][:128] == 0).all()  # unwritten rows read as fill values
    assert np.isneginf(rows["attn_scores/L2"][:128]).all()
    assert store.info()["rows_complete"] == 128


def test_info_figures_and_text(reference_store):
    store = open_store(reference_store)
    info = store.info()
    data_files = [p for p in reference_store.rglob("*") if p.is_file() and "c" in p.relative_to(reference_store).parts]
    stored = sum(p.stat().st_size for p in data_files)
    all_files = sum(p.stat().st_size for p in reference_store.rglob("*") if p.is_file())
    raw = sum(math.prod(a["shape"]) * np.dtype(a["dtype"]).itemsize for a in info["arrays"])
    assert info["bytes_on_disk"] == all_files
    assert info["bytes_per_row"] == pytest.approx(all_files / 500)
    assert sum(a["bytes_stored"] for a in info["arrays"]) == stored
    assert info["compression_ratio"] == pytest.approx(raw / stored)
    assert info["completed_shards"] == 4 and info["n_shards"] == 4
    hidden = next(a for a in info["arrays"] if a["name"] == "hidden/L1")
    assert hidden["shape"] == [500, 4, 8] and hidden["chunks"] == [1, 4, 8] and hidden["shards"] == [128, 4, 8]
    codecs = {a["name"]: a["codec"] for a in info["arrays"]}
    assert codecs["hidden/L1"] == "raw" and codecs["attn_probs/L2"] == "lz4" and codecs["logits"] == "lz4+shuffle"
    text = format_info(info)
    for needle in ("tiny-bert", "tok-fp-1", "4 shards complete", "hidden/L1", "(500, 4, 8)", "float16", "bytes/row",
                   "codec raw: bytes -> crc32c per inner chunk",
                   "codec lz4: bytes -> blosc(lz4, clevel 1, noshuffle) -> crc32c"):
        assert needle in text, needle


def test_open_checks_every_completed_shards_files(store_copy):
    """Sizes at every open (one stat per file), checksums on request; a flip that keeps the size is caught
    when its chunk is read (crc32c per chunk). Each names the shard; none is a zarr traceback."""
    (store_copy / "logits/c/0/0").unlink()
    truncated = store_copy / "hidden/L3/c/1/0/0"
    truncated.write_bytes(truncated.read_bytes()[:-3])
    with pytest.raises(StoreDamaged) as err:
        open_store(store_copy)
    msg = str(err.value)
    assert "shard 0: logits/c/0/0: missing" in msg and "shard 1: hidden/L3/c/1/0/0:" in msg and "truncated" in msg
    assert f"dvc checkout --force {store_copy}" in msg


@pytest.mark.slow  # ~15 s: eight DVC commands
def test_the_damage_message_restores_with_commands_dvc_runs(store_copy, tmp_path):
    """The fix the message gives is run as written in a real DVC repository: DVC refuses a plain `dvc checkout`
    (and `dvc pull`) of a changed file without --force, so the message must carry it."""
    import shlex

    from _dvc import DVC, sh

    sh(tmp_path, "git", "init", "-q")
    sh(tmp_path, DVC, "init", "-q")
    sh(tmp_path, DVC, "remote", "add", "-d", "team", str(tmp_path.parent / f"{tmp_path.name}-remote"))
    sh(tmp_path, DVC, "add", "-q", store_copy.name)
    sh(tmp_path, DVC, "push", "-q")
    good = {p.relative_to(store_copy): p.read_bytes() for p in store_copy.rglob("*") if p.is_file()}
    for cache_emptied in (False, True):  # from the DVC cache; from the remote when the cache lacks it
        if cache_emptied:
            sh(tmp_path, "rm", "-rf", ".dvc/cache")
        target = store_copy / "hidden/L1/c/2/0/0"
        target.write_bytes(target.read_bytes()[:-5])
        with pytest.raises(StoreDamaged) as err:
            open_store(store_copy)
        commands = re.findall(r"`(dvc (?:checkout|pull) [^`]+)`", str(err.value))
        assert commands == [f"dvc checkout --force {store_copy}", f"dvc pull --force {store_copy}"]
        res = sh(tmp_path, *shlex.split(commands[int(cache_emptied)]))
        assert open_store(store_copy, verify=True).manifest.complete, res.stderr
        assert {p.relative_to(store_copy): p.read_bytes() for p in store_copy.rglob("*") if p.is_file()} == good
    assert sh(tmp_path, DVC, "checkout", str(store_copy), check=False).returncode == 0  # nothing to do: no error
    target.write_bytes(b"garbage")
    assert sh(tmp_path, DVC, "checkout", str(store_copy), check=False).returncode != 0  # why --force is needed


def test_flipped_bytes_are_refused_on_read_and_by_verify(store_copy):
    target = store_copy / "hidden/L1/c/2/0/0"
    data = bytearray(target.read_bytes())
    data[100] ^= 0x04  # inside the first inner chunk's bytes
    target.write_bytes(bytes(data))
    store = open_store(store_copy)  # same size: the cheap check passes
    store.read(["hidden/L1"], 0, 256)  # other shards read fine
    with pytest.raises(StoreDamaged, match=r"shard 2: hidden/L1/c/2/0/0: unreadable"):
        store.read(["hidden/L1"], 256, 300)
    with pytest.raises(StoreDamaged, match=r"shard 2: hidden/L1/c/2/0/0: inner chunk \d+ fails its crc32c"):
        open_store(store_copy, verify=True)


def test_a_whole_file_from_elsewhere_is_refused_by_its_digest(store_copy):
    """A shard file replaced by another well-formed one (every crc32c holds: another build's, or another shard's)
    is still refused: the marker's digest of its chunks' crc32c values and index differs."""
    target, other = store_copy / "hidden/L1/c/1/0/0", store_copy / "hidden/L3/c/1/0/0"
    assert target.stat().st_size == other.stat().st_size  # raw chunks of the same rows: the same frames
    target.write_bytes(other.read_bytes())  # layer 3's hidden states: same size, valid, wrong
    with pytest.raises(StoreDamaged, match=r"shard 1: hidden/L1/c/1/0/0: digest [0-9a-f]{8} differs from marker"):
        open_store(store_copy, verify=True)


def test_content_digest_follows_the_markers(reference_store, store_copy):
    assert open_store(reference_store).content_sha256() == open_store(store_copy).content_sha256()
    marker = store_copy / "shards_done" / "1.json"
    marker.write_text(marker.read_text().replace('"rows"', '"rows" ', 1))  # other bytes, same content
    assert open_store(reference_store).content_sha256() == open_store(store_copy).content_sha256()
    rec = json.loads(marker.read_text())
    key = next(iter(rec["files"]))
    rec["files"][key]["crc32c"] = "0" * 8
    marker.write_text(json.dumps(rec))
    assert open_store(reference_store).content_sha256() != open_store(store_copy, check_files=False).content_sha256()
