"""Capture batches: right padding with MLM positions, and deterministic length buckets."""

import numpy as np
import pytest
import torch
from _teacher_tiny import make_rows

from distillpipe.teacher.batching import collate, length_buckets


def test_collate_pads_rows_and_masked_positions():
    rows = make_rows([7, 3, 5], seed=0, n_masked=[2, 0, 1])
    b = collate(rows, pad_id=0)
    assert b["input_ids"].shape == (3, 7) and b["input_ids"].dtype == torch.int64
    assert b["lengths"].tolist() == [7, 3, 5]
    for i, r in enumerate(rows):
        n = r["length"]
        assert b["input_ids"][i, :n].tolist() == r["input_ids"] and not b["input_ids"][i, n:].any()
        assert b["token_type_ids"][i, :n].tolist() == r["token_type_ids"]
        assert b["attention_mask"][i].tolist() == [1] * n + [0] * (7 - n)
        m = len(r["masked_positions"])
        assert b["masked_positions"][i, :m].tolist() == r["masked_positions"]
        assert b["masked_valid"][i].tolist() == [True] * m + [False] * (2 - m)
    columnar = {k: [r[k] for r in rows] for k in rows[0]}  # Dataset[idx] output
    assert all(torch.equal(v, collate(columnar, 0)[k]) for k, v in b.items())


def test_collate_refuses_inconsistent_rows():
    rows = make_rows([5, 4])
    rows[1]["length"] = 6
    with pytest.raises(ValueError, match="row 1 of the batch"):
        collate(rows, 0)


def test_length_buckets_are_deterministic_and_tight():
    lengths = np.random.default_rng(0).integers(1, 200, size=103)
    buckets = length_buckets(lengths, 16)
    assert buckets == length_buckets(lengths, 16)
    assert [len(b) for b in buckets] == [16] * 6 + [7]
    flat = [i for b in buckets for i in b]
    assert sorted(flat) == list(range(103))
    assert list(lengths[flat]) == sorted(lengths)  # sorted by length: the least padding possible
    assert all(isinstance(i, int) for i in flat)


def test_token_columns_collate_equals_collate(tmp_path):
    """The capture's batches from flat Arrow columns equal the reference collate of the same rows, for any rows
    of any shard (with and without MLM positions, through a dataset index mapping, a partial last shard)."""
    from datasets import Dataset

    from distillpipe.teacher.batching import TokenColumns

    rng = np.random.default_rng(3)
    lengths = rng.integers(3, 40, size=90).tolist()
    for n_masked in (None, rng.integers(0, 6, size=90).tolist()):
        rows = Dataset.from_list(make_rows(lengths, seed=1, n_masked=n_masked))
        rows.save_to_disk(str(tmp_path / "t"))
        rows = Dataset.load_from_disk(str(tmp_path / "t")).select(rng.permutation(90)[:70])  # an index mapping
        for start, stop in [(0, 32), (32, 64), (64, 70)]:
            cols = TokenColumns(rows, start, stop)
            assert cols.n == stop - start and cols.lengths.tolist() == rows["length"][start:stop]
            for idx in length_buckets(cols.lengths, 8) + [rng.permutation(stop - start)[:5].tolist()]:
                want = collate(rows.select(range(start, stop))[idx], pad_id=0)
                got = cols.collate(idx, pad_id=0)
                assert got.keys() == want.keys()
                assert all(torch.equal(got[k], want[k]) for k in want), idx


def test_token_columns_refuse_inconsistent_rows():
    from datasets import Dataset

    from distillpipe.teacher.batching import TokenColumns

    rows = make_rows([5, 4])
    rows[1]["length"] = 6
    with pytest.raises(ValueError, match="row 1 of the batch: length=6 but 4 input_ids"):
        TokenColumns(Dataset.from_list(rows), 0, 2).collate([0, 1], 0)
