"""gensim's bundled English Wikipedia sample: page extraction and markup clean-up into paragraphs,
the ``wiki`` MLM corpus and the ``wiki_pairs`` same-article task built on it.

Every dataset derived from the sample is split by ARTICLE, by one partition of the articles shared by all of
them (``prepare.wiki_articles``, :func:`article_split`): no article's text is in two splits of a dataset,
nor in the training split of one dataset and the dev/test split of another (a transductive leak: the MLM corpus
would teach the student the very paragraphs its tasks are scored on).
"""

from __future__ import annotations

import bz2
import functools
import logging
import random
import re
from dataclasses import dataclass

from tqdm import tqdm

from distillpipe.config.prepare import ArticleSplitConfig, EmbeddedWikiConfig, EmbeddedWikiPairsConfig, SplitFractions
from distillpipe.data.features import rows_to_dataset
from distillpipe.data.sources.base import Prepared, PrepareError, Skips, split_names, split_units
from distillpipe.data.sources.embedded import gensim_test_file

logger = logging.getLogger(__name__)

WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
PAIR_LABELS = ["different", "same"]

# Sections that hold lists of sources and links rather than prose.
REFERENCE_SECTIONS = {
    "see also", "references", "notes", "bibliography", "further reading", "external links", "sources",
    "citations", "footnotes", "notes and references", "references and notes", "works cited",
}
_HEADING = re.compile(r"^\s*(=+)\s*(.*?)\s*\1\s*$")
_LIST_ITEM = re.compile(r"^\s*[*#:;]+\s*")
# Table rows/cells, template braces and image captions (``File:x.jpg|caption``, ``caption|thumb``)
# that filter_wiki lets through; a "|" is almost never prose.
_MARKUP_LINE = re.compile(r"^\s*(\{\||\|\}|!|\{\{|\}\})|\|")
_BOLD_ITALIC = re.compile(r"'{2,}")
_EMPTY_PARENS = re.compile(r"\(\s*[,;:]?\s*\)")  # what a removed pronunciation/convert template leaves
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:])(?=\s|$)")


@dataclass(frozen=True)
class Article:
    title: str
    paragraphs: tuple[str, ...]


@functools.lru_cache(maxsize=1)
def _filtered_pages() -> tuple[tuple[tuple[str, str], ...], int]:
    """(title, text after gensim's filter_wiki) per non-redirect page, and the number of redirects.

    Cached because wiki, wiki_pairs and wiki_qa all start from it and filter_wiki takes seconds.
    """
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    path = gensim_test_file(WIKI_FILE)
    pages, redirects = [], 0
    with bz2.open(path, "rb") as f:
        for title, text, _pageid in tqdm(extract_pages(f), desc="wiki pages", unit="page", disable=None, leave=False):
            if text.lstrip()[:9].upper() == "#REDIRECT":
                redirects += 1
                continue
            pages.append((title, filter_wiki(text)))
    if not pages:
        raise PrepareError(f"{path}: no article pages found; reinstall gensim (pip install --force-reinstall gensim)")
    return tuple(pages), redirects


def _clean_inline(text: str) -> str:
    text = _BOLD_ITALIC.sub("", text)
    text = _EMPTY_PARENS.sub("", text)
    text = " ".join(text.split())
    return _SPACE_BEFORE_PUNCT.sub(r"\1", text)


def clean_paragraphs(text: str, skips: Skips) -> list[str]:
    """Paragraphs of one filtered article, before any length filter.

    In wikitext a paragraph is one line, and filter_wiki leaves image captions as lines glued to
    the next paragraph, so every non-blank line is a paragraph (splitting on blank lines alone
    would prefix paragraphs with captions). Headings are dropped (counted); reference sections
    (See also, References, External links...) are dropped with their content (lines counted);
    lines with table/image markup left over (``|``, ``{|``, ``File:x.jpg|caption``) are dropped
    (counted); list markers, bold/italic quotes, empty parentheses and runs of whitespace are removed.
    """
    paragraphs: list[str] = []
    in_references = False
    for line in text.split("\n"):
        if not line.strip():
            continue
        heading = _HEADING.match(line)
        if heading:
            skips.add("heading lines")
            in_references = heading.group(2).strip().lower() in REFERENCE_SECTIONS
        elif in_references:
            skips.add("reference-section lines")
        elif _MARKUP_LINE.search(line):
            skips.add("table/image markup lines")
        else:
            paragraph = _clean_inline(_LIST_ITEM.sub("", line))
            if paragraph:
                paragraphs.append(paragraph)
    return paragraphs


def wiki_articles(min_paragraph_chars: int, skips: Skips) -> list[Article]:
    """The sample's articles (in file order) with their cleaned paragraphs of >= ``min_paragraph_chars``.

    Redirect pages, short paragraphs and articles left without paragraphs are counted in ``skips``.
    """
    pages, redirects = _filtered_pages()
    skips.add("redirect pages", redirects)
    articles = []
    for title, text in pages:
        paragraphs = clean_paragraphs(text, skips)
        kept = tuple(p for p in paragraphs if len(p) >= min_paragraph_chars)
        skips.add("short paragraphs", len(paragraphs) - len(kept))
        if kept:
            articles.append(Article(title, kept))
        else:
            skips.add("articles without paragraphs")
    return articles


def article_split(title: str, partition: ArticleSplitConfig) -> str:
    """``train``, ``dev`` or ``test``: where ``partition`` puts the sample's article ``title``. The partition is drawn
    once over every article page of the sample (a seeded shuffle of the sorted titles, exact fractions), before any
    dataset drops articles by its own filters: each dataset built from the sample puts an article in the same
    split."""
    splits = _partition(partition.splits.dev, partition.splits.test, partition.seed)
    if title not in splits:
        raise KeyError(f"{title!r} is not an article of the Wikipedia sample")  # programming error
    return splits[title]


@functools.lru_cache(maxsize=4)
def _partition(dev: float, test: float, seed: int) -> dict[str, str]:
    titles = sorted(title for title, _ in _filtered_pages()[0])
    parts = split_units(titles, SplitFractions(dev, test), seed, "article pages", "prepare.wiki_articles")
    return {t: split for split, ts in parts.items() for t in ts}


def split_articles(articles: list[Article], partition: ArticleSplitConfig) -> dict[str, list[Article]]:
    """The articles of each split, in sample order (see :func:`article_split`); refuses an empty split."""
    names = split_names(partition.splits)
    out: dict[str, list[Article]] = {name: [] for name in names}
    for a in articles:
        out[article_split(a.title, partition)].append(a)
    empty = [name for name in names if not out[name]]
    if empty:
        raise PrepareError(f"prepare.wiki_articles: the {len(articles)} articles kept leave {empty} empty with "
                           f"dev={partition.splits.dev}, test={partition.splits.test}; raise those fractions")
    return out


def build_wiki(name: str, cfg: EmbeddedWikiConfig, partition: ArticleSplitConfig) -> Prepared:
    """MLM corpus: one row per paragraph (doc_id = article title), split by article."""
    skips = Skips()
    parts = split_articles(wiki_articles(cfg.min_paragraph_chars, skips), partition)
    splits = {
        split: rows_to_dataset([{"doc_id": a.title, "text": p} for a in arts for p in a.paragraphs], "corpus", ["text"])
        for split, arts in parts.items()
    }
    return Prepared(splits, "corpus", [], ["text"], skips)


def _pairs_for_split(split: str, articles: list[Article], per_article: int, rng: random.Random,
                     skips: Skips) -> list[dict]:
    """Balanced same/different-article paragraph pairs drawn within one split's articles."""
    if len(articles) < 2:
        raise PrepareError(
            f"split {split!r} has {len(articles)} article(s); negative pairs need two. "
            "Raise this split's fraction in params.yaml."
        )
    pairs: list[tuple[str, str, int]] = []
    for i, article in enumerate(articles):
        n = len(article.paragraphs)
        possible = n * (n - 1) // 2
        if possible == 0:
            skips.add("articles with one paragraph (no same-article pair)")
            continue
        if possible < per_article:
            skips.add("pairs short of pairs_per_article (article too small)", per_article - possible)
        # Sample pair ranks without enumerating all pairs; rank r -> (a, b) with a < b.
        for r in sorted(rng.sample(range(possible), min(per_article, possible))):
            a, b = _unrank_pair(r, n)
            pairs.append((article.paragraphs[a], article.paragraphs[b], 1))
            other = rng.choice([j for j in range(len(articles)) if j != i])
            pairs.append((rng.choice(article.paragraphs), rng.choice(articles[other].paragraphs), 0))
    rng.shuffle(pairs)
    rows = []
    for k, (a, b, label) in enumerate(pairs):
        if rng.random() < 0.5:  # neither side position gives the label away
            a, b = b, a
        rows.append({"id": f"{split}-{k}", "text_a": a, "text_b": b, "label": label})
    return rows


def _unrank_pair(rank: int, n: int) -> tuple[int, int]:
    """The ``rank``-th pair (a, b), a < b < n, in lexicographic order."""
    a = 0
    while rank >= n - 1 - a:
        rank -= n - 1 - a
        a += 1
    return a, a + 1 + rank


def rows_by_article_split(key: str, cfg, partition: ArticleSplitConfig, skips: Skips,
                          make_rows) -> dict[str, list[dict]]:
    """Split the sample's articles first (``partition``), then build each split's rows with
    ``make_rows(split, articles, rng)`` (``rng`` seeded by ``cfg.seed``), so no article is in two splits."""
    parts = split_articles(wiki_articles(cfg.min_paragraph_chars, skips), partition)
    out = {}
    for index, (split, arts) in enumerate(parts.items()):
        try:
            out[split] = make_rows(split, arts, random.Random(f"{cfg.seed}-{index}"))
        except PrepareError as e:
            raise PrepareError(f"{key}: {e}") from None
    return out


def build_wiki_pairs(name: str, cfg: EmbeddedWikiPairsConfig, partition: ArticleSplitConfig) -> Prepared:
    """Pair classification: are two paragraphs from the same article? (Split by article.)"""
    skips = Skips()
    text_fields = ["text_a", "text_b"]
    rows = rows_by_article_split(f"prepare.datasets.{name}", cfg, partition, skips, lambda split, arts, rng:
                                 _pairs_for_split(split, arts, cfg.pairs_per_article, rng, skips))
    splits = {split: rows_to_dataset(r, "classification", text_fields) for split, r in rows.items()}
    return Prepared(splits, "classification", list(PAIR_LABELS), text_fields, skips)
