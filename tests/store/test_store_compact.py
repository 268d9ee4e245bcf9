"""Stores in the compact forms (subspace coordinates, low-rank attention factors, derived embeddings) and their
constants: Zarr and numpy alone reconstruct every signal from the manifest's formulas, damaged or missing constants
are refused or rebuilt, and a killed build resumes to the same bytes."""

import json
import logging
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
import zarr
from store_helpers import COMPACT, HERE, INT8, build_store, tiny_manifest, tiny_spec, tree_files

from distillpipe.compact import probs_from_factors, scores_from_factors
from distillpipe.store import constants as store_constants
from distillpipe.store.manifest import StoreDamaged
from distillpipe.store.reader import format_info, open_store
from distillpipe.store.resume import create_or_resume
from distillpipe.store.schema import COMPACT_FORMULAS, constant_names
from distillpipe.store.shards import marked_shards

N, SHARD_ROWS = 300, 128


def compact_manifest():
    return tiny_manifest(N, SHARD_ROWS, signals=tiny_spec(precision=INT8, embedding_size=4, **COMPACT))


@pytest.fixture(scope="module")
def compact_store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("compact") / "c.zarr", compact_manifest())


def _decode(group, name):
    """An int8 array of the store decoded with numpy by the manifest's int8 formula."""
    q, scale = group[f"{name}.q"][:], group[f"{name}.scale"][:]
    return (q.astype(np.float32) * scale.astype(np.float32)[..., None]).astype(np.float16)


def test_zarr_and_numpy_alone_reconstruct_every_compact_signal(compact_store):
    """A reader without distillpipe: the manifest names each compact signal's formula; numpy applies it to the arrays
    and constants Zarr reads, and gets what distillpipe's own reconstruction gives."""
    group = zarr.open_group(str(compact_store), mode="r")
    manifest = group.attrs["manifest"]
    assert manifest["compact"] == {k: COMPACT_FORMULAS[k] for k in ("hidden", "attn_scores", "attn_probs",
                                                                    "embeddings")}
    store = open_store(compact_store)
    length = group["length"][:]
    p = manifest["signals"]["pool"]
    for j in (1, 3):  # h = mean + coords @ basis.T
        coords = _decode(group, f"hidden/L{j}").astype(np.float64)
        mean, basis = group[f"constants/hidden/L{j}/mean"][:], group[f"constants/hidden/L{j}/basis"][:]
        h = mean + coords @ basis.T.astype(np.float64)
        assert h.shape == (N, 4, 8) and np.allclose(basis.T @ basis, np.eye(3), atol=1e-6)
        assert np.array_equal(coords, store.read([f"hidden/L{j}"], 0, N)[f"hidden/L{j}"])  # the reader decodes alike
    left, right = _decode(group, "attn_scores/L2/left"), _decode(group, "attn_scores/L2/right")
    scores = np.einsum("nhrq,nhrk->nhqk", left.astype(np.float64), right.astype(np.float64))
    n = -(-length // p)
    real = np.arange(scores.shape[-1])[None, :] < n[:, None]
    scores = np.where(real[:, None, :, None] & real[:, None, None, :], scores, -np.inf)
    ours = scores_from_factors(torch.from_numpy(left), torch.from_numpy(right)).double().numpy()
    assert np.allclose(np.where(np.isfinite(scores), scores, 0), np.where(np.isfinite(scores), ours, 0), atol=1e-4)
    left, right = _decode(group, "attn_probs/L2/left"), _decode(group, "attn_probs/L2/right")
    s = np.einsum("nhrq,nhrk->nhqk", left.astype(np.float64), right.astype(np.float64))
    keys = np.arange(s.shape[-1])[None, :] < length[:, None]
    s = np.where(keys[:, None, None, :], s, -np.inf)
    probs = np.exp(s - s.max(-1, keepdims=True))
    probs = np.where(keys[:, None, :, None], probs / probs.sum(-1, keepdims=True), 0.0)
    mask = torch.from_numpy(keys)
    ours = probs_from_factors(torch.from_numpy(left), torch.from_numpy(right), mask).double().numpy()
    assert np.allclose(probs, ours, atol=1e-5)
    # the embedding output: the tables and the info's eps and position rule (constants.json)
    info = json.loads((compact_store / "constants.json").read_text())["info"]["embeddings"]
    word = group["constants/embeddings/word"][:]
    ids = np.array([[2, 7, 9, 3, 0]])
    x = word[ids] + group["constants/embeddings/position"][:][:5] + group["constants/embeddings/token_type"][:][0]
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + info["eps"])
    x = x * group["constants/embeddings/norm_weight"][:] + group["constants/embeddings/norm_bias"][:]
    derived = store_constants.load(compact_store, store.manifest.signals).embeddings
    ours = derived(torch.tensor(ids), torch.zeros(1, 5, dtype=torch.long), torch.tensor([[True] * 4 + [False]]))
    assert np.allclose(x[0, :4], ours[0, :4].numpy(), atol=1e-5) and not ours[0, 4].any()


def test_inspect_shows_the_constants_and_the_formulas(compact_store):
    text = format_info(open_store(compact_store).info())
    for needle in ("compact        hidden_rank=3", "attn_rank=2", "embeddings=derived", "constants ",
                   "compact hidden: h = mean + coords @ basis.T", "derived embeddings: LayerNorm"):
        assert needle in text, needle


def test_damaged_or_altered_constants_are_refused(compact_store, tmp_path):
    """The constants decide what every row means: values that changed on disk (a basis rewritten with a valid
    crc32c, so Zarr reads it) fail their sha256 when read, and a verify names them."""
    path = tmp_path / "c.zarr"
    shutil.copytree(compact_store, path)
    spec = open_store(path).manifest.signals
    group = zarr.open_group(str(path), mode="r+")
    basis = group["constants/hidden/L1/basis"][:]
    group["constants/hidden/L1/basis"][...] = basis[:, ::-1]  # other values, a well-formed chunk
    open_store(path)  # sizes unchanged: the cheap check at open passes ...
    with pytest.raises(StoreDamaged, match=r"constants/hidden/L1/basis: its values differ from the sha256"):
        store_constants.load(path, spec)  # ... but training reads them, and refuses
    with pytest.raises(StoreDamaged, match=r"(?s)damaged \(constants\).*constants/hidden/L1/basis"):
        open_store(path, verify=True)
    (path / "constants.json").unlink()
    with pytest.raises(StoreDamaged, match="constants.json: missing"):
        open_store(path)


def test_a_store_that_lost_its_constants_is_rebuilt(compact_store, tmp_path, caplog):
    """Shards written in bases that are gone cannot be resumed: the build starts over, saying why."""
    path = tmp_path / "c.zarr"
    shutil.copytree(compact_store, path)
    (path / "constants.json").unlink()
    with caplog.at_level(logging.WARNING, logger="distillpipe.store"):
        writer = create_or_resume(path, compact_manifest())
    assert "constants.json is missing, but shards were written" in caplog.text
    assert writer.pending_shards() == [0, 1, 2] and not (path / "constants.json").exists()
    writer.close()


def test_sigkill_then_resume_is_byte_identical(compact_store, tmp_path):
    path = tmp_path / "c.zarr"
    proc = subprocess.run([sys.executable, str(HERE / "store_helpers.py"), "write-compact", str(path), str(N),
                           str(SHARD_ROWS), "1", "attn_scores/L2/left.q"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert marked_shards(path, 3) == [0] and (path / "constants.json").is_file()
    assert create_or_resume(path, compact_manifest()).pending_shards() == [1, 2]  # the constants are kept
    build_store(path, compact_manifest())
    assert tree_files(path) == tree_files(compact_store)
    assert sorted(store_constants.read_marker(path)["arrays"]) == sorted(constant_names(compact_manifest().signals))
