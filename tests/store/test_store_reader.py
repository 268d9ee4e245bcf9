"""Reader: manifest validation on open, incomplete stores, inspect info."""

import math

import numpy as np
import pytest
from store_helpers import shard_arrays, tiny_manifest

from distillpipe.store import ManifestMismatch, StoreIncomplete, create_or_resume, format_info, open_store


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
    assert hidden["shape"] == [500, 4, 8] and hidden["chunks"] == [64, 4, 8] and hidden["shards"] == [128, 4, 8]
    text = format_info(info)
    for needle in ("tiny-bert", "tok-fp-1", "4 shards complete", "hidden/L1", "(500, 4, 8)", "float16", "bytes/row"):
        assert needle in text, needle
