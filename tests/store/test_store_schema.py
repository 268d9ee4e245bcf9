"""Schema: array names, shapes, dtypes and chunking implied by a SignalSpec."""

import numpy as np
import pytest
from store_helpers import COMPACT, INT8, tiny_spec

from distillpipe.store.schema import (
    ATTN_MASKED,
    MAX_CHUNK_ROWS,
    MIN_CHUNK_ROWS,
    TARGET_CHUNK_BYTES,
    SignalSpec,
    array_layout,
    constant_names,
    position_block,
    signal_parts,
    stored_layout,
)


def test_layout_shapes_and_dtypes_of_every_signal():
    spec = tiny_spec(max_seq_len=18, pool=4, embedding_size=4)  # Lp = ceil(18 / 4) = 5
    layout = {a.name: a for a in array_layout(spec, n_rows=70, shard_rows=32)}
    expected = {
        "row_index": ((70,), np.int64),
        "length": ((70,), np.int32),
        "logits": ((70, 3), np.float16),
        "mlm/positions": ((70, 3), np.int16),
        "mlm/topk_ids": ((70, 3, 5), np.uint16),
        "mlm/topk_logits": ((70, 3, 5), np.float16),
        "mlm/logsumexp": ((70, 3), np.float32),
        "hidden/L1": ((70, 5, 8), np.float16),
        "hidden/L3": ((70, 5, 8), np.float16),
        "attn_scores/L2": ((70, 2, 5, 5), np.float16),
        "attn_probs/L2": ((70, 2, 18, 18), np.float16),
    }
    assert list(layout) == list(expected)  # the embedding output is derived: no array of rows (constants)
    for name, (shape, dtype) in expected.items():
        a = layout[name]
        assert a.shape == shape and a.dtype == np.dtype(dtype), name
        assert a.shards == (32, *shape[1:]), name  # sharded along rows only
        if a.codec != "raw":  # whole rows, 8-64 a chunk
            assert a.chunks[1:] == shape[1:] and 32 % a.chunks[0] == 0, name
        else:  # one row, and a block of positions: padding chunks are left out
            assert a.chunks[0] == 1 and a.chunks[2:] == shape[2:] and shape[1] % a.chunks[1] == 0, name
    assert {n: a.codec for n, a in layout.items() if a.codec != "lz4+shuffle"} == {
        "hidden/L1": "raw", "hidden/L3": "raw", "attn_scores/L2": "lz4", "attn_probs/L2": "lz4"}
    assert layout["attn_scores/L2"].chunks == (32, 2, 5, 5)
    assert constant_names(spec) == [f"constants/embeddings/{t}" for t in
                                    ("word", "position", "token_type", "norm_weight", "norm_bias")]
    assert np.isneginf(layout["attn_scores/L2"].fill_value) and np.isneginf(ATTN_MASKED)
    assert layout["mlm/positions"].fill_value == -1


def test_qa_no_mlm_and_large_vocab():
    spec = tiny_spec(task="qa", n_classes=0, mlm_topk=0, mlm_max_masked=0, attn_probs_layers=(), embedding_size=0)
    names = [a.name for a in array_layout(spec, 10, 8)]
    assert names == ["row_index", "length", "start_logits", "end_logits", "hidden/L1", "hidden/L3", "attn_scores/L2"]
    assert {a.name: a.shape for a in array_layout(spec, 10, 8)}["start_logits"] == (10, 16)
    assert tiny_spec(vocab_size=65535).mlm_ids_dtype == np.uint16
    assert tiny_spec(vocab_size=65536).mlm_ids_dtype == np.int32
    big = {a.name: a for a in array_layout(tiny_spec(vocab_size=250_002), 10, 8)}
    assert big["mlm/topk_ids"].dtype == np.int32


def test_chunks_follow_row_bytes():
    # BERT-Large-like: hidden 96 x 1024 fp16 -> one row, blocks of 3 positions (6 KiB: at most 96 / 32); embeddings
    # 384 x 1024, 4 positions (8 KiB); attention maps 8 rows (the minimum: 4.7 MB and 295 KB a row); logits (small)
    # -> 64 rows, the MLM's top-k of a large
    # M fewer.
    spec = tiny_spec(max_seq_len=384, pool=4, hidden_size=1024, n_heads=16, hidden_layers=(12,), attn_layers=(12,),
                     attn_probs_layers=(12,), embedding_size=1024, mlm_topk=64, mlm_max_masked=300)  # fmt: skip
    layout = {a.name: a for a in array_layout(spec, 5000, 1024)}
    assert layout["attn_probs/L12"].chunks == (8, 16, 384, 384) and layout["attn_scores/L12"].chunks == (8, 16, 96, 96)
    assert layout["hidden/L12"].chunks == (1, 3, 1024)
    assert position_block(32, 768) == 1 and position_block(128, 1536) == 4 and position_block(128, 64) == 8
    assert position_block(4, 16) == 4  # tiny rows: one chunk, not 20 bytes of framing for 16 of values
    assert layout["logits"].chunk_rows == MAX_CHUNK_ROWS
    assert layout["mlm/topk_ids"].chunk_rows == 64  # 300 x 64 x 2 B = 38 KB a row: 64 rows is 2.4 MB
    assert array_layout(spec, 5000, 1024)[0].chunk_rows == MAX_CHUNK_ROWS
    big = {a.name: a for a in array_layout(tiny_spec(max_seq_len=384, mlm_topk=512, mlm_max_masked=300,
                                                          vocab_size=70_000), 50, 32)}
    assert big["mlm/topk_ids"].chunk_rows == MIN_CHUNK_ROWS  # 300 x 512 x 4 B = 614 KB a row: the 8-row minimum
    for a in layout.values():
        if a.codec != "raw":
            assert a.chunk_rows * a.row_nbytes <= TARGET_CHUNK_BYTES or a.chunk_rows == MIN_CHUNK_ROWS
        else:
            assert a.chunk_rows == 1
    # shard_rows not a multiple of 64: chunks still divide the shard
    assert all(100 % a.chunk_rows == 0 for a in array_layout(spec, 5000, 100))


def test_compact_layout_shapes_codecs_and_parts():
    # hidden states as 3 subspace coordinates a position, pooled scores and probabilities as rank-2 factors per head
    spec = tiny_spec(max_seq_len=18, pool=4, **COMPACT)
    layout = {a.name: a for a in array_layout(spec, n_rows=70, shard_rows=32)}
    compact = {n: (a.shape, a.codec, a.fill_value) for n, a in layout.items() if n.startswith(("hidden", "attn"))}
    assert compact == {
        "hidden/L1": ((70, 5, 3), "raw", 0.0), "hidden/L3": ((70, 5, 3), "raw", 0.0),
        "attn_scores/L2/left": ((70, 2, 2, 5), "lz4", 0.0), "attn_scores/L2/right": ((70, 2, 2, 5), "lz4", 0.0),
        "attn_probs/L2/left": ((70, 2, 2, 18), "lz4", 0.0), "attn_probs/L2/right": ((70, 2, 2, 18), "lz4", 0.0)}
    assert signal_parts(spec, "attn_scores/L2") == ("attn_scores/L2/left", "attn_scores/L2/right")
    assert signal_parts(spec, "attn_probs/L2") == ("attn_probs/L2/left", "attn_probs/L2/right")
    assert signal_parts(spec, "hidden/L1") == ("hidden/L1",) and signal_parts(spec, "embeddings") == ()
    assert signal_parts(tiny_spec(), "attn_scores/L2") == ("attn_scores/L2",)
    assert constant_names(spec)[:4] == ["constants/hidden/L1/mean", "constants/hidden/L1/basis",
                                        "constants/hidden/L3/mean", "constants/hidden/L3/basis"]
    # int8: every factor and the coordinates stored as int8 codes with a float16 scale per vector of the last axis
    stored = {a.name: (a.shape, a.dtype) for a in stored_layout(tiny_spec(max_seq_len=18, precision=INT8, **COMPACT),
                                                                 70, 32)}
    assert stored["attn_probs/L2/left.q"] == ((70, 2, 2, 18), np.int8)
    assert stored["attn_probs/L2/left.scale"] == ((70, 2, 2), np.float16)
    assert stored["hidden/L1.q"] == ((70, 5, 3), np.int8) and stored["hidden/L1.scale"] == ((70, 5), np.float16)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"hidden_layers": (3, 1)}, "strictly increasing"),
        ({"task": "classification", "n_classes": 0}, "n_classes"),
        ({"task": "regression"}, "task"),
        ({"mlm_topk": 5, "mlm_max_masked": 0}, "mlm_max_masked"),
        ({"pool": 0}, "pool"),
        ({"hidden_rank": 9}, "exceeds hidden_size"),
        ({"hidden_rank": 3}, "hidden_fit_rows"),
        ({"hidden_rank": 3, "hidden_fit_rows": 4, "hidden_layers": ()}, "keeps no hidden_layers"),
        ({"attn_rank": 2, "attn_layers": (), "attn_probs_layers": ()}, "keeps no attention layers"),
    ],
)
def test_spec_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_spec(**overrides)


def test_spec_dict_round_trip():
    spec = tiny_spec()
    assert SignalSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="unknown keys"):
        SignalSpec.from_dict({**spec.to_dict(), "colour": 1})
