"""The ``prepare`` section: where each dataset comes from (embedded assets, the hub, your files)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal, Union

from distillpipe.config.base import ConfigError


@dataclass(frozen=True)
class SplitFractions:
    dev: float
    """Fraction of the unit of splitting (article, sentence) that goes to ``dev``."""
    test: float
    """Fraction that goes to ``test``; the rest is ``train``."""

    def __post_init__(self) -> None:
        if not (0 <= self.dev < 1 and 0 <= self.test < 1 and self.dev + self.test < 1):
            raise ConfigError(f"split fractions dev={self.dev}, test={self.test} must be >= 0 and sum to < 1")


@dataclass(frozen=True)
class CarveConfig:
    """Carve ``dev`` (and ``test``) out of ``train`` by a seeded fraction of groups: rows that share a group
    (a SQuAD article title; a GLUE sentence, with pairs joined when they share either sentence; a corpus
    document) all land in one split, so no dev or test row shares its group with a train row.

    ``dev`` selects models (early stopping, the QA no-answer threshold); ``test`` is what the report shows.
    The usual recipe for GLUE or SQuAD, whose official test labels are not public: carve ``dev`` from train and
    give the official dev file as ``test``."""

    dev: float
    """Fraction of train's groups moved to ``dev`` (0: none, e.g. when a dev file is given)."""
    test: float
    """Fraction of train's groups moved to ``test`` (0: none)."""
    seed: int

    def __post_init__(self) -> None:
        if not (0 <= self.dev < 1 and 0 <= self.test < 1 and 0 < self.dev + self.test < 1):
            raise ConfigError(f"carve: dev={self.dev}, test={self.test} must be >= 0, not both 0, and sum to < 1")


def _check_carve(carve: CarveConfig | None, splits: dict[str, str], what: str) -> None:
    """A split comes from one place: a file (or hub split) or the carve, never both; and no two of our splits read
    the same file (the same rows would select the model and be reported)."""
    seen: dict[str, str] = {}
    for split, src in splits.items():
        if src in seen:
            raise ConfigError(f"{what}: splits {seen[src]!r} and {split!r} both read {src!r}: the same rows would "
                              "select the model (dev) and be reported (test). Carve dev from train instead "
                              "(carve: {dev: 0.1, test: 0.0, seed: 0}) and keep the file as test")
        seen[src] = split
    if carve is None:
        return
    if "train" not in splits:
        raise ConfigError(f"{what}: carve needs a train split to carve from")
    for split in ("dev", "test"):
        if getattr(carve, split) > 0 and split in splits:
            raise ConfigError(f"{what}: {split} is given ({splits[split]!r}) and carved from train "
                              f"(carve.{split}={getattr(carve, split)}): keep one (set carve.{split}: 0, or drop "
                              f"{split} from the files)")


@dataclass(frozen=True)
class ArticleSplitConfig:
    """The one partition of the Wikipedia sample's articles into train/dev/test, shared by every dataset built
    from it (``wiki``, ``wiki_pairs``, ``wiki_qa``; augment reads the corpus's train split). It is drawn once over
    all the sample's article pages (``seed``), so an article is in the same split in every dataset, whichever
    articles each keeps: no dev or test paragraph of a task is in a corpus a student or the QG model trains on."""

    splits: SplitFractions
    seed: int


@dataclass(frozen=True)
class EmbeddedWikiConfig:
    """gensim's bundled English Wikipedia sample as an MLM corpus, split by article (``prepare.wiki_articles``)."""

    source: Literal["embedded"]
    asset: Literal["wiki"]
    min_paragraph_chars: int
    """Paragraphs shorter than this (after markup removal) are dropped and counted."""


@dataclass(frozen=True)
class EmbeddedPolarityConfig:
    """gensim's 200 Pang & Lee polarity sentences (fastText ``__label__`` format)."""

    source: Literal["embedded"]
    asset: Literal["polarity"]
    encoding: str
    """The file is cp1252; another value shows what happens with the wrong one."""
    splits: SplitFractions
    seed: int


@dataclass(frozen=True)
class EmbeddedWikiPairsConfig:
    """Paragraph pairs from the Wikipedia sample: same article or not (balanced), split by article
    (``prepare.wiki_articles``)."""

    source: Literal["embedded"]
    asset: Literal["wiki_pairs"]
    min_paragraph_chars: int
    pairs_per_article: int
    """Positive pairs drawn per article; as many negatives are drawn."""
    seed: int
    """Seeds the drawing of pairs (not the article split)."""


@dataclass(frozen=True)
class EmbeddedWikiQAConfig:
    """SQuAD-v2-format cloze QA built from the Wikipedia sample, split by article (``prepare.wiki_articles``)."""

    source: Literal["embedded"]
    asset: Literal["wiki_qa"]
    min_paragraph_chars: int
    questions_per_paragraph: int
    max_context_chars: int | None
    """Crop each context to whole sentences around the question's, at most this many characters (a longer
    question sentence is kept whole); null: the whole paragraph. Sized so a question and its context fit one
    tokenizer window (``data/sources/wiki_qa.py`` says why)."""
    unanswerable_fraction: float
    """Fraction of questions made unanswerable by pairing them with a paragraph of another article."""
    seed: int
    """Seeds the choice of questions and of unanswerable pairings (not the article split)."""

    def __post_init__(self) -> None:
        if self.max_context_chars is not None and self.max_context_chars <= 0:
            raise ConfigError(f"max_context_chars={self.max_context_chars} must be positive (null: whole paragraphs)")
        if not 0 <= self.unanswerable_fraction < 1:
            raise ConfigError(f"unanswerable_fraction={self.unanswerable_fraction} must be in [0, 1)")


GlueTask = Literal["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]


def _check_local_files(path: str, files: dict[str, str]) -> None:
    """A local dataset's files are named relative to its folder and lie inside it: the folder is the DVC
    dependency, so a file outside it would change without DVC noticing."""
    if not path:
        raise ConfigError("path must name the folder that holds the dataset's files")
    if not files:
        raise ConfigError("files is empty; give at least `train: <file in path>`")
    for split, name in files.items():
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if not parts or name.startswith(("/", "~")) or ".." in parts:
            raise ConfigError(f"files.{split}={name!r} must be a file name relative to path ({path}), inside it: "
                              "the folder is what DVC watches for changes")


@dataclass(frozen=True)
class LocalGlueConfig:
    """A GLUE task from its original TSV files."""

    format: Literal["glue"]
    task: GlueTask
    path: str
    """The folder holding the files (``data/raw/SST-2``, or an absolute path): a DVC dependency of
    ``prepare_local@<name>``, so a change to any file in it re-runs this dataset's chain."""
    files: dict[str, str]
    """split name -> TSV file in ``path`` (MNLI: e.g. ``dev_matched``, ``dev_mismatched``)."""
    encoding: str
    on_bad_rows: Literal["error", "skip"]
    carve: CarveConfig | None
    """Split dev (and test) off train, grouped by sentence (null: the files' splits as they are)."""

    def __post_init__(self) -> None:
        _check_local_files(self.path, self.files)
        _check_carve(self.carve, self.files, f"glue {self.path}")


@dataclass(frozen=True)
class LocalSquadConfig:
    """Extractive QA from SQuAD v1.1 / v2.0 JSON files."""

    format: Literal["squad"]
    path: str
    """The folder holding the files: a DVC dependency of ``prepare_local@<name>``."""
    files: dict[str, str]
    """split name -> JSON file in ``path``."""
    encoding: str
    carve: CarveConfig | None
    """Split dev (and test) off train, grouped by article title (null: the files' splits as they are)."""

    def __post_init__(self) -> None:
        _check_local_files(self.path, self.files)
        _check_carve(self.carve, self.files, f"squad {self.path}")


@dataclass(frozen=True)
class LocalTextConfig:
    """A plain-text corpus: documents separated by blank lines, or a JSONL corpus with a text field."""

    format: Literal["text", "jsonl"]
    path: str
    """The folder holding the files: a DVC dependency of ``prepare_local@<name>``."""
    files: dict[str, str]
    """split name -> file in ``path``."""
    text_field: str
    """JSONL only: the key holding the document text (ignored for ``text``)."""
    encoding: str
    on_bad_rows: Literal["error", "skip"]
    carve: CarveConfig | None
    """Split dev (and test) off train, by document (null: the files' splits as they are)."""

    def __post_init__(self) -> None:
        _check_local_files(self.path, self.files)
        _check_carve(self.carve, self.files, f"{self.format} {self.path}")


@dataclass(frozen=True)
class HubConfig:
    """A dataset from the Hugging Face hub, e.g. ``glue/sst2``, ``squad_v2``, ``wikimedia/wikipedia``."""

    source: Literal["hub"]
    name: str
    """``glue/<task>``, ``squad``/``squad_v2`` or any corpus with a text column."""
    subset: str | None
    """Hub configuration name (``20231101.en`` for wikipedia); null when there is none."""
    revision: str | None
    """The dataset repository's commit sha (or tag) to read; null = its default branch as it is today (the resolved
    commit is recorded in meta.json and a warning asks to pin it, so that a moved hub dataset changes params.yaml,
    which re-runs this dataset's chain, instead of being mixed in by a later run)."""
    splits: dict[str, str]
    """our split -> hub split (``train: train``, ``test: validation``)."""
    text_field: str
    """Corpora only: the column holding the text."""
    carve: CarveConfig | None
    """Split dev (and test) off train, grouped as for local files (null: the hub splits as they are). GLUE's hub
    test splits carry no labels: carve dev from train and map the hub's validation to ``test``."""

    def __post_init__(self) -> None:
        _check_carve(self.carve, self.splits, f"hub {self.name}")


PrepareDatasetConfig = Union[
    EmbeddedWikiConfig,
    EmbeddedPolarityConfig,
    EmbeddedWikiPairsConfig,
    EmbeddedWikiQAConfig,
    HubConfig,
]
"""Datasets that come from a Python package or the hub: nothing on this disk for DVC to watch."""

LocalDatasetConfig = Union[LocalGlueConfig, LocalSquadConfig, LocalTextConfig]
"""Datasets from your files: the folder ``path`` is a DVC dependency."""

AnyDatasetConfig = Union[PrepareDatasetConfig, LocalDatasetConfig]


WIKI_DERIVED = (EmbeddedWikiConfig, EmbeddedWikiPairsConfig, EmbeddedWikiQAConfig)
"""Datasets built from the Wikipedia sample: they share ``prepare.wiki_articles``."""


@dataclass(frozen=True)
class PrepareConfig:
    wiki_articles: ArticleSplitConfig
    """The article partition of every dataset built from the Wikipedia sample."""
    datasets: dict[str, PrepareDatasetConfig]
    """Embedded assets and hub datasets (stage ``prepare@<name>``)."""
    local: dict[str, LocalDatasetConfig]
    """Datasets from local files (stage ``prepare_local@<name>``, which depends on each one's folder)."""

    def __post_init__(self) -> None:
        both = sorted(set(self.datasets) & set(self.local))
        if both:
            raise ConfigError(f"{both} named under both prepare.datasets and prepare.local: a dataset has one source")

    def dataset(self, name: str) -> AnyDatasetConfig:
        """The config of dataset ``name`` from either sub-section."""
        if name in self.datasets:
            return self.datasets[name]
        if name in self.local:
            return self.local[name]
        raise ConfigError(f"prepare has no dataset {name!r}; known: {sorted(self.datasets)} (datasets), "
                          f"{sorted(self.local)} (local)")
