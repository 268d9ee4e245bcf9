"""MLM packing and static masking (distillpipe.data.masking), against naive references."""

from __future__ import annotations

import numpy as np
import pytest

from distillpipe.data.masking import MaskingSpec, mask_view, masked_rows, n_to_mask, pack_blocks, split_key

VOCAB = 30522
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103  # BERT uncased ids
SPECIAL = (PAD, UNK, CLS, SEP, MASK)


def spec(seed: int = 0, mask_prob: float = 0.15, mask_frac: float = 0.8, random_frac: float = 0.1) -> MaskingSpec:
    return MaskingSpec.build(mask_prob=mask_prob, mask_token_fraction=mask_frac, random_token_fraction=random_frac,
                             seed=seed, mask_id=MASK, special_ids=SPECIAL, vocab_size=VOCAB)


def random_blocks(n: int, length: int = 128, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(n):
        body = rng.integers(1000, VOCAB, size=length - 2)
        body[rng.random(length - 2) < 0.02] = SEP  # document separators inside a block
        body[rng.random(length - 2) < 0.01] = UNK
        blocks.append(np.concatenate([[CLS], body, [SEP]]).astype(np.int32))
    return blocks


def naive_pack(docs: list[list[int]], max_seq_len: int) -> list[list[int]]:
    stream: list[int] = []
    for d in docs:
        if d:
            if stream:
                stream.append(SEP)
            stream.extend(d)
    c = max_seq_len - 2
    return [[CLS, *stream[i:i + c], SEP] for i in range(0, len(stream), c)]


def test_pack_blocks_matches_naive_full_sentences_packing():
    rng = np.random.default_rng(0)
    docs = [rng.integers(1000, 2000, size=int(n)).tolist() for n in rng.integers(0, 70, size=40)]
    rows = [(f"d{i}", d) for i, d in enumerate(docs)]
    got = [b.tolist() for b in pack_blocks(rows, 16, CLS, SEP)]
    want = naive_pack(docs, 16)
    assert got == want
    assert all(len(b) == 16 for b in got[:-1]) and 3 <= len(got[-1]) <= 16
    assert all(b.dtype == np.int32 for b in pack_blocks(rows, 16, CLS, SEP))


def test_pack_blocks_joins_rows_of_one_document_without_separator():
    # One document split over many rows packs exactly like the same document in one row.
    doc = list(range(1000, 1100))
    as_one = [b.tolist() for b in pack_blocks([("a", doc), ("b", [5, 6, 7])], 10, CLS, SEP)]
    pieces = [("a", doc[i:i + 7]) for i in range(0, len(doc), 7)] + [("a", [])] + [("b", [5, 6, 7])]
    as_rows = [b.tolist() for b in pack_blocks(pieces, 10, CLS, SEP)]
    assert as_rows == as_one == naive_pack([doc, [5, 6, 7]], 10)
    assert sum(b.count(SEP) for b in as_one) == len(as_one) + 1  # one document separator


def test_n_to_mask_rounds_half_up_and_masks_at_least_one():
    assert n_to_mask(126, 0.15) == 19  # 18.9
    assert n_to_mask(10, 0.15) == 2  # 1.5 rounds up
    assert n_to_mask(3, 0.15) == 1  # 0.45 -> at least one
    assert n_to_mask(0, 0.15) == 0


def test_view_is_a_pure_function_of_seed_split_block_and_view():
    block = random_blocks(1)[0]
    a = mask_view(block, spec(seed=3), split_key("train"), 7, 1)
    b = mask_view(block.copy(), spec(seed=3), split_key("train"), 7, 1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    for other in (mask_view(block, spec(seed=4), split_key("train"), 7, 1),
                  mask_view(block, spec(seed=3), split_key("dev"), 7, 1),
                  mask_view(block, spec(seed=3), split_key("train"), 8, 1),
                  mask_view(block, spec(seed=3), split_key("train"), 7, 0)):
        assert not np.array_equal(a[1], other[1])


def test_split_key_is_stable_across_processes():
    # sha256-based, so the masks never depend on Python's per-process hash salt.
    assert split_key("train") == 3293867793
    assert split_key("train") != split_key("dev")


def test_masked_rows_do_not_depend_on_batching_or_order():
    blocks = random_blocks(23, length=40)
    s = spec(seed=5)
    one = [c for c in masked_rows(blocks, s, "train", 3, batch_rows=1000)]
    many = [c for c in masked_rows(blocks, s, "train", 3, batch_rows=4)]
    assert len(one) == 1 and len(many) > 1
    flat = {k: [x for c in many for x in c[k]] for k in one[0]}
    for k in one[0]:
        assert [np.asarray(x).tolist() for x in one[0][k]] == [np.asarray(x).tolist() for x in flat[k]]
    # Masking block 17 alone (out of order) gives the row written for it.
    ids, pos, lab = mask_view(blocks[17], s, split_key("train"), 17, 2)
    r = one[0]["block_id"].index(17) + 2
    assert one[0]["view"][r] == 2
    assert np.array_equal(one[0]["input_ids"][r], ids) and np.array_equal(one[0]["masked_positions"][r], pos)


def test_special_tokens_are_never_selected_and_the_block_is_recoverable():
    s = spec(seed=0, mask_prob=0.5)
    for i, block in enumerate(random_blocks(200, length=64)):
        ids, pos, lab = mask_view(block, s, 0, i, 0)
        maskable = ~np.isin(block, SPECIAL)
        assert np.all(maskable[pos])
        assert np.all(np.diff(pos) > 0)  # sorted, distinct
        assert len(pos) == n_to_mask(int(maskable.sum()), 0.5)
        assert np.array_equal(lab, block[pos])
        assert np.array_equal(ids[~np.isin(np.arange(len(block)), pos)], block[~np.isin(np.arange(len(block)), pos)])
        restored = ids.copy()
        restored[pos] = lab
        assert np.array_equal(restored, block)
        assert ids.dtype == pos.dtype == lab.dtype == np.int32


def test_80_10_10_split_and_selected_fraction_on_100k_positions():
    s = spec(seed=11)
    blocks = random_blocks(5600, length=128)
    n_sel = n_maskable = n_mask = n_random = n_same = 0
    random_ids = []
    for i, block in enumerate(blocks):
        ids, pos, lab = mask_view(block, s, split_key("train"), i, 0)
        n_maskable += int((~np.isin(block, SPECIAL)).sum())
        n_sel += len(pos)
        got = ids[pos]
        is_mask = got == MASK
        same = ~is_mask & (got == lab)
        rnd = ~is_mask & ~same
        n_mask, n_same, n_random = n_mask + is_mask.sum(), n_same + same.sum(), n_random + rnd.sum()
        random_ids.append(got[rnd])
    assert n_sel > 100_000
    assert abs(n_sel / n_maskable - 0.15) < 0.002
    assert abs(n_mask / n_sel - 0.8) < 0.01
    assert abs(n_random / n_sel - 0.1) < 0.01  # a random draw equal to the original (p ~ 3e-5) counts as same
    assert abs(n_same / n_sel - 0.1) < 0.01
    random_ids = np.concatenate(random_ids)
    assert not np.isin(random_ids, SPECIAL).any()
    # Uniform over the whole non-special vocabulary, not only ids seen in the blocks (>= 1000 here).
    assert (random_ids < 1000).mean() == pytest.approx(995 / (VOCAB - 5), abs=0.01)


def test_fractions_at_the_extremes():
    block = random_blocks(1)[0]
    ids, pos, _ = mask_view(block, spec(mask_frac=1.0, random_frac=0.0), 0, 0, 0)
    assert np.all(ids[pos] == MASK)
    ids, pos, lab = mask_view(block, spec(mask_frac=0.0, random_frac=0.0), 0, 0, 0)
    assert np.array_equal(ids, block) and len(pos) == n_to_mask(int((~np.isin(block, SPECIAL)).sum()), 0.15)


def test_negative_seed_is_refused():
    with pytest.raises(ValueError, match="seed=-1"):
        spec(seed=-1)
