"""Manifest: identity comparison names every differing field with both values."""

from dataclasses import replace

import pytest
from store_helpers import tiny_manifest, tiny_spec

from distillpipe.store.manifest import Manifest, ManifestMismatch, check_manifest, diff_manifests


def test_round_trip_and_identity_excludes_progress():
    m = tiny_manifest().with_completed([2, 0])
    assert m.completed_shards == (0, 2)
    assert Manifest.from_dict(m.to_dict()) == m
    other = replace(m, completed_shards=(1,), code_version="9.9.9")
    assert diff_manifests(m.to_dict(), other.to_dict(), subset=False) == []


def test_mismatch_names_each_differing_field():
    cache = tiny_manifest()
    expected = tiny_manifest(
        teacher=replace(cache.teacher, tokenizer_sha256="9b1c" + "0" * 60),
        tokens_fingerprint="tok-fp-2",
        signals=tiny_spec(hidden_layers=(1, 2)),
    )
    with pytest.raises(ManifestMismatch) as e:
        check_manifest(expected, cache, where="data/teacher/x.zarr")
    paths = [d.path for d in e.value.differences]
    assert paths == ["teacher.tokenizer_sha256", "tokens_fingerprint", "signals.hidden_layers"]
    text = str(e.value)
    assert "teacher.tokenizer_sha256: cache has 3fa200000000…, expected 9b1c00000000…" in text
    assert "tokens_fingerprint: cache has tok-fp-1, expected tok-fp-2" in text
    assert "signals.hidden_layers: cache has [1, 3], expected [1, 2]" in text
    assert "dvc repro teacher_cache" in text and "data/teacher/x.zarr" in text
    assert isinstance(e.value, ValueError)


def test_nested_config_and_subset_comparison():
    cache = tiny_manifest()
    expected = {"teacher": {"config": {"num_hidden_layers": 6}}, "signals": {"hidden_layers": [1, 3]}}
    diffs = diff_manifests(expected, cache.to_dict(), subset=True)
    assert [str(d) for d in diffs] == ["teacher.config.num_hidden_layers: cache has 4, expected 6"]
    # a full comparison also reports fields only the cache has
    extra = {**cache.to_dict(), "teacher": {**cache.teacher.to_dict(), "config": {"hidden_size": 8}}}
    diffs = diff_manifests(extra, cache.to_dict(), subset=False)
    assert [str(d) for d in diffs] == ["teacher.config.num_hidden_layers: cache has 4, expected <missing>"]
    check_manifest({"tokens_fingerprint": "tok-fp-1", "signals": {"pool": 4}}, cache, where="x")  # no error


def test_a_store_whose_code_was_identified_by_bytes_is_rebuilt_once_saying_why():
    """Stores from before code fingerprints by meaning hold a bare sha256 per file: one line says why they differ
    (not one line per file of the closure), and a store with fingerprints names the file that changed."""
    from distillpipe.identity import stage_code

    code = stage_code("teacher_cache")
    old = tiny_manifest(code={f: "4c5c" * 16 for f in code})
    new = tiny_manifest(code=code)
    with pytest.raises(ManifestMismatch) as e:
        check_manifest(new, old, where="data/teacher/x.zarr")
    assert [d.path for d in e.value.differences] == ["code"]
    assert "code: its code was identified by each file's bytes (made before code fingerprints by meaning" \
        in str(e.value)
    edited = tiny_manifest(code={**code, "distillpipe/pooling.py": "ast-v1:" + "0" * 64})
    with pytest.raises(ManifestMismatch) as e:
        check_manifest(new, edited, where="data/teacher/x.zarr")
    assert [d.path for d in e.value.differences] == ["code.distillpipe/pooling.py"]
