"""Block loader: seeded shuffles, exact coverage, resumable position, spawn DataLoader workers."""

import itertools

import numpy as np
import pytest
from store_helpers import full_arrays, tiny_manifest

from distillpipe.store.loader import BlockLoader, block_windows, resume_plan

NAMES = ("hidden/L1", "attn_scores/L2", "logits")


def _loader(path, **kw):
    args = dict(block_rows=64, buffer_blocks=3, seed=7, expected={"tokens_fingerprint": "tok-fp-1"}, batch_size=24)
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


def test_rows_mode_and_settings_checks(reference_store):
    loader = _loader(reference_store, batch_size=None)
    rows = [(i, x) for i, x in loader]
    assert len(rows) == 500 and isinstance(rows[0][0], int) and rows[0][1]["hidden/L1"].shape == (4, 8)
    assert sorted(i for i, _ in rows) == list(range(1000, 1000 + 3 * 500, 3))
    other = _loader(reference_store, batch_size=None, seed=3)
    with pytest.raises(ValueError, match="seed: checkpoint 7, loader 3"):
        other.load_state_dict(loader.state_dict())
    with pytest.raises(ValueError, match="block_rows=48 must divide shard_rows=128"):
        _loader(reference_store, block_rows=48)
    with pytest.raises(KeyError, match="no arrays"):
        BlockLoader(reference_store, ["hidden/L2"], block_rows=64, buffer_blocks=2, seed=0, expected=None, batch_size=4)


def _round_robin(counts):
    """Worker of each batch when a DataLoader interleaves workers round-robin, skipping exhausted ones."""
    queues = [[w] * n for w, n in enumerate(counts)]
    return [w for group in itertools.zip_longest(*queues) for w in group if w is not None]


def test_resume_plan_matches_round_robin_simulation():
    rng = np.random.default_rng(0)
    for _ in range(200):
        counts = [int(n) for n in rng.integers(0, 6, size=rng.integers(1, 5))]
        order = _round_robin(counts)
        for consumed in range(len(order) + 1):
            done, first = resume_plan(counts, consumed)
            assert done == [order[:consumed].count(w) for w in range(len(counts))]
            # a fresh DataLoader whose slot s plays worker (s + first) % W continues the sequence
            roles = [(s + first) % len(counts) for s in range(len(counts))]
            resumed = _round_robin([counts[r] - done[r] for r in roles])
            assert [roles[s] for s in resumed] == order[consumed:]


def test_spawn_workers_cover_rows_and_resume_exactly(reference_store):
    kw = dict(num_workers=2, multiprocessing_context="spawn", batch_size=32)
    loader = _loader(reference_store, **kw)
    it = iter(loader)
    head = [next(it) for _ in range(7)]
    state = loader.state_dict()  # a checkpoint taken here ...
    full = head + list(it)  # ... while the uninterrupted run goes on
    assert sorted(_rows(full)) == list(range(1000, 1000 + 3 * 500, 3))  # every row once across both workers
    assert len(full) == len(_loader(reference_store, **kw)) and loader.epoch == 1
    resumed = _loader(reference_store, **kw)
    resumed.load_state_dict(state)
    _assert_same(head + _epoch(resumed), full)
