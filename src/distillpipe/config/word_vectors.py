"""The ``word_vectors`` section: the fixed, open-vocabulary word embedding that ELMo-C students read as
input and predict as output (ELMo-C paper sec. 3.2), as a table over the teacher tokenizer's vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.config.base import ConfigError


@dataclass(frozen=True)
class TrainedVectorsConfig:
    """gensim FastText (skip-gram with character n-grams) trained on the words of a prepared corpus's train
    split (stage ``word_vectors@<name>``): the embedded stand-in for the paper's FastText_CC."""

    corpus: str
    """Prepared dataset whose train split's ``text`` is the training text (``data/prepared/<corpus>``)."""
    dim: int
    """Vector size (paper: 300, FastText_CC)."""
    epochs: int
    window: int
    min_count: int
    """Words seen fewer times get no own vector (their n-grams still give them one)."""
    min_n: int
    """Shortest character n-gram (FastText: 3)."""
    max_n: int
    """Longest character n-gram (FastText: 6)."""
    seed: int
    center: bool
    """Subtract the mean vector of the (non-special) rows. FastText vectors share a large common direction
    (trained here on the embedded corpus: mean pairwise cosine 0.84, 0.02 centred), which lets a cosine loss
    reach ~0.9 by predicting the mean and makes every nearest neighbour the same hub word."""

    def __post_init__(self) -> None:
        if min(self.dim, self.epochs, self.window, self.min_count, self.min_n) < 1 or self.max_n < self.min_n:
            raise ConfigError("word_vectors: need dim, epochs, window, min_count, min_n >= 1 and max_n >= min_n")


@dataclass(frozen=True)
class LocalVectorsConfig:
    """A FastText binary on this disk (Facebook's format, e.g. ``cc.en.300.bin`` from fasttext.cc), read with
    ``gensim.models.fasttext.load_facebook_vectors`` (stage ``word_vectors_local@<name>``, which depends on
    the file, so a changed byte in it re-runs the tables and the students that read them)."""

    path: str
    """The ``.bin`` file (absolute or relative to the repository root)."""
    center: bool
    """Subtract the mean vector of the (non-special) rows. FastText vectors share a large common direction
    (trained here on the embedded corpus: mean pairwise cosine 0.84, 0.02 centred), which lets a cosine loss
    reach ~0.9 by predicting the mean and makes every nearest neighbour the same hub word."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("word_vectors.local: path must name a FastText .bin file")


@dataclass(frozen=True)
class WordVectorsConfig:
    tables: dict[str, TrainedVectorsConfig]
    """Tables trained here (``models/word_vectors/<name>``)."""
    local: dict[str, LocalVectorsConfig]
    """Tables from a local FastText binary (``models/word_vectors/<name>``)."""

    def __post_init__(self) -> None:
        both = sorted(set(self.tables) & set(self.local))
        if both:
            raise ConfigError(f"{both} named under both word_vectors.tables and word_vectors.local")
