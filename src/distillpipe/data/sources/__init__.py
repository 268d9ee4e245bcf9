"""Where prepared datasets come from: embedded assets (gensim's test data), local files (GLUE
TSV, SQuAD JSON, text/JSONL corpora) and the Hugging Face hub. Each builder turns one
``prepare.datasets.<name>`` / ``prepare.local.<name>`` config into a :class:`Prepared` (splits in the schema of
``distillpipe.data.schema`` plus what ``meta.json`` says about them)."""

from __future__ import annotations

from collections.abc import Callable

from distillpipe.config.prepare import (
    WIKI_DERIVED,
    AnyDatasetConfig,
    ArticleSplitConfig,
    EmbeddedPolarityConfig,
    EmbeddedWikiConfig,
    EmbeddedWikiPairsConfig,
    EmbeddedWikiQAConfig,
    HubConfig,
    LocalGlueConfig,
    LocalSquadConfig,
    LocalTextConfig,
)
from distillpipe.data.sources.base import Prepared, PrepareError, Skips
from distillpipe.data.sources.carve import carve_splits
from distillpipe.data.sources.embedded import build_polarity
from distillpipe.data.sources.glue import build_glue
from distillpipe.data.sources.hub import build_hub
from distillpipe.data.sources.squad import build_squad
from distillpipe.data.sources.text import build_text
from distillpipe.data.sources.wiki import build_wiki, build_wiki_pairs
from distillpipe.data.sources.wiki_qa import build_wiki_qa

BUILDERS: dict[type, Callable[..., Prepared]] = {
    EmbeddedWikiConfig: build_wiki,
    EmbeddedPolarityConfig: build_polarity,
    EmbeddedWikiPairsConfig: build_wiki_pairs,
    EmbeddedWikiQAConfig: build_wiki_qa,
    LocalGlueConfig: build_glue,
    LocalSquadConfig: build_squad,
    LocalTextConfig: build_text,
    HubConfig: build_hub,
}


CARVABLE = (LocalGlueConfig, LocalSquadConfig, LocalTextConfig, HubConfig)
"""Sources that may carve dev/test from train (embedded assets have their own fixed splits)."""


def build_source(name: str, cfg: AnyDatasetConfig, wiki_articles: ArticleSplitConfig | None = None) -> Prepared:
    """Build the splits of dataset ``name`` from its config (dispatch on the config type), carving dev/test from
    train when the config says so; a dataset built from the Wikipedia sample needs the shared article partition
    ``wiki_articles``."""
    builder = BUILDERS.get(type(cfg))
    if builder is None:
        raise TypeError(f"no source builder for {type(cfg).__name__}")  # programming error
    if isinstance(cfg, WIKI_DERIVED):
        if wiki_articles is None:
            raise TypeError(f"{name}: a dataset of the Wikipedia sample needs the article partition")
        return builder(name, cfg, wiki_articles)
    prepared = builder(name, cfg)
    if isinstance(cfg, CARVABLE) and cfg.carve is not None:
        prepared = carve_splits(name, prepared, cfg.carve)
    return prepared


__all__ = ["BUILDERS", "PrepareError", "Prepared", "Skips", "build_source"]
