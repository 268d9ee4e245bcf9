"""``wiki_qa``: SQuAD-v2-format cloze questions built from the Wikipedia sample.

A question is one sentence of a paragraph with an answer span replaced by a question word
("Zhuangzi wrote, "A petty thief is put in jail." -> "Who wrote, ...?"). The span is, in this
order of preference, a capitalised multi-word name (Who / What), a year (When), another number
(How many), or else a noun-like word of >= 4 letters after a determiner (What). A seeded fraction of questions is
made unanswerable by pairing it with a paragraph of another article of the same split. Articles
are split first, so no article is in two splits.

``max_context_chars`` crops each context to whole sentences around the question's sentence (an unanswerable
question's: around a random sentence of the other paragraph), so that a question and its context fit one
window of the tokenizer's ``max_seq_len``. SQuAD's paragraphs (~140 word pieces) fit BERT's 384-token window; the
Wikipedia sample's paragraphs do not fit the embedded 128, and a paragraph cut into overlapping windows makes
most windows of an answerable question "no answer here" (58% of the training windows at 128 tokens), a signal
that a small reader from scratch cannot tell from "unanswerable" without first learning to find the sentence.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from distillpipe.config.prepare import ArticleSplitConfig, EmbeddedWikiQAConfig
from distillpipe.data.features import rows_to_dataset
from distillpipe.data.sources.base import Prepared, PrepareError, Skips
from distillpipe.data.sources.wiki import Article, rows_by_article_split

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[\"'(\[]?[A-Z0-9])")
# Spans never start or end inside a hyphenated word ("free-market", "Pierre-Joseph").
_NAME = re.compile(r"(?<![\w-])[A-Z][a-z]+(?:\s+(?:(?:of|de|von|van|the|and)\s+)?[A-Z][a-z]+)+(?![\w-])")
_YEAR = re.compile(r"(?:1[0-9]{3}|20[0-9]{2})")
_NUMBER = re.compile(r"(?<![\w.,-])\d+(?:[.,]\d+)*(?![\w-])")
# A noun-like word: one that follows a determiner ("the treaty", "a philosophy").
_NOUN = re.compile(r"\b(?:the|a|an|its|his|her|their|this|these|those)\s+([a-z]{4,})(?![\w-])")
# Words that end a name for a place, body or event rather than a person: ask "What", not "Who".
_NOT_PERSON = {
    "Academy", "Act", "Age", "America", "Army", "Association", "Award", "Awards", "Bay", "Church", "City",
    "College", "Company", "Confederation", "Congress", "Council", "County", "Court", "Empire", "Europe",
    "Federation", "Force", "Forces", "Island", "Islands", "Kingdom", "Lake", "League", "Mountains", "Museum",
    "Nations", "Navy", "Ocean", "Party", "Province", "Republic", "Revolution", "River", "Sea", "Society",
    "State", "States", "Union", "University", "Valley", "War",
}
_STOPWORDS = {
    "about", "after", "also", "because", "been", "before", "being", "between", "both", "could", "does", "during",
    "each", "from", "have", "having", "into", "many", "more", "most", "much", "only", "other", "over", "same",
    "some", "such", "than", "that", "their", "them", "then", "there", "these", "they", "this", "those",
    "through", "under", "until", "very", "were", "what", "when", "where", "which", "while", "whom", "will",
    "with", "within", "would", "known", "called", "used", "made", "became", "later", "often", "however",
}
MIN_SENTENCE_CHARS, MAX_SENTENCE_CHARS, MIN_SENTENCE_WORDS = 40, 300, 6


@dataclass(frozen=True)
class Cloze:
    question: str
    answer: str
    answer_start: int  # char offset of the answer in the paragraph


def sentences(paragraph: str) -> list[tuple[int, str]]:
    """(char offset, sentence) pairs; a simple punctuation-based splitter."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(paragraph):
        out.append((start, paragraph[start : m.start()].rstrip()))
        start = m.end()
    out.append((start, paragraph[start:].rstrip()))
    return [(o, s) for o, s in out if s]


def _question_word(kind: str, span: str) -> str:
    if kind == "name":
        return "What" if set(span.split()) & _NOT_PERSON else "Who"
    return {"year": "When", "number": "How many"}.get(kind, "What")


def _candidates(sentence: str) -> list[tuple[str, int, int]]:
    """(kind, start, end) answer spans in a sentence: names, years, numbers; words only when none."""
    spans = []
    for m in _NAME.finditer(sentence):
        if m.start() > 0:  # a sentence-initial capital is not evidence of a name
            spans.append(("name", m.start(), m.end()))
    for m in _NUMBER.finditer(sentence):
        spans.append(("year" if _YEAR.fullmatch(m.group()) else "number", m.start(), m.end()))
    if spans:
        return spans
    return [
        ("word", m.start(1), m.end(1))
        for m in _NOUN.finditer(sentence)
        if m.group(1) not in _STOPWORDS and not m.group(1).endswith("ly")
    ]


def make_cloze(paragraph: str, n: int, rng: random.Random) -> list[Cloze]:
    """Up to ``n`` cloze questions from distinct sentences of ``paragraph``."""
    usable = [
        (offset, s) for offset, s in sentences(paragraph)
        if MIN_SENTENCE_CHARS <= len(s) <= MAX_SENTENCE_CHARS and len(s.split()) >= MIN_SENTENCE_WORDS
    ]
    rng.shuffle(usable)
    out = []
    for offset, sentence in usable:
        # A span that occurs twice would be left in the question, giving the answer away.
        spans = [c for c in _candidates(sentence) if sentence.count(sentence[c[1] : c[2]]) == 1]
        if not spans:
            continue
        kind, start, end = rng.choice(spans)
        answer = sentence[start:end]
        body = sentence[:start] + _question_word(kind, answer) + sentence[end:]
        question = body.rstrip(" .!?;:") + "?"
        cloze = Cloze(question, answer, offset + start)
        assert paragraph[cloze.answer_start : cloze.answer_start + len(answer)] == answer
        out.append(cloze)
        if len(out) == n:
            break
    return out


def crop(paragraph: str, at: int, max_chars: int | None, rng: random.Random) -> tuple[int, str]:
    """(char offset, text): the sentence of ``paragraph`` that holds char ``at``, grown a whole sentence at a
    time, on a side drawn from ``rng`` among those that keep it within ``max_chars`` (None: the whole
    paragraph). The sentence itself is kept even when it is longer."""
    if max_chars is None:
        return 0, paragraph
    spans = [(o, o + len(s)) for o, s in sentences(paragraph)]
    lo = hi = next((i for i, (o, e) in enumerate(spans) if o <= at < e), len(spans) - 1)
    while True:
        sides = [side for side, ok in (("before", lo > 0 and spans[hi][1] - spans[lo - 1][0] <= max_chars),
                                       ("after", hi + 1 < len(spans) and spans[hi + 1][1] - spans[lo][0] <= max_chars))
                 if ok]
        if not sides:
            return spans[lo][0], paragraph[spans[lo][0] : spans[hi][1]]
        if rng.choice(sides) == "before":
            lo -= 1
        else:
            hi += 1


def _rows_for_split(split: str, articles: list[Article], cfg: EmbeddedWikiQAConfig, rng: random.Random,
                    skips: Skips) -> list[dict]:
    if len(articles) < 2 and cfg.unanswerable_fraction > 0:
        raise PrepareError(
            f"split {split!r} has {len(articles)} article(s); unanswerable questions need a second article. "
            "Raise this split's fraction in params.yaml."
        )
    questions = []  # (article index, paragraph index, question number, cloze)
    for a, article in enumerate(articles):
        for p, paragraph in enumerate(article.paragraphs):
            clozes = make_cloze(paragraph, cfg.questions_per_paragraph, rng)
            if not clozes:
                skips.add("paragraphs without a usable sentence")
            else:
                skips.add("questions short of questions_per_paragraph (too few sentences)",
                          cfg.questions_per_paragraph - len(clozes))
            questions.extend((a, p, q, c) for q, c in enumerate(clozes))
    n_unanswerable = round(len(questions) * cfg.unanswerable_fraction)
    unanswerable = set(rng.sample(range(len(questions)), n_unanswerable))
    rows = []
    for i, (a, p, q, cloze) in enumerate(questions):
        title = articles[a].title
        offset, context = crop(articles[a].paragraphs[p], cloze.answer_start, cfg.max_context_chars, rng)
        answers = {"text": [cloze.answer], "answer_start": [cloze.answer_start - offset]}
        if i in unanswerable:
            # Prefer a paragraph that does not contain the answer text, so it reads as unanswerable.
            for _ in range(20):
                other = articles[rng.choice([j for j in range(len(articles)) if j != a])]
                paragraph = rng.choice(other.paragraphs)
                at = rng.choice(sentences(paragraph))[0] if cfg.max_context_chars is not None else 0
                context = crop(paragraph, at, cfg.max_context_chars, rng)[1]
                if cloze.answer not in context:
                    break
            title, answers = other.title, {"text": [], "answer_start": []}
        rows.append({"id": f"{split}-{a}-{p}-{q}", "title": title, "context": context, "question": cloze.question,
                     "answers": answers})
    return rows


def build_wiki_qa(name: str, cfg: EmbeddedWikiQAConfig, partition: ArticleSplitConfig) -> Prepared:
    skips = Skips()
    text_fields = ["question", "context"]
    rows = rows_by_article_split(f"prepare.datasets.{name}", cfg, partition, skips, lambda split, arts, rng:
                                 _rows_for_split(split, arts, cfg, rng, skips))
    splits = {split: rows_to_dataset(r, "qa", text_fields) for split, r in rows.items()}
    return Prepared(splits, "qa", [], text_fields, skips)
