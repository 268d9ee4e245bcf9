"""The ``train_lm`` section: language-model students (ELMo-C and its baselines) that read a word-vector
table (``word_vectors``' output) besides their tokens."""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.config.run import LoaderConfig
from distillpipe.config.train import ScratchRunConfig


@dataclass(frozen=True)
class TrainLMRunConfig(ScratchRunConfig):
    """A ``train`` run (random initialisation) whose student takes a fixed word-vector table as its input layer
    (and, for ELMo-C, as its output targets, paper eq. 2). The table is copied into the student, so the
    trained student needs nothing else."""

    word_vectors: str
    """The table (``models/word_vectors/<word_vectors>``, a key of ``word_vectors.tables`` or ``.local``);
    its digest is part of the run's identity."""


@dataclass(frozen=True)
class TrainLMConfig:
    device: str
    loader: LoaderConfig
    runs: dict[str, TrainLMRunConfig]
