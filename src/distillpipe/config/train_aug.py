"""The ``train_aug`` section: ``train`` runs with augmented, unlabeled rows mixed in."""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.config.run import LoaderConfig
from distillpipe.config.train import ScratchRunConfig


@dataclass(frozen=True)
class TrainAugRunConfig(ScratchRunConfig):
    """A ``train`` run (random initialisation) on ``dataset`` plus unlabeled augmented rows mixed in
    (WaLDORf sec. 3.4): both have their own teacher cache, so nothing is computed twice."""

    augment: str
    """The augmented dataset (augment's output): ``data/tokens/<augment>``, ``data/teacher/<augment>.zarr``.
    Its batches are interleaved with the dataset's, in proportion to their sizes; only teacher losses apply."""


@dataclass(frozen=True)
class TrainAugConfig:
    device: str
    loader: LoaderConfig
    runs: dict[str, TrainAugRunConfig]
