"""Extractive QA: question + context windows with character offsets and answer token spans.

Each example becomes one or more windows ``[CLS] question [SEP] context-slice [SEP]`` of at most
``max_seq_len`` tokens; consecutive windows of one example share ``doc_stride`` context tokens (the
fast tokenizer's ``stride``). Questions are first cut to ``max_query_len`` tokens (at a token end,
in characters, so the cut question tokenizes to the same leading tokens).

The labels follow the SQuAD v2 convention (BERT, WaLDORf): ``start_positions``/``end_positions``
are the token indices of the first gold answer when it lies wholly inside the window's context,
else 0/0 (``[CLS]``), and 0/0 for unanswerable examples. ``offset_mapping`` holds the character
span of each token in the context, ``[-1, -1]`` for question and special tokens, so that
``context[offsets[start][0]:offsets[end][1]]`` is the predicted answer text.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NO_OFFSET = -1  # both offsets of a token outside the context: (-1, -1)


def check_lengths(tokenizer: Any, max_seq_len: int, doc_stride: int, max_query_len: int) -> None:
    """Fail early, naming the params, when the longest question leaves too little room for the stride."""
    room = max_seq_len - tokenizer.num_special_tokens_to_add(pair=True) - max_query_len
    if max_query_len < 1 or room <= doc_stride:
        raise ValueError(
            f"with max_seq_len={max_seq_len} and max_query_len={max_query_len}, "
            f"a window has room for {room} context tokens, which must exceed doc_stride={doc_stride}; "
            "lower doc_stride or max_query_len, or raise tokenize.max_seq_len"
        )


def truncate_questions(tokenizer: Any, questions: list[str], max_query_len: int) -> tuple[list[str], int]:
    """Cut each question after its ``max_query_len``-th token; returns the questions and how many were cut."""
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True,
                    return_attention_mask=False, return_token_type_ids=False, verbose=False)
    out, n_cut = [], 0
    for q, ids, offsets in zip(questions, enc["input_ids"], enc["offset_mapping"]):
        if len(ids) > max_query_len:
            q = q[:offsets[max_query_len - 1][1]]
            n_cut += 1
        out.append(q)
    return out, n_cut


def answer_token_span(offsets: np.ndarray, is_context: np.ndarray, start_char: int, end_char: int) -> tuple[int, int]:
    """Token indices of the context tokens covering ``[start_char, end_char)``, or (0, 0) when the
    span is not wholly inside this window's context."""
    ctx = np.flatnonzero(is_context)
    if ctx.size == 0 or end_char <= start_char:
        return 0, 0
    starts, ends = offsets[ctx, 0], offsets[ctx, 1]
    if starts[0] > start_char or ends[-1] < end_char:
        return 0, 0
    # Last token starting at or before the answer start; first token ending at or after its end.
    s = int(np.searchsorted(starts, start_char, side="right")) - 1
    e = int(np.searchsorted(ends, end_char, side="left"))
    return int(ctx[s]), int(ctx[e])


def gold_char_span(context: str, answers: dict[str, list]) -> tuple[int, int] | None:
    """The first gold answer as ``[start, end)`` characters, whitespace trimmed; None when unanswerable."""
    texts, starts = answers["text"], answers["answer_start"]
    if not texts:
        return None
    start = int(starts[0])
    end = start + len(texts[0])
    while start < end and context[start].isspace():
        start += 1
    while end > start and context[end - 1].isspace():
        end -= 1
    return start, end


def qa_window_columns(tokenizer: Any, batch: dict[str, list], max_seq_len: int, doc_stride: int,
                      max_query_len: int) -> tuple[dict[str, list], dict[str, int]]:
    """Windows (the Tokens ``qa`` columns) for a batch of prepared QA rows, and counts for the summary."""
    questions, n_cut = truncate_questions(tokenizer, batch["question"], max_query_len)
    contexts = batch["context"]
    enc = tokenizer(questions, contexts, truncation="only_second", max_length=max_seq_len, stride=doc_stride,
                    return_overflowing_tokens=True, return_offsets_mapping=True, return_token_type_ids=True,
                    padding=False)
    counts = {"examples": len(contexts), "truncated_questions": n_cut, "answerable": 0, "windows": 0,
              "windows_with_answer": 0, "answers_in_no_window": 0, "answer_text_mismatch": 0}
    spans = []
    for context, answers in zip(contexts, batch["answers"]):
        span = gold_char_span(context, answers)
        if span is not None:
            counts["answerable"] += 1
            if context[int(answers["answer_start"][0]):][:len(answers["text"][0])] != answers["text"][0]:
                counts["answer_text_mismatch"] += 1
        spans.append(span)

    cols: dict[str, list] = {k: [] for k in ("input_ids", "token_type_ids", "length", "example_id",
                                             "offset_mapping", "start_positions", "end_positions", "has_answer")}
    found = np.zeros(len(contexts), dtype=bool)
    for i, ex in enumerate(enc["overflow_to_sample_mapping"]):
        ids = np.asarray(enc["input_ids"][i], dtype=np.int32)
        is_context = np.asarray([s == 1 for s in enc.sequence_ids(i)])
        offsets = np.asarray(enc["offset_mapping"][i], dtype=np.int32).reshape(-1, 2)
        offsets[~is_context] = NO_OFFSET
        start = end = 0
        if spans[ex] is not None:
            start, end = answer_token_span(offsets, is_context, *spans[ex])
            found[ex] |= start > 0
        counts["windows_with_answer"] += start > 0
        cols["input_ids"].append(ids)
        cols["token_type_ids"].append(np.asarray(enc["token_type_ids"][i], dtype=np.int8))
        cols["length"].append(ids.size)
        cols["example_id"].append(batch["id"][ex])
        cols["offset_mapping"].append(offsets)
        cols["start_positions"].append(start)
        cols["end_positions"].append(end)
        cols["has_answer"].append(spans[ex] is not None)
    counts["windows"] = len(cols["length"])
    counts["answers_in_no_window"] = int(sum(s is not None and not f for s, f in zip(spans, found)))
    return cols, counts
