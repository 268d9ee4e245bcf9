"""Block loader: seeded shuffles, exact coverage, resumable position, streams split over processes (each reads
only its blocks, together they give the one-process batches), spawn DataLoader workers."""

import itertools
import tracemalloc

import numpy as np
import pytest
from store_helpers import full_arrays, shard_arrays, tiny_manifest, tiny_spec

from distillpipe.store.loader import BlockLoader, block_windows, stream_windows
from distillpipe.store.resume import create_or_resume
from distillpipe.store.schema import array_layout

NAMES = ("hidden/L1", "attn_scores/L2", "logits")


def _loader(path, **kw):
    args = dict(block_rows=64, buffer_blocks=3, seed=7, expected={"tokens_fingerprint": "tok-fp-1"}, batch_size=24,
                streams=1)
    args.update(kw)
    return BlockLoader(path, NAMES, **args)


def _epoch(loader):
    return [(rows.copy(), arrays) for rows, arrays in loader]


def _rows(batches):
    return np.concatenate([rows for rows, _ in batches])


def _assert_same(a, b):
    assert len(a) == len(b)
    for (ra, xa), (rb, xb) in zip(a, b):
        assert np.array_equal(ra, rb)
        assert all(np.array_equal(xa[n], xb[n]) for n in NAMES)


def test_each_epoch_covers_every_row_once_with_the_right_data(reference_store):
    ref = full_arrays(tiny_manifest())
    loader = _loader(reference_store)
    assert len(loader) == 21  # ceil(500 / 24)
    epochs = [_epoch(loader), _epoch(loader)]
    assert loader.epoch == 2
    for batches in epochs:
        rows = _rows(batches)
        assert sorted(rows) == sorted(ref["row_index"])  # every row exactly once
        assert [len(r) for r, _ in batches] == [24] * 20 + [20]
        store_rows = (rows - 1000) // 3
        for name in NAMES:
            assert np.array_equal(np.concatenate([x[name] for _, x in batches]), ref[name][store_rows])
    first, second = _rows(epochs[0]), _rows(epochs[1])
    assert not np.array_equal(first, second)  # epoch-aware
    assert not np.array_equal(first, np.sort(first))  # shuffled
    _assert_same(epochs[0], _epoch(_loader(reference_store)))  # seeded: same sequence again
    assert not np.array_equal(first, _rows(_epoch(_loader(reference_store, seed=8))))


def test_shuffle_levels():
    m = tiny_manifest()
    epochs = [[b for w in block_windows(m, block_rows=64, buffer_blocks=3, seed=7, epoch=e) for b in w]
              for e in range(8)]
    assert [len(w) for w in block_windows(m, 64, 3, 7, 0)] == [3, 3, 2]
    shard_orders, in_shard_orders = set(), set()
    for blocks in epochs:
        assert sorted(blocks) == [(a, min(a + 64, 500)) for a in range(0, 500, 64)]  # every block once
        shards = [a // 128 for a, _ in blocks]
        assert [len(list(g)) for _, g in itertools.groupby(shards)] == [2, 2, 2, 2]  # a shard is read in one go
        shard_orders.add(tuple(shards[::2]))
        in_shard_orders.add(tuple(blocks[k][0] < blocks[k + 1][0] for k in range(0, 8, 2)))
    assert len(shard_orders) > 1 and len(in_shard_orders) > 1  # both levels are shuffled, per epoch


def test_state_restore_continues_exactly(reference_store):
    full = _loader(reference_store)
    reference = _epoch(full) + _epoch(full)
    for k in (0, 5, 21):  # start, mid-epoch, end of epoch 0
        loader = _loader(reference_store)
        seen = list(itertools.islice(iter(loader), k))
        state = loader.state_dict()
        assert (state["epoch"], state["batches_consumed"]) == (0, k)
        resumed = _loader(reference_store)
        resumed.load_state_dict(state)
        rest = _epoch(resumed) + _epoch(resumed)  # the rest of epoch 0 (empty for k=21), then epoch 1
        _assert_same(seen + rest, reference)


def test_settings_checks(reference_store):
    loader = _loader(reference_store)
    other = _loader(reference_store, seed=3)
    with pytest.raises(ValueError, match="seed: checkpoint 7, loader 3"):
        other.load_state_dict(loader.state_dict())
    with pytest.raises(ValueError, match="block_rows=48 must divide shard_rows=128"):
        _loader(reference_store, block_rows=48)
    with pytest.raises(KeyError, match="no arrays"):
        BlockLoader(reference_store, ["hidden/L2"], block_rows=64, buffer_blocks=2, seed=0, expected=None, batch_size=4,
                    streams=1)
    with pytest.raises(ValueError, match="batch_size=24 must be a multiple of loader.streams=5"):
        _loader(reference_store, streams=5)
    with pytest.raises(ValueError, match=r"loader.streams=3 does not fit 2 training processes.*Set loader.streams "
                                         r"to 1 or 2 in params.yaml"):
        _loader(reference_store, streams=3, world=2)
    with pytest.raises(ValueError, match=r"batch_size=24 cannot be split equally over 5 training processes.*"
                                         r"Set batch_size to a multiple of 5 \(e.g. 25\)"):
        _loader(reference_store, streams=1, world=5)
    with pytest.raises(ValueError, match="num_workers=2 must be 0 or divide the 3 stream"):
        _loader(reference_store, streams=3, num_workers=2)
    with pytest.raises(ValueError, match="loader.streams=4 is more than the 3 windows"):
        _loader(reference_store, streams=4)


def _window_of(manifest, epoch, streams):
    """store row -> the stream whose window holds it this epoch (the independent reference)."""
    owner = {}
    for k, windows in enumerate(stream_windows(block_windows(manifest, 64, 1, 7, epoch), streams)):
        for _, blocks in windows:
            for a, b in blocks:
                owner.update({row: k for row in range(a, b)})
    return owner


def test_processes_read_only_their_streams_and_together_give_the_one_process_batches(reference_store):
    m = tiny_manifest()
    ref = full_arrays(m)
    one = _loader(reference_store, streams=4, buffer_blocks=1)  # 8 windows of 64 rows: 2 per stream
    single = [_epoch(one) for _ in range(2)]
    for epoch, batches in enumerate(single):
        assert all(len(r) == 24 for r, _ in batches)  # several streams: only full global batches
        rows = _rows(batches)
        owner = _window_of(m, epoch, 4)
        per_stream = [sum(1 for k in owner.values() if k == s) for s in range(4)]
        # the epoch ends when a stream runs out of full sub-batches of 24 / 4 rows
        assert len(set(rows)) == len(rows) == 24 * min(n // 6 for n in per_stream)
        for r, _ in batches:  # each batch: 6 rows of stream 0, then 6 of stream 1, ...
            assert [owner[(row - 1000) // 3] for row in r] == [k for k in range(4) for _ in range(6)]
    for world in (2, 4):
        parts = []
        for rank in range(world):
            loader = _loader(reference_store, streams=4, buffer_blocks=1, world=world, rank=rank)
            parts.append([_epoch(loader) for _ in range(2)])
            mine = {k for k in range(4) if k // (4 // world) == rank}
            for epoch in range(2):
                owner = _window_of(m, epoch, 4)
                assert {owner[(row - 1000) // 3] for row in _rows(parts[-1][epoch])} == mine  # only its blocks
        for epoch in range(2):
            assert [len(p[epoch]) for p in parts] == [len(single[epoch])] * world  # lock step
            for t, (rows, arrays) in enumerate(single[epoch]):
                local = [parts[rank][epoch][t] for rank in range(world)]
                assert np.array_equal(np.concatenate([r for r, _ in local]), rows)
                for name in NAMES:
                    joined = np.concatenate([x[name] for _, x in local])
                    assert np.array_equal(joined, arrays[name])
                    assert np.array_equal(joined, ref[name][(rows - 1000) // 3])


def test_processes_sharing_a_stream_together_give_the_one_process_batches(reference_store):
    """More processes than streams (the embedded params' streams: 1 under DISTILLPIPE_NPROC=2, 4, 8): the processes
    of a stream each take an equal slice of its sub-batches; in rank order they give the one-process batches, all
    but a one-stream epoch's short last batch (it cannot be split equally), and a resumed rank goes on exactly."""
    ref = full_arrays(tiny_manifest())
    for streams, world in ((1, 2), (1, 4), (1, 8), (2, 4), (2, 8)):
        one = _loader(reference_store, streams=streams, buffer_blocks=1)
        single = [_epoch(one) for _ in range(2)]
        ranks = [_loader(reference_store, streams=streams, buffer_blocks=1, world=world, rank=r) for r in range(world)]
        parts = [[_epoch(loader) for _ in range(2)] for loader in ranks]
        for epoch in range(2):
            full = [b for b in single[epoch] if len(b[0]) == 24]
            assert len(full) == len(single[epoch]) - (streams == 1)  # 500 rows: 20 batches of 24 and one of 20
            assert [len(p[epoch]) for p in parts] == [len(full)] * world  # lock step, no short batch
            for t, (rows, arrays) in enumerate(full):
                local = [parts[r][epoch][t] for r in range(world)]
                assert [len(r) for r, _ in local] == [24 // world] * world  # equal local batches: DDP averages them
                assert np.array_equal(np.concatenate([r for r, _ in local]), rows)
                for name in NAMES:
                    joined = np.concatenate([x[name] for _, x in local])
                    assert np.array_equal(joined, arrays[name])
                    assert np.array_equal(joined, ref[name][(rows - 1000) // 3])
    loader = _loader(reference_store, streams=1, buffer_blocks=1, world=4, rank=3)
    straight = _epoch(loader)
    loader = _loader(reference_store, streams=1, buffer_blocks=1, world=4, rank=3)
    head = list(itertools.islice(iter(loader), 7))
    resumed = _loader(reference_store, streams=1, buffer_blocks=1, world=4, rank=3)
    resumed.load_state_dict(loader.state_dict())
    _assert_same(head + _epoch(resumed), straight)


def test_spawn_workers_give_the_same_batches_and_resume_exactly(reference_store):
    kw = dict(num_workers=2, multiprocessing_context="spawn", batch_size=32, streams=4, buffer_blocks=1)
    in_process = _epoch(_loader(reference_store, batch_size=32, streams=4, buffer_blocks=1))
    loader = _loader(reference_store, **kw)
    it = iter(loader)
    head = [next(it) for _ in range(7)]
    state = loader.state_dict()  # a checkpoint taken here ...
    full = head + list(it)  # ... while the uninterrupted run goes on
    _assert_same(full, in_process)  # DataLoader workers add parallelism, never other batches
    assert loader.epoch == 1
    resumed = _loader(reference_store, **kw)
    resumed.load_state_dict(state)
    _assert_same(head + _epoch(resumed), full)


def test_a_stream_holds_about_two_windows(tmp_path):
    """Memory per stream is about two windows of the requested arrays (buffer_blocks x block_rows rows: the one
    served and the next, read meanwhile) plus a batch: a window is decoded once into one array per name, and neither
    a batch nor the rows left for the next batch is a view that keeps its window alive after it is served (all of
    them together peaked at 4.3 windows once). tracemalloc sees numpy's buffers in every thread."""
    m = tiny_manifest(n_rows=512, signals=tiny_spec(max_seq_len=64, pool=4, hidden_size=64, n_heads=4))
    writer = create_or_resume(tmp_path / "s.zarr", m)
    for i in writer.pending_shards():
        writer.write_shard(i, shard_arrays(m, i))
    writer.finalize()
    names = ("hidden/L1", "hidden/L3", "attn_scores/L2")  # 2 KiB a row each
    loader = BlockLoader(tmp_path / "s.zarr", names, block_rows=64, buffer_blocks=4, seed=7, expected=None,
                         batch_size=24)
    list(loader)  # the first epoch opens the store and fills zarr's caches
    window = 4 * 64 * sum(a.row_nbytes for a in array_layout(m.signals, 512, 128) if a.name in ("row_index", *names))
    tracemalloc.start()
    try:
        assert sum(len(rows) for rows, _ in loader) == 512
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * window, f"an epoch peaked at {peak / window:.2f} windows of {window / 2**20:.1f} MiB"
