"""Schema: array names, shapes, dtypes and chunking implied by a SignalSpec."""

import numpy as np
import pytest
from store_helpers import tiny_spec

from distillpipe.store.schema import (
    ATTN_MASKED,
    MAX_CHUNK_ROWS,
    MIN_CHUNK_ROWS,
    TARGET_CHUNK_BYTES,
    SignalSpec,
    array_layout,
    position_block,
)


def test_layout_shapes_and_dtypes_of_every_signal():
    spec = tiny_spec(max_seq_len=18, pool=4)  # Lp = ceil(18 / 4) = 5
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
        "embeddings": ((70, 18, 4), np.float16),
    }
    assert list(layout) == list(expected)
    for name, (shape, dtype) in expected.items():
        a = layout[name]
        assert a.shape == shape and a.dtype == np.dtype(dtype), name
        assert a.shards == (32, *shape[1:]), name  # sharded along rows only
        if a.codec != "raw":  # whole rows, 8-64 a chunk
            assert a.chunks[1:] == shape[1:] and 32 % a.chunks[0] == 0, name
        else:  # one row, and a block of positions: padding chunks are left out
            assert a.chunks[0] == 1 and a.chunks[2:] == shape[2:] and shape[1] % a.chunks[1] == 0, name
    assert {n: a.codec for n, a in layout.items() if a.codec != "lz4+shuffle"} == {
        "hidden/L1": "raw", "hidden/L3": "raw", "attn_scores/L2": "lz4", "attn_probs/L2": "lz4", "embeddings": "raw"}
    assert layout["attn_scores/L2"].chunks == (32, 2, 5, 5) and layout["embeddings"].chunks == (1, 18, 4)
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
    assert layout["hidden/L12"].chunks == (1, 3, 1024) and layout["embeddings"].chunks == (1, 4, 1024)
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


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"hidden_layers": (3, 1)}, "strictly increasing"),
        ({"task": "classification", "n_classes": 0}, "n_classes"),
        ({"task": "regression"}, "task"),
        ({"mlm_topk": 5, "mlm_max_masked": 0}, "mlm_max_masked"),
        ({"pool": 0}, "pool"),
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
