"""The store's own shard codec (distillpipe.store.codec) against Zarr, the reference: the files it encodes are
Zarr's byte for byte, and what it decodes is what Zarr reads, for every array kind of the layout, partial last
shards, chunks and shards of fill values only; damage is refused."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zarr
from store_helpers import INT8, tiny_manifest, tiny_spec
from zarr.storage import LocalStore, MemoryStore

from distillpipe.store.codec import ShardCodec
from distillpipe.store.schema import array_layout, stored_layout
from distillpipe.store.shards import shard_key
from distillpipe.store.writer import CHUNK_KEY_ENCODING, compressors


def _zarr_array(store, spec):
    return zarr.create_array(store, name=spec.name, shape=spec.shape, chunks=spec.chunks, shards=spec.shards,
                             dtype=spec.dtype, compressors=compressors(), fill_value=spec.fill_value,
                             chunk_key_encoding=CHUNK_KEY_ENCODING, dimension_names=spec.dimension_names)


def _every_kind(manifest):
    """The layout's arrays and those of the compressed stored forms (int8 values, float16 scales, uint8 steps,
    float32 anchors)."""
    layout = array_layout(manifest.signals, manifest.n_rows, manifest.shard_rows)
    names = {s.name for s in layout}
    return layout + [s for s in stored_layout(tiny_spec(precision=INT8), manifest.n_rows, manifest.shard_rows)
                     if s.name not in names]


def _rows(spec, n, rng, fill_chunks=()):
    """Random rows for ``spec``, whole inner chunks set to the fill value at the positions in ``fill_chunks``."""
    shape = (n, *spec.shape[1:])
    if spec.dtype.kind == "f":
        a = rng.standard_normal(shape).astype(spec.dtype)
        a[rng.random(shape) < 0.1] = spec.fill_value  # some fill values inside chunks too
    else:
        a = rng.integers(0, 200, size=shape).astype(spec.dtype)
    for c in fill_chunks:
        a[c * spec.chunks[0]:(c + 1) * spec.chunks[0]] = spec.fill_value
    return a


@pytest.mark.parametrize("n_rows,shard_rows", [(500, 128), (64, 64), (130, 128)])
def test_encoded_shards_are_zarrs_bytes(n_rows, shard_rows):
    manifest = tiny_manifest(n_rows=n_rows, shard_rows=shard_rows)
    rng = np.random.default_rng(0)
    layout = _every_kind(manifest)
    assert {s.dtype.kind for s in layout} >= {"f", "i", "u"} and any(np.isneginf(s.fill_value) for s in layout)
    pool = ThreadPoolExecutor(2)
    for spec in layout:
        scratch = {}
        array = _zarr_array(MemoryStore(scratch), spec)
        codec = ShardCodec(array.metadata)
        for i in range(manifest.n_shards):
            start, stop = manifest.shard_rows_range(i)
            n_chunks = -(-(stop - start) // spec.chunks[0])
            cases = [(), (0,), tuple(range(n_chunks))]  # no fill chunk, the first, all (no file)
            for fill_chunks in cases:
                rows = _rows(spec, stop - start, rng, fill_chunks)
                array[start:stop] = rows
                want = scratch.get(shard_key(spec, i))
                want = None if want is None else want.to_bytes()
                assert codec.encode(rows, start, n_rows) == want, (spec.name, i, fill_chunks)
                assert codec.encode(rows, start, n_rows, pool) == want  # threads change no byte


def test_decoded_rows_are_what_zarr_reads(tmp_path):
    manifest = tiny_manifest(n_rows=300, shard_rows=128)
    rng = np.random.default_rng(1)
    for spec in _every_kind(manifest):
        array = _zarr_array(LocalStore(tmp_path / spec.name.replace("/", "_")), spec)
        data = _rows(spec, 300, rng, fill_chunks=(1,))
        array[0:256] = data[:256]  # the last shard (rows 256-299) is never written: reads as fill
        codec = ShardCodec(array.metadata)
        root = tmp_path / spec.name.replace("/", "_")
        for start, stop in [(0, 300), (3, 17), (120, 140), (250, 300), (256, 300), (8, 16)]:
            want = array[start:stop]
            for i in range(start // 128, -(-stop // 128)):
                a, b = max(start, i * 128), min(stop, (i + 1) * 128)
                got = np.empty((b - a, *spec.shape[1:]), dtype=spec.dtype)
                codec.decode_rows(root / shard_key(spec, i), a - i * 128, b - i * 128, got)
                np.testing.assert_array_equal(got, want[a - start:b - start], err_msg=f"{spec.name} {a}-{b}")


def test_damage_is_refused(tmp_path):
    manifest = tiny_manifest(n_rows=128, shard_rows=128)
    spec = next(s for s in array_layout(manifest.signals, 128, 128) if s.name == "hidden/L1")
    array = _zarr_array(LocalStore(tmp_path), spec)
    array[0:128] = _rows(spec, 128, np.random.default_rng(2))
    codec = ShardCodec(array.metadata)
    path = tmp_path / shard_key(spec, 0)
    good = path.read_bytes()
    out = np.empty((128, *spec.shape[1:]), dtype=spec.dtype)
    for damaged, message in [(good[:10] + bytes([good[10] ^ 1]) + good[11:], "inner chunk 0 fails its crc32c"),
                             (good[:-30] + bytes([good[-30] ^ 1]) + good[-29:], "index fails its crc32c"),
                             (good[:40], "shorter than its index|truncated|index fails")]:
        path.write_bytes(damaged)
        with pytest.raises(ValueError, match=message):
            codec.decode_rows(path, 0, 128, out)
