"""Filters on crafted questions: each reason, the order in which they apply, and the dedupe scopes."""

import pytest

from distillpipe.config.augment import AugmentFiltersConfig
from distillpipe.qg.filters import REASONS, filter_questions, normalize

CTX = "Clara built the river near the tower. Hugo sold the palace in 1857."


def cfg(min_words=3, copies=True, dedupe="global"):
    return AugmentFiltersConfig(min_question_words=min_words, drop_context_copies=copies, dedupe=dedupe)


def test_normalize():
    assert normalize("  Who BUILT, the river?! ") == "who built the river"
    assert normalize("?!.") == ""


def test_each_filter_on_crafted_questions():
    items = [
        (0, CTX, "Who built the river near the tower?"),   # kept
        (0, CTX, "   "),                                     # empty
        (0, CTX, "?"),                                       # empty after normalisation
        (0, CTX, "Who built?"),                              # too short (2 words < 3)
        (0, CTX, "Clara built the river near the tower."),   # a copied sentence
        (0, CTX, "hugo sold the palace"),                    # a copied piece of a sentence
        (1, CTX, "who built the river near the TOWER"),      # duplicate of the first (normalised), other paragraph
        (1, CTX, "When did Hugo sell the palace?"),          # kept
    ]
    keep, dropped = filter_questions(items, cfg())
    assert keep == [True, False, False, False, False, False, False, True]
    assert dropped == {"empty": 2, "too short": 1, "context copies": 2, "duplicates": 1}
    assert tuple(dropped) == REASONS


def test_a_piece_of_a_word_is_not_a_copy():
    # "ilt the river" appears inside the context's characters but not on word boundaries
    keep, dropped = filter_questions([(0, CTX, "ilt the river near")], cfg())
    assert keep == [True] and dropped["context copies"] == 0


@pytest.mark.parametrize("dedupe, expect", [
    ("global", [True, False, False, True]),
    ("paragraph", [True, False, True, True]),
    ("off", [True, True, True, True]),
])
def test_dedupe_scopes(dedupe, expect):
    items = [("a", CTX, "Who sold the palace?"), ("a", CTX, "who sold the palace"),
             ("b", CTX, "Who sold the palace?"), ("b", CTX, "Who crossed the canyon?")]
    keep, dropped = filter_questions(items, cfg(dedupe=dedupe))
    assert keep == expect
    assert dropped["duplicates"] == expect.count(False)


def test_first_failing_filter_counts_and_dropped_questions_do_not_dedupe():
    # a short question is counted as too short, and (dropped) does not make a later copy a duplicate
    items = [(0, CTX, "Who?"), (0, CTX, "Who?"), (0, CTX, "Who did it all?"), (0, CTX, "who did it all")]
    keep, dropped = filter_questions(items, cfg(min_words=2, copies=False))
    assert keep == [False, False, True, False]
    assert dropped == {"empty": 0, "too short": 2, "context copies": 0, "duplicates": 1}
    keep, _ = filter_questions([(0, CTX, "Clara built the river near the tower.")], cfg(copies=False))
    assert keep == [True]
