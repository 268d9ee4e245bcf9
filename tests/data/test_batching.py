"""Length bucketing and right-padding against naive references: every row in exactly one batch, sorted batches
without shuffle, bounded padding with it, and padded tensors equal to a per-element loop."""

import numpy as np
import pytest
import torch

from distillpipe.data.batching import collate_tokens, length_batches, pad_sequences


def _padding(lengths, batches):
    """Pad positions the batches cost: per batch, size x longest - tokens."""
    return sum(len(b) * max(lengths[b]) - sum(lengths[b]) for b in batches)


def test_sorted_batches_are_a_stable_sort_cut_in_order():
    lengths = np.array([5, 3, 5, 1, 3, 9, 1])
    batches = length_batches(lengths, 3)
    # stable sort by length: 1 (rows 3, 6), 3 (rows 1, 4), 5 (rows 0, 2), 9 (row 5)
    assert [b.tolist() for b in batches] == [[3, 6, 1], [4, 0, 2], [5]]


@pytest.mark.parametrize("n,batch_size", [(0, 4), (1, 4), (10, 3), (64, 8), (100, 1)])
def test_every_row_once_in_batches_of_the_size(n, batch_size):
    lengths = np.random.default_rng(n).integers(1, 50, size=n)
    for shuffle in (False, True):
        batches = length_batches(lengths, batch_size, shuffle=shuffle, seed=3, window=2)
        got = np.concatenate(batches) if batches else np.array([], dtype=int)
        assert sorted(got.tolist()) == list(range(n))
        assert all(1 <= len(b) <= batch_size for b in batches)
        # only the last batch of each window of `window` batches may be short
        assert sum(len(b) < batch_size for b in batches) <= -(-n // (batch_size * 2))


def test_shuffled_batches_depend_on_the_seed_and_bucket_inside_windows():
    lengths = np.random.default_rng(0).integers(1, 200, size=512)
    a = length_batches(lengths, 8, shuffle=True, seed=1, window=16)
    b = length_batches(lengths, 8, shuffle=True, seed=1, window=16)
    c = length_batches(lengths, 8, shuffle=True, seed=2, window=16)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert [x.tolist() for x in a] != [x.tolist() for x in c]
    assert all(np.all(np.diff(lengths[x]) >= 0) for x in a)  # sorted by length within a batch
    # bucketing inside windows of 16 batches pads far less than random batches (and no less than a full sort)
    rand = np.random.default_rng(1).permutation(512)
    random_pad = _padding(lengths, [rand[i:i + 8] for i in range(0, 512, 8)])
    assert _padding(lengths, length_batches(lengths, 8)) <= _padding(lengths, a) < random_pad / 4


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="batch_size"):
        length_batches([1, 2], 0)


def _naive_pad(seqs, pad, length=None):
    t = max((len(s) for s in seqs), default=0) if length is None else length
    return [[s[j] if j < len(s) else pad for j in range(t)] for s in seqs]


def test_pad_sequences_against_a_loop():
    seqs = [[4, 5, 6], [], [7], np.array([8, 9], dtype=np.int32)]
    assert pad_sequences(seqs, 0).tolist() == _naive_pad([list(s) for s in seqs], 0)
    assert pad_sequences(seqs, -1, length=2).tolist() == _naive_pad([list(s) for s in seqs], -1, 2)  # truncates
    assert pad_sequences(seqs, -1, length=5).tolist() == _naive_pad([list(s) for s in seqs], -1, 5)
    assert pad_sequences([], 0).shape == (0, 0)
    assert pad_sequences([[1, 2]], 0, dtype=torch.int8).dtype == torch.int8


def test_collate_tokens_masks_exactly_the_real_tokens():
    rows = {"input_ids": [[101, 7, 102], [101, 102], [101, 8, 9, 10, 102]],
            "token_type_ids": [[0, 0, 0], [0, 0], [0, 0, 1, 1, 1]]}
    out = collate_tokens(rows, pad_id=0)
    assert out["input_ids"].tolist() == _naive_pad(rows["input_ids"], 0)
    assert out["token_type_ids"].tolist() == _naive_pad(rows["token_type_ids"], 0)
    assert out["attention_mask"].tolist() == [[int(j < len(s)) for j in range(5)] for s in rows["input_ids"]]
    no_types = collate_tokens({"input_ids": rows["input_ids"]}, pad_id=0)
    assert torch.equal(no_types["token_type_ids"], torch.zeros(3, 5, dtype=torch.long))
