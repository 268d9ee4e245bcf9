"""Compressed precisions (int8 hidden states and attention scores; uint8 MLM top-k steps): the stored
forms against a float64 numpy reference of the formulas, decoding with plain Zarr, resume after SIGKILL, identity."""

import json
import logging
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import zarr
from store_helpers import HERE, INT8, build_store, full_arrays, shard_arrays, tiny_manifest, tiny_spec, tree_files

from distillpipe.store.loader import BlockLoader
from distillpipe.store.quant import decode, encode
from distillpipe.store.reader import format_info, open_store
from distillpipe.store.resume import create_or_resume
from distillpipe.store.schema import (
    FORMULAS,
    INT8_ROWS,
    INT8_SCORES,
    UINT8_STEPS,
    SignalPrecision,
    array_layout,
    stored_layout,
)
from distillpipe.store.shards import marked_shards
from distillpipe.store.writer import write_shard

N, SHARD_ROWS = 500, 128
F16_MAX = 65504.0


# --------------------------------------------------------------------------------------------
# the float64 reference of the formulas (docs/precision.md), written from their text
# --------------------------------------------------------------------------------------------


def ref_scale(m: np.ndarray) -> np.ndarray:
    """The smallest float16 >= m / 127 and > 0, in float64."""
    t = np.maximum(m / 127.0, 2.0**-24)
    s = t.astype(np.float16)
    below = s.astype(np.float64) < t
    s[below] = np.nextafter(s[below], np.float16(np.inf))
    return s


def ref_int8(x: np.ndarray, masked: bool):
    """(q, scale, decoded, ambiguous) of float16 ``x`` in float64; ``ambiguous``: |x / scale| within 1e-6 of a
    half-integer, where float32 and float64 may round to different neighbours."""
    v = x.astype(np.float64)
    finite = np.isfinite(v)
    m = np.where(finite, np.abs(v), 0.0).max(axis=-1)
    s = ref_scale(m)
    s64 = s.astype(np.float64)[..., None]
    r = np.where(finite, v, 0.0) / s64
    q = np.clip(np.rint(r), -127, 127)
    lim = np.where(s64 * 127 > F16_MAX, np.floor(F16_MAX / s64), 127)
    q = np.clip(q, -lim, lim)
    if masked:
        q = np.where(finite, q, -128)
    dec = np.where(q == -128, -np.inf, q * s64).astype(np.float16) if masked else (q * s64).astype(np.float16)
    ambiguous = np.abs(np.abs(r - np.trunc(r)) - 0.5) < 1e-6
    return q.astype(np.int8), s, dec, ambiguous


def ref_steps(x: np.ndarray):
    v = x.astype(np.float64)
    top = v.max(axis=-1, keepdims=True)
    d = 16 * (top - v)
    steps = np.clip(np.rint(d), 0, 255)

    def lse(a):
        mx = a.max(axis=-1)
        return mx + np.log(np.exp(a - mx[..., None]).sum(axis=-1))

    anchor = (lse(v) - lse(-steps / 16)).astype(np.float32)
    dec = (anchor[..., None] - (steps / 16).astype(np.float32)).astype(np.float16)  # float32 arithmetic
    ambiguous = np.abs(np.abs(d - np.trunc(d)) - 0.5) < 1e-6
    return steps.astype(np.uint8), anchor, dec, ambiguous


def ref_decode(kind: str, x: np.ndarray) -> np.ndarray:
    return ref_steps(x)[2] if kind == UINT8_STEPS else ref_int8(x, kind == INT8_SCORES)[2]


def hard_vectors(rng) -> np.ndarray:
    """(12, 16) float16 row vectors: random scales, all zeros, float16's extremes and subnormals, one huge outlier."""
    x = (rng.standard_normal((12, 16)) * rng.choice([1e-3, 1, 30, 900], size=(12, 1))).astype(np.float16)
    x[0] = 0
    x[1, 0], x[1, 1] = F16_MAX, -F16_MAX
    x[2] = np.float16(2**-24) * rng.integers(-3, 4, size=16)  # subnormals only
    x[3, 5] = np.float16(6e-5)  # a normal next to ...
    x[3, :5] = np.float16(2**-24)  # ... subnormals (they round to 0 or the scale)
    x[4, 3] = np.float16(60000)  # one outlier among O(1) values
    x[5] = np.float16(-0.0)
    return x


# --------------------------------------------------------------------------------------------
# the encodings
# --------------------------------------------------------------------------------------------


def test_int8_rows_match_the_float64_reference():
    x = hard_vectors(np.random.default_rng(0))
    q, s = encode(INT8_ROWS, x)
    rq, rs, rdec, amb = ref_int8(x, masked=False)
    assert q.dtype == np.int8 and s.dtype == np.float16 and s.shape == (12,)
    assert np.array_equal(s, rs)
    assert np.array_equal(q[~amb], rq[~amb]) and (np.abs(q.astype(int) - rq)[amb] <= 1).all()
    out = np.empty_like(x)
    decode(INT8_ROWS, q, s, out)
    assert np.array_equal(out[~amb.any(-1)], rdec[~amb.any(-1)])
    assert np.isfinite(out).all() and (out[0] == 0).all() and (out[5] == 0).all()
    # error: half a step (+ the float16 rounding of the result), a whole step near float16's largest
    v, d = x.astype(np.float64), out.astype(np.float64)
    bound = s.astype(np.float64)[:, None] * np.where(np.abs(v) > F16_MAX - s[:, None], 1.0, 0.5)
    assert (np.abs(d - v) <= bound + np.abs(d) * 2**-11 + 2**-25).all()  # + half a float16 ulp of the result


def test_int8_scores_keep_minus_inf_and_fully_masked_rows():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 3, 6, 6)) * 4).astype(np.float16)  # (n, H, Lq, Lk)
    x[0, :, 4:, :] = -np.inf  # masked query rows: fully -inf
    x[0, :, :, 4:] = -np.inf  # masked keys
    x[1, 1, 2, :] = 0
    x[1, 1, 2, 5] = -np.inf  # zeros and a masked key: scale 0
    x[1, 2, 0, 0] = F16_MAX
    q, s = encode(INT8_SCORES, x)
    rq, rs, rdec, amb = ref_int8(x, masked=True)
    assert s.shape == (2, 3, 6) and np.array_equal(s, rs)
    assert np.array_equal(q[~amb], rq[~amb])
    assert (q[0, :, 4:, :] == -128).all() and (s[0, :, 4:] == np.float16(2**-24)).all()
    out = np.empty_like(x)
    decode(INT8_SCORES, q, s, out)
    assert np.array_equal(np.isneginf(out), np.isneginf(x))  # -inf exactly where it was, nowhere else
    assert not np.isnan(out).any() and not np.isposinf(out).any()
    assert np.array_equal(out[~amb], rdec[~amb])
    assert (out[1, 1, 2, :5] == 0).all()


def test_uint8_steps_match_the_reference_and_keep_the_top_k_mass():
    rng = np.random.default_rng(2)
    logits = np.sort(rng.standard_normal((40, 3, 16)) * 3 + 8, axis=-1)[..., ::-1].astype(np.float16)
    logits[0, 2] = 0  # an unused slot
    logits[1, 0, 8:] = logits[1, 0, 0] - 30  # far below the top-1: stored at 255 steps
    steps, anchor = encode(UINT8_STEPS, logits)
    rsteps, ranchor, rdec, amb = ref_steps(logits)
    assert steps.dtype == np.uint8 and anchor.dtype == np.float32 and anchor.shape == (40, 3)
    assert np.array_equal(steps[~amb], rsteps[~amb]) and (steps[1, 0, 8:] == 255).all()
    ok = ~amb.any(-1)
    assert np.array_equal(anchor[ok], ranchor[ok])
    out = np.empty_like(logits)
    decode(UINT8_STEPS, steps, anchor, out)
    assert np.array_equal(out[ok], rdec[ok]) and (out[0, 2] == 0).all()
    # the decoded top-k mass (before the float16 rounding of the output) equals the teacher's
    v = logits.astype(np.float64)
    dec64 = anchor.astype(np.float64)[..., None] - steps / 16
    np.testing.assert_allclose(np.exp(dec64).sum(-1), np.exp(v).sum(-1), rtol=1e-6)
    inside = steps < 255  # within range: at most half a step from the top-1-relative logit
    err = (dec64 - anchor[..., None]) - (v - v.max(-1, keepdims=True))
    assert (np.abs(err[inside]) <= 1 / 32 + 1e-9).all()


# --------------------------------------------------------------------------------------------
# stores
# --------------------------------------------------------------------------------------------


def int8_manifest(**over):
    return tiny_manifest(N, SHARD_ROWS, signals=tiny_spec(precision=INT8), **over)


@pytest.fixture(scope="module")
def int8_store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("int8") / "q.zarr", int8_manifest())


def test_layouts_readers_see_float16_and_disk_holds_values_and_scales():
    spec = tiny_spec(precision=INT8)
    assert array_layout(spec, N, SHARD_ROWS) == array_layout(tiny_spec(), N, SHARD_ROWS)
    stored = {a.name: a for a in stored_layout(spec, N, SHARD_ROWS)}
    assert stored["hidden/L1.q"].dtype == np.int8 and stored["hidden/L1.q"].shape == (N, 4, 8)
    assert stored["hidden/L1.scale"].shape == (N, 4) and stored["hidden/L1.scale"].dtype == np.float16
    assert stored["attn_scores/L2.scale"].shape == (N, 2, 4, 4)[:3] and stored["attn_scores/L2.q"].fill_value == -128
    assert stored["mlm/topk_logits.steps"].dtype == np.uint8 and stored["mlm/topk_logits.anchor"].shape == (N, 3)
    assert "hidden/L1" not in stored and stored["attn_probs/L2"].dtype == np.float16  # probabilities stay float16
    float16 = {a.name: a for a in array_layout(spec, N, SHARD_ROWS)}
    for name, e in spec.encodings().items():  # values keep the chunks; every chunk on the 64-row grid: blocks align
        assert stored[e.values].chunks == float16[name].chunks and stored[e.values].codec == float16[name].codec
        assert 64 % stored[e.scale].chunks[0] == 0 and stored[e.scale].codec == "lz4+shuffle"
    with pytest.raises(ValueError, match="keeps no such signal"):
        tiny_spec(hidden_layers=(), precision=SignalPrecision(hidden="int8"))
    with pytest.raises(ValueError, match="precision.hidden='int4'"):
        SignalPrecision(hidden="int4")


def test_store_reads_back_the_formula_of_what_was_written(int8_store):
    store = open_store(int8_store, int8_manifest())
    ref = full_arrays(store.manifest)
    got = store.read(store.arrays, 0, N)
    encodings = store.manifest.signals.encodings()
    assert set(encodings) == {"hidden/L1", "hidden/L3", "attn_scores/L2", "mlm/topk_logits"}
    for name in store.arrays:
        spec = store.layout[name]
        assert got[name].dtype == spec.dtype and got[name].shape == spec.shape, name
        want = ref_decode(encodings[name].kind, ref[name]) if name in encodings else ref[name]
        assert _equal(got[name], want), name
    blocks = store.read_blocks(["hidden/L3", "attn_scores/L2"], [(256, 320), (0, 64)])  # two blocks, one array
    assert np.array_equal(blocks["hidden/L3"], np.concatenate([got["hidden/L3"][256:320], got["hidden/L3"][:64]]))
    assert np.array_equal(blocks["attn_scores/L2"][64:], got["attn_scores/L2"][:64])
    assert store.verify() == {}


def _equal(got, want):
    """Same dtype, shape and values (-inf == -inf). Exact: no value of this seeded data sits at a half-integer
    quotient, where float32 and float64 could round to different neighbours (those are pinned above)."""
    return got.dtype == want.dtype and np.array_equal(got, want)


def test_the_manifest_formula_decodes_with_plain_zarr(int8_store):
    """A reader without distillpipe: zarr for the arrays, numpy for the manifest's formula."""
    group = zarr.open_group(str(int8_store), mode="r")
    manifest = group.attrs["manifest"]
    ref = full_arrays(tiny_manifest(N, SHARD_ROWS, signals=tiny_spec(precision=INT8)))
    assert set(manifest["encoding"]) == {"hidden/L1", "hidden/L3", "attn_scores/L2", "mlm/topk_logits"}
    for name, e in manifest["encoding"].items():
        assert e["formula"] == FORMULAS[e["kind"]]
        values, scale = group[e["values"]][:], group[e["scale"]][:]
        if e["kind"] == "uint8_steps":  # X = float16(float32(X.anchor)[..., None] - float32(X.steps) / 16)
            x = (scale[..., None] - values.astype(np.float32) / np.float32(16)).astype(np.float16)
        else:  # X = float16(float32(X.q) * float32(X.scale)[..., None]), -inf where X.q == -128 (scores)
            x = (values.astype(np.float32) * scale.astype(np.float32)[..., None]).astype(np.float16)
            if e["kind"] == "int8_scores":
                x[values == -128] = -np.inf
        want = ref_decode(e["kind"], ref[name])
        assert _equal(x, want), name
    # the uncompressed arrays are as written
    assert np.array_equal(group["attn_probs/L2"][:], ref["attn_probs/L2"])


def test_inspect_shows_precision_bytes_and_formula(int8_store, reference_store):
    info = open_store(int8_store).info()
    arrays = {a["name"]: a for a in info["arrays"]}
    hidden = arrays["hidden/L1"]
    assert hidden["dtype"] == "float16" and hidden["precision"] == "int8"
    assert hidden["stored_as"] == ["hidden/L1.q", "hidden/L1.scale"]
    assert hidden["bytes_per_row_stored_raw"] == 4 * 8 + 4 * 2  # int8 values + a float16 scale per position
    assert arrays["mlm/topk_logits"]["precision"] == "uint8" and arrays["attn_probs/L2"]["precision"] == "float16"
    stored = sum(p.stat().st_size for p in int8_store.rglob("*") if p.is_file() and "c" in p.relative_to(
        int8_store).parts)
    assert sum(a["bytes_stored"] for a in info["arrays"]) == stored
    f16 = {a["name"]: a for a in open_store(reference_store).info()["arrays"]}
    assert hidden["bytes_per_row"] < 0.75 * f16["hidden/L1"]["bytes_per_row"]  # random normal data: ~0.6
    text = format_info(info)
    for needle in ("precision      hidden int8", "int8", "hidden/L1.q", "X.scale", "bytes/row"):
        assert needle in text, needle


def test_loader_gives_training_float16_arrays(int8_store):
    names = ["hidden/L3", "attn_scores/L2", "mlm/topk_logits"]
    loader = BlockLoader(int8_store, names, block_rows=64, buffer_blocks=2, seed=0, expected=None, batch_size=32)
    store = open_store(int8_store)
    full = store.read(names, 0, N)
    rows, arrays = next(iter(loader))
    idx = (rows - 1000) // 3  # row_index_of: 1000 + 3 * store row
    for name in names:
        assert arrays[name].dtype == np.float16 and arrays[name].shape == (32, *store.layout[name].row_shape)
        assert np.array_equal(arrays[name], full[name][idx]), name


def test_sigkill_then_resume_is_byte_identical(int8_store, tmp_path):
    path = tmp_path / "s.zarr"
    proc = subprocess.run([sys.executable, str(HERE / "store_helpers.py"), "write-int8", str(path), str(N),
                           str(SHARD_ROWS), "2", "hidden/L1.q"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert marked_shards(path, 4) == [0, 1] and (path / "hidden/L1.q/c/2/0/0").is_file()
    assert not (path / "hidden/L1.scale/c/2/0").exists()
    assert create_or_resume(path, int8_manifest()).pending_shards() == [2, 3]
    build_store(path, int8_manifest())  # resumes: shards 2 and 3
    assert tree_files(path) == tree_files(int8_store)


def test_precision_is_part_of_the_identity(int8_store, tmp_path, caplog):
    path = tmp_path / "c.zarr"
    shutil.copytree(int8_store, path)
    other = tiny_manifest(N, SHARD_ROWS, signals=tiny_spec(precision=SignalPrecision(
        hidden="int8", attention="float16", mlm_topk="uint8")))
    assert json.dumps(other.identity()) != json.dumps(int8_manifest().identity())
    with caplog.at_level(logging.WARNING, logger="distillpipe.store"):
        writer = create_or_resume(path, other)
    assert "signals.precision.attention: cache has int8, expected float16" in caplog.text
    assert writer.pending_shards() == [0, 1, 2, 3]
    writer.close()
    bad = shard_arrays(other, 0)
    bad["hidden/L1"][3, 1, 2] = np.inf  # refused before it is encoded (int8 could not tell)
    with pytest.raises(ValueError, match="hidden/L1 holds 1 nan/inf"):
        write_shard(path, 0, bad)


def test_a_precision_for_a_signal_not_kept_leaves_the_spec_float16():
    from distillpipe.config.base import build
    from distillpipe.config.teacher_cache import SignalsConfig
    from distillpipe.teacher.targets import TeacherSizes, spec_for

    sizes = TeacherSizes(head="mlm", num_labels=2, vocab_size=100, hidden_size=8, n_heads=2)
    raw = {"logits": False, "mlm_topk": 0, "hidden_layers": [1], "hidden_rank": None, "hidden_fit_rows": 16,
           "attn_layers": [1], "attn_rank": None, "pool": 1, "attn_probs": True, "embeddings": False,
           "precision": {"hidden": "int8", "attention": "int8", "mlm_topk": "uint8"}}
    spec = spec_for(build(SignalsConfig, raw, "signals"), sizes, 16, 0)
    assert spec.precision == SignalPrecision(hidden="int8")  # no scores (dense probabilities) or MLM kept
    factored = spec_for(build(SignalsConfig, {**raw, "attn_rank": 2}, "signals"), sizes, 16, 0)
    assert factored.precision == SignalPrecision(hidden="int8", attention="int8")  # factors of probabilities: int8
    with pytest.raises(Exception, match="precision"):
        build(SignalsConfig, {**raw, "precision": {"hidden": "int8"}}, "signals")  # strict: every signal named
