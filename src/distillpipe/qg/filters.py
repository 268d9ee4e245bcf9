"""Filters for generated questions: empty, too short, a copy of a piece of the context, a duplicate.

Each question is counted under the first filter that drops it, in the order of ``REASONS``. Questions
are compared after :func:`normalize` (lower case, punctuation removed, whitespace collapsed), so
"Who wrote it?" and "who wrote it" are duplicates.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Hashable, Sequence

from distillpipe.config.augment import AugmentFiltersConfig

REASONS = ("empty", "too short", "context copies", "duplicates")
_NOT_WORD = re.compile(r"[^\w\s]+")


def normalize(text: str) -> str:
    return " ".join(_NOT_WORD.sub(" ", text.lower()).split())


def filter_questions(items: Sequence[tuple[Hashable, str, str]], cfg: AugmentFiltersConfig
                     ) -> tuple[list[bool], dict[str, int]]:
    """Which of ``(paragraph key, context, question)`` items to keep, in order, and the drop counts.

    Duplicates are judged in item order: the first occurrence is kept (``dedupe: global`` over all
    items, ``paragraph`` among items with the same key).
    """
    keep: list[bool] = []
    dropped: Counter[str] = Counter({r: 0 for r in REASONS})
    seen: set = set()
    for key, context, question in items:
        q = normalize(question)
        reason = None
        if not q:
            reason = "empty"
        elif len(q.split()) < cfg.min_question_words:
            reason = "too short"
        elif cfg.drop_context_copies and f" {q} " in f" {normalize(context)} ":
            reason = "context copies"
        elif cfg.dedupe != "off":
            dup_key = q if cfg.dedupe == "global" else (key, q)
            if dup_key in seen:
                reason = "duplicates"
            seen.add(dup_key)
        keep.append(reason is None)
        if reason is not None:
            dropped[reason] += 1
    return keep, dict(dropped)
