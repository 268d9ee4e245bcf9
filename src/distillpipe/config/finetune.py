"""The ``finetune`` section: students initialised from a ``train`` run's encoder."""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.config.run import LoaderConfig, RunConfig


@dataclass(frozen=True)
class FinetuneRunConfig(RunConfig):
    """A student initialised from a ``train`` run's encoder (CMOW paper: task-specific distillation after
    general distillation), with a fresh task head."""

    init: str
    """The ``train`` run whose encoder (and model config) this run starts from."""


@dataclass(frozen=True)
class FinetuneConfig:
    device: str
    loader: LoaderConfig
    runs: dict[str, FinetuneRunConfig]
