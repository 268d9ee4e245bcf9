"""Classification rows for the ``tokenize`` stage: the joint encoding ``[CLS] a [SEP] b [SEP]`` (longest-first
truncation) that the teacher and joint students read, and each sentence alone, ``[CLS] x [SEP]``, for DiffCat
students (each sentence encoded on its own, then their encodings combined)."""

from __future__ import annotations

from typing import Any

import numpy as np


def classification_columns(tok: Any, batch: dict[str, list], pair: bool, max_seq_len: int
                           ) -> tuple[dict[str, list], dict[str, int]]:
    """Joint ``[CLS] a [SEP] b [SEP]`` (longest-first truncation) and separate ``[CLS] a [SEP]``,
    ``[CLS] b [SEP]`` encodings, each of at most ``max_seq_len`` tokens, with truncation counts."""
    a_ids, full_a, n_a = _encode_single(tok, batch["text_a"], max_seq_len)
    n = len(a_ids)
    counts = {"truncated_a": n_a}
    if pair:
        b_ids, full_b, n_b = _encode_single(tok, batch["text_b"], max_seq_len)
        joint = tok(batch["text_a"], batch["text_b"], truncation="longest_first", max_length=max_seq_len,
                    return_token_type_ids=True, return_attention_mask=False)
        input_ids, type_ids = joint["input_ids"], joint["token_type_ids"]
        s1, s2 = tok.num_special_tokens_to_add(pair=False), tok.num_special_tokens_to_add(pair=True)
        counts["truncated_b"] = n_b
        counts["truncated"] = sum((la - s1) + (lb - s1) + s2 > max_seq_len for la, lb in zip(full_a, full_b))
    else:
        b_ids = [np.zeros(0, dtype=np.int32)] * n
        input_ids, type_ids = a_ids, [np.zeros(len(x), dtype=np.int8) for x in a_ids]
        counts["truncated"] = n_a
    cols = {"input_ids": input_ids, "token_type_ids": type_ids, "length": [len(x) for x in input_ids],
            "example_id": batch["id"], "label": batch["label"], "a_input_ids": a_ids, "b_input_ids": b_ids}
    return cols, counts


def _encode_single(tok: Any, texts: list[str], max_seq_len: int) -> tuple[list, list[int], int]:
    """``[CLS] x [SEP]`` per text, truncated to ``max_seq_len``; also the untruncated lengths and the
    number truncated (only the over-long texts are encoded a second time)."""
    ids = tok(texts, return_attention_mask=False, return_token_type_ids=False, verbose=False)["input_ids"]
    full = [len(x) for x in ids]
    long = [i for i, n in enumerate(full) if n > max_seq_len]
    if long:
        cut = tok([texts[i] for i in long], truncation=True, max_length=max_seq_len,
                  return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        for i, x in zip(long, cut):
            ids[i] = x
    return ids, full, len(long)
