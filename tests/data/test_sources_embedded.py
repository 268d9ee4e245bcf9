"""Embedded sources: the gensim Wikipedia sample (wiki, wiki_pairs, wiki_qa) and polarity."""

import bz2
import random
import re
from collections import Counter, defaultdict

import pytest

from distillpipe.config.base import build
from distillpipe.config.prepare import (
    ArticleSplitConfig,
    EmbeddedPolarityConfig,
    EmbeddedWikiConfig,
    EmbeddedWikiPairsConfig,
    EmbeddedWikiQAConfig,
)
from distillpipe.data.sources import PrepareError, build_source
from distillpipe.data.sources.base import Skips
from distillpipe.data.sources.embedded import POLARITY_FILE, gensim_test_file
from distillpipe.data.sources.wiki import WIKI_FILE, _filtered_pages, article_split, clean_paragraphs, wiki_articles
from distillpipe.data.sources.wiki_qa import crop, make_cloze, sentences


def articles(dev=0.15, test=0.15, seed=0):
    return build(ArticleSplitConfig, dict(splits=dict(dev=dev, test=test), seed=seed), "prepare.wiki_articles")


ARTICLES = articles()


def wiki_cfg(min_chars=80):
    return build(EmbeddedWikiConfig, dict(source="embedded", asset="wiki", min_paragraph_chars=min_chars),
                 "prepare.datasets.wiki")


def pairs_cfg(per_article=5, seed=0):
    return build(EmbeddedWikiPairsConfig, dict(source="embedded", asset="wiki_pairs", min_paragraph_chars=80,
                                               pairs_per_article=per_article, seed=seed), "prepare.datasets.wiki_pairs")


def qa_cfg(unanswerable=0.33, per_paragraph=1, seed=0, max_context_chars=None):
    return build(EmbeddedWikiQAConfig, dict(source="embedded", asset="wiki_qa", min_paragraph_chars=200,
                                            questions_per_paragraph=per_paragraph, max_context_chars=max_context_chars,
                                            unanswerable_fraction=unanswerable, seed=seed), "prepare.datasets.wiki_qa")


def polarity_cfg(encoding="cp1252", seed=0):
    return build(EmbeddedPolarityConfig, dict(source="embedded", asset="polarity", encoding=encoding,
                                              splits=dict(dev=0.2, test=0.1), seed=seed), "prepare.datasets.polarity")


@pytest.fixture(scope="module")
def paragraph_titles():
    """paragraph text -> titles of the articles it occurs in (min 80 chars), from the raw extraction."""
    out = defaultdict(set)
    for article in wiki_articles(80, Skips()):
        for p in article.paragraphs:
            out[p].add(article.title)
    return out


# --------------------------------------------------------------------------------------------
# wiki


def test_page_counts_match_the_raw_file():
    # Independent count of <page> and #REDIRECT in the XML itself.
    xml = bz2.open(gensim_test_file(WIKI_FILE), "rt", encoding="utf-8").read()
    pages = xml.count("<page>")
    redirects = len(re.findall(r"<text[^>]*>\s*#REDIRECT", xml, flags=re.IGNORECASE))
    assert (pages, redirects) == (206, 100)
    skips = Skips()
    articles = wiki_articles(80, skips)
    assert skips.counts["redirect pages"] == redirects
    assert len(articles) == pages - redirects


def test_clean_paragraphs_removes_markup_and_counts_it():
    text = (
        "'''Foo''' () is a ''thing'' , with a long enough first paragraph.\n\n\n\n"
        "==History==\n"
        "Caption of an image\n"
        "The history of foo is long.\n"
        "{| class=wikitable\n| cell || cell\n|}\n"
        "File:Foo.jpg|A foo in the wild\n"
        "* A list item about foo\n"
        "=== See also ===\n"
        "* Bar\n"
        "* Baz\n"
        "== Economy ==\n"
        "Foo makes money.\n"
    )
    skips = Skips()
    paragraphs = clean_paragraphs(text, skips)
    assert paragraphs == [
        "Foo is a thing, with a long enough first paragraph.",
        "Caption of an image",
        "The history of foo is long.",
        "A list item about foo",
        "Foo makes money.",
    ]
    assert skips.as_dict() == {"heading lines": 3, "reference-section lines": 2, "table/image markup lines": 4}


def test_wiki_corpus_splits_by_article():
    prepared = build_source("wiki", wiki_cfg(), articles(dev=0.1, test=0.0))
    assert list(prepared.splits) == ["train", "dev"]
    assert prepared.task_type == "corpus" and prepared.text_fields == ["text"]
    titles = {s: set(ds["doc_id"]) for s, ds in prepared.splits.items()}
    assert not titles["train"] & titles["dev"]
    assert len(titles["train"]) + len(titles["dev"]) == 106
    for split, ts in titles.items():
        assert all(article_split(t, articles(dev=0.1, test=0.0)) == split for t in ts)
    for ds in prepared.splits.values():
        assert all(len(t) >= 80 for t in ds["text"])
        # A document's rows are consecutive.
        runs = [k for i, k in enumerate(ds["doc_id"]) if i == 0 or ds["doc_id"][i - 1] != k]
        assert len(runs) == len(set(runs))
        joined = "\n".join(ds["text"])
        for residue in ("==", "'''", "''", "{|", "|", "()"):
            assert residue not in joined, residue
    skipped = prepared.skips.as_dict()
    assert skipped["redirect pages"] == 100 and skipped["short paragraphs"] > 0 and skipped["heading lines"] > 0


def test_one_article_partition_for_every_dataset_of_the_sample():
    """The partition is drawn over all article pages, so a dataset that keeps fewer articles (wiki_qa: longer
    paragraphs) puts each in the split the corpus puts it in."""
    wiki = build_source("wiki", wiki_cfg(), ARTICLES)
    qa = build_source("wiki_qa", qa_cfg(), ARTICLES)
    pairs = build_source("wiki_pairs", pairs_cfg(), ARTICLES)
    corpus_split = {t: s for s, ds in wiki.splits.items() for t in ds["doc_id"]}
    for s, ds in qa.splits.items():
        answerable = [r["title"] for r in ds if r["answers"]["text"]]
        assert answerable and all(corpus_split[t] == s for t in answerable)
    by_text = {p: s for s, ds in wiki.splits.items() for p in ds["text"]}
    for s, ds in pairs.splits.items():
        assert all(by_text[t] == s for t in list(ds["text_a"]) + list(ds["text_b"]) if t in by_text)
    pages = [t for t, _ in _filtered_pages()[0]]
    counts = Counter(article_split(t, ARTICLES) for t in pages)
    assert counts["dev"] == counts["test"] == round(0.15 * len(pages))  # exact fractions of the pages
    other = [article_split(t, articles(seed=1)) for t in pages]
    assert other != [article_split(t, ARTICLES) for t in pages]
    with pytest.raises(PrepareError, match="prepare.wiki_articles"):
        build_source("wiki", wiki_cfg(min_chars=5000), ARTICLES)  # too few articles kept to fill every split


def test_wiki_test_split_when_fraction_positive_and_determinism():
    a = build_source("wiki", wiki_cfg(), articles(dev=0.1, test=0.1, seed=3))
    b = build_source("wiki", wiki_cfg(), articles(dev=0.1, test=0.1, seed=3))
    c = build_source("wiki", wiki_cfg(), articles(dev=0.1, test=0.1, seed=4))
    assert list(a.splits) == ["train", "dev", "test"]
    for s in a.splits:
        assert a.splits[s].to_list() == b.splits[s].to_list()
    assert set(a.splits["dev"]["doc_id"]) != set(c.splits["dev"]["doc_id"])


# --------------------------------------------------------------------------------------------
# polarity


def test_polarity_stratified_splits():
    prepared = build_source("polarity", polarity_cfg())
    assert prepared.label_names == ["neg", "pos"] and prepared.text_fields == ["text_a"]
    assert set(prepared.splits["train"].column_names) == {"id", "text_a", "label"}
    sizes = {s: Counter(ds["label"]) for s, ds in prepared.splits.items()}
    assert sizes == {"train": {0: 70, 1: 70}, "dev": {0: 20, 1: 20}, "test": {0: 10, 1: 10}}
    ids = [i for ds in prepared.splits.values() for i in ds["id"]]
    assert len(set(ids)) == 200
    # Against the raw file: the row for line n has that line's label and text.
    lines = gensim_test_file(POLARITY_FILE).read_bytes().decode("cp1252").split("\n")
    for row in prepared.splits["dev"]:
        line = lines[int(row["id"].rsplit(":", 1)[1]) - 1]
        assert line.startswith(("__label__neg ", "__label__pos ")[row["label"]])
        assert line.split(" ", 1)[1].strip() == row["text_a"]
    # cp1252 decoding turns 0x97 into an em dash somewhere in the corpus.
    assert any("\u2014" in t for ds in prepared.splits.values() for t in ds["text_a"])


def test_polarity_wrong_encoding_names_file_line_and_byte():
    raw = gensim_test_file(POLARITY_FILE).read_bytes()
    expected_line = None
    for number, line in enumerate(raw.split(b"\n"), start=1):  # naive reference: first undecodable line
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            expected_line, byte = number, line[e.start : e.start + 1]
            break
    assert expected_line is not None
    with pytest.raises(PrepareError) as err:
        build_source("polarity", polarity_cfg(encoding="utf-8"))
    msg = str(err.value)
    assert f"{POLARITY_FILE}:{expected_line}:" in msg
    assert f"0x{byte.hex()}" in msg and "0x97" in msg
    assert "prepare.datasets.polarity.encoding" in msg and "cp1252" in msg


# --------------------------------------------------------------------------------------------
# wiki_pairs


def test_wiki_pairs_balanced_no_article_leak(paragraph_titles):
    cfg = pairs_cfg(per_article=5)
    prepared = build_source("wiki_pairs", cfg, ARTICLES)
    assert prepared.label_names == ["different", "same"]
    assert list(prepared.splits) == ["train", "dev", "test"]
    split_titles = {}
    for split, ds in prepared.splits.items():
        labels = Counter(ds["label"])
        assert labels[0] == labels[1] > 0
        titles = set()
        for row in ds:
            a, b = paragraph_titles[row["text_a"]], paragraph_titles[row["text_b"]]
            if row["label"] == 1:
                assert a & b and row["text_a"] != row["text_b"]
            else:
                assert a != b
            titles |= a | b
        split_titles[split] = titles
    assert not split_titles["train"] & split_titles["dev"]
    assert not split_titles["train"] & split_titles["test"]
    assert not split_titles["dev"] & split_titles["test"]
    # Positives per article are capped by pairs_per_article and by the pairs an article has.
    articles = wiki_articles(80, Skips())
    expected = sum(min(5, len(a.paragraphs) * (len(a.paragraphs) - 1) // 2) for a in articles)
    assert sum(Counter(ds["label"])[1] for ds in prepared.splits.values()) == expected


def test_wiki_pairs_deterministic():
    a, b = (build_source("wiki_pairs", pairs_cfg(seed=7), ARTICLES),
            build_source("wiki_pairs", pairs_cfg(seed=7), ARTICLES))
    c = build_source("wiki_pairs", pairs_cfg(seed=8), ARTICLES)
    assert all(a.splits[s].to_list() == b.splits[s].to_list() for s in a.splits)
    assert a.splits["train"].to_list() != c.splits["train"].to_list()


# --------------------------------------------------------------------------------------------
# wiki_qa


def test_make_cloze_offsets_and_question_words():
    paragraph = "Apollo 11 was a spaceflight. In 1969, the crew led by Neil Armstrong landed on the Moon safely."
    seen = {}
    for seed in range(30):
        for c in make_cloze(paragraph, 2, random.Random(seed)):
            assert paragraph[c.answer_start : c.answer_start + len(c.answer)] == c.answer
            assert c.question.endswith("?") and c.answer not in c.question
            seen[c.answer] = c.question
    assert "When" in seen["1969"]
    assert "Who" in seen["Neil Armstrong"]


def test_wiki_qa_answers_fraction_and_splits():
    cfg = qa_cfg(unanswerable=0.33)
    prepared = build_source("wiki_qa", cfg, ARTICLES)
    assert prepared.task_type == "qa" and list(prepared.splits) == ["train", "dev", "test"]
    assert set(prepared.splits["train"].column_names) == {"id", "title", "context", "question", "answers"}
    titles, contexts, ids = {}, {}, []
    for split, ds in prepared.splits.items():
        unanswerable = 0
        for row in ds:
            texts, starts = row["answers"]["text"], row["answers"]["answer_start"]
            assert len(texts) == len(starts) <= 1
            if not texts:
                unanswerable += 1
                continue
            assert row["context"][starts[0] : starts[0] + len(texts[0])] == texts[0]
            assert texts[0] not in row["question"]
        assert abs(unanswerable / len(ds) - 0.33) <= 1 / len(ds)
        titles[split], contexts[split] = set(ds["title"]), set(ds["context"])
        ids += ds["id"]
    assert len(ids) == len(set(ids))
    for x, y in [("train", "dev"), ("train", "test"), ("dev", "test")]:
        assert not titles[x] & titles[y] and not contexts[x] & contexts[y]
    assert all(len(c) >= 200 for cs in contexts.values() for c in cs)


def test_wiki_qa_unanswerable_context_is_from_another_article():
    prepared = build_source("wiki_qa", qa_cfg(unanswerable=0.5), ARTICLES)
    ds = prepared.splits["dev"]
    # The row id encodes the source article; an unanswerable row's context comes from another one.
    by_article = defaultdict(set)
    for row in ds:
        if row["answers"]["text"]:
            by_article[row["id"].split("-")[1]].add(row["title"])
    for row in ds:
        if not row["answers"]["text"] and row["id"].split("-")[1] in by_article:
            assert row["title"] not in by_article[row["id"].split("-")[1]]


def test_wiki_qa_deterministic_and_questions_per_paragraph():
    a, b = (build_source("wiki_qa", qa_cfg(per_paragraph=2), ARTICLES),
            build_source("wiki_qa", qa_cfg(per_paragraph=2), ARTICLES))
    assert all(a.splits[s].to_list() == b.splits[s].to_list() for s in a.splits)
    one = build_source("wiki_qa", qa_cfg(per_paragraph=1), ARTICLES)
    n1 = sum(len(ds) for ds in one.splits.values())
    n2 = sum(len(ds) for ds in a.splits.values())
    assert n1 < n2 <= 2 * n1


def test_crop_is_the_largest_run_of_whole_sentences_around_the_char_within_the_limit():
    paragraph = ("Alpha is the first letter. Beta comes second in the list. Gamma is third. Delta, the fourth, is a "
                 "triangle. Epsilon is fifth and last of these.")
    spans = [(o, o + len(t)) for o, t in sentences(paragraph)]
    assert len(spans) == 5
    for limit in (10, 60, 90, 120, 1000):
        for at in (0, spans[2][0] + 3, len(paragraph) - 2):
            for seed in range(5):
                offset, text = crop(paragraph, at, limit, random.Random(seed))
                assert paragraph[offset : offset + len(text)] == text and offset <= at < offset + len(text)
                covered = [i for i, (o, e) in enumerate(spans) if offset <= o and e <= offset + len(text)]
                assert (spans[covered[0]][0], spans[covered[-1]][1]) == (offset, offset + len(text))  # whole sentences
                assert len(text) <= limit or len(covered) == 1  # a too-long sentence is kept whole, alone
                lo, hi = covered[0], covered[-1]
                # maximal: neither neighbour fits any more
                assert lo == 0 or spans[hi][1] - spans[lo - 1][0] > limit
                assert hi == len(spans) - 1 or spans[hi + 1][1] - spans[lo][0] > limit
    assert crop(paragraph, 5, None, random.Random(0)) == (0, paragraph)


def test_wiki_qa_cropped_contexts_keep_answers_and_sources():
    limit = 300
    prepared = build_source("wiki_qa", qa_cfg(max_context_chars=limit), ARTICLES)
    whole = build_source("wiki_qa", qa_cfg(), ARTICLES)
    for split, ds in prepared.splits.items():
        assert len(ds) == len(whole.splits[split])  # the same questions, only their contexts cut
        paragraphs = set(whole.splits[split]["context"])
        n_unanswerable = 0
        for row in ds:
            context, answers = row["context"], row["answers"]
            assert len(context) <= limit or len(sentences(context)) == 1
            if answers["text"]:
                start, text = answers["answer_start"][0], answers["text"][0]
                assert context[start : start + len(text)] == text
                # the context is a piece of the very paragraph the uncropped question is asked on
                assert any(context in p for p in paragraphs)
            else:
                n_unanswerable += 1
        assert abs(n_unanswerable / len(ds) - 0.33) <= 1 / len(ds)
