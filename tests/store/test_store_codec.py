"""The store's own shard codec (distillpipe.store.codec) against Zarr, the reference: the files it encodes are
Zarr's byte for byte, and what it decodes is what Zarr reads, for every array kind of the layout, partial last
shards, chunks and shards of fill values only; damage is refused."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from store_helpers import INT8, tiny_manifest, tiny_spec
from zarr.storage import LocalStore, MemoryStore

from distillpipe.store.codec import ShardCodec, create_array, morton_order
from distillpipe.store.schema import ArraySpec, array_layout, stored_layout
from distillpipe.store.shards import shard_key


def _zarr_array(store, spec):
    return create_array(store, spec)


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


def _raw_spec(row_shape, block, dtype=np.float16, fill=0.0, shard_rows=32, n_rows=70):
    return ArraySpec(name="hidden/L1", shape=(n_rows, *row_shape), chunks=(1, block, *row_shape[1:]),
                     shards=(shard_rows, *row_shape), dtype=np.dtype(dtype), fill_value=fill,
                     dimension_names=("row", "pos", "feature")[:len(row_shape) + 1], codec="raw")


@pytest.mark.parametrize("n_rows,first", [(70, 0), (70, 64)])  # a full shard, the partial last one
def test_padding_blocks_are_left_out_and_the_files_are_zarrs(tmp_path, n_rows, first):
    """Raw chunks of one row and a block of positions: a row's padding blocks are not stored (its file holds the
    real blocks only, chunk + crc32c each, plus the index), the bytes are Zarr's, and Zarr reads them back."""
    spec = _raw_spec((12, 6), block=2, n_rows=n_rows)
    rng = np.random.default_rng(3)
    n = min(32, n_rows - first)
    lengths = rng.integers(0, 13, size=n)
    rows = rng.standard_normal((n, 12, 6)).astype(np.float16)
    rows[np.arange(12)[None, :] >= lengths[:, None]] = 0
    rows[1, :] = -0.0  # -0.0 is not the fill value 0.0 (Zarr compares bits): these chunks are stored
    scratch = {}
    array = create_array(MemoryStore(scratch), spec)
    array[first:first + n] = rows
    codec = ShardCodec(array.metadata)
    enc = codec.encode_parts(rows, first, n_rows)
    key = shard_key(spec, first // 32)
    assert enc.to_bytes() == scratch[key].to_bytes()
    bits = rows.view(np.uint16)
    blocks = [r for r in range(n) for b in range(6) if np.any(bits[r, 2 * b:2 * b + 2] != 0)]
    assert 6 <= len(blocks) < n * 6 - 6  # some blocks are padding, row 1's are not
    assert enc.nbytes == len(blocks) * (2 * 6 * 2 + 4) + 16 * 32 * 6 + 4  # frames + the whole shard's index
    path = tmp_path / "f"
    path.write_bytes(enc.to_bytes())
    out = np.empty_like(rows)
    codec.decode_rows(path, 0, n, out)
    np.testing.assert_array_equal(out.view(np.uint16), bits)  # bit for bit: -0.0 stays -0.0
    np.testing.assert_array_equal(array[first:first + n].view(np.uint16), bits)
    assert codec.file_digest(path) == enc.digest


def test_chunks_lie_in_zarrs_morton_order():
    from zarr.core.indexing import _morton_order  # private: Zarr's own order, where this Zarr has it

    for grid in [(32, 6), (1024, 24), (64, 1), (8, 16), (5, 3)]:
        want = [int(np.ravel_multi_index(tuple(c), grid)) for c in _morton_order(grid)]
        assert list(morton_order(grid)) == want, grid


def test_raw_reads_go_straight_into_the_rows_and_damage_still_fails(tmp_path):
    """The vectorized raw read (preadv into the caller's rows) checks every chunk's crc32c: a flipped byte in any
    frame, data or crc32c, fails its read, naming the chunk."""
    spec = _raw_spec((12, 6), block=3)
    rows = np.random.default_rng(4).standard_normal((32, 12, 6)).astype(np.float16)
    codec = ShardCodec(create_array(MemoryStore({}), spec).metadata)
    good = codec.encode(rows, 0, 70)
    path = tmp_path / "f"
    out = np.empty_like(rows)
    frame = 3 * 6 * 2 + 4
    for at in (0, frame - 1, 5 * frame + 7):  # chunk 0's data, chunk 0's crc32c, a later chunk
        damaged = bytearray(good)
        damaged[at] ^= 0x10
        path.write_bytes(bytes(damaged))
        with pytest.raises(ValueError, match=r"inner chunk \d+ fails its crc32c"):
            codec.decode_rows(path, 0, 32, out)
        with pytest.raises(ValueError, match=r"inner chunk \d+ fails its crc32c"):
            codec.file_digest(path)


def test_one_crc32c_pass_checks_every_frame():
    """frames_check: the crc32c of n valid frames (chunk + its crc32c) is one number whatever their bytes (CRC-32C's
    residue), computed from frames of zeros; any single flipped bit in any frame changes the span's crc32c."""
    import crc32c

    from distillpipe.store.codec import frames_check

    rng = np.random.default_rng(5)
    for step in (5, 772, 8196):
        for n in (1, 2, 9):
            data = [rng.integers(0, 256, step - 4, dtype=np.uint8).tobytes() for _ in range(n)]
            span = b"".join(d + crc32c.crc32c(d).to_bytes(4, "little") for d in data)
            assert crc32c.crc32c(span) == frames_check(n, step)
            for _ in range(5):
                damaged = bytearray(span)
                damaged[int(rng.integers(len(span)))] ^= 1 << int(rng.integers(8))
                assert crc32c.crc32c(bytes(damaged)) != frames_check(n, step)
