"""The ``report`` section: the tables of ``reports/results.md`` and how their intervals are drawn."""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.config.base import ConfigError


@dataclass(frozen=True)
class ReportTableConfig:
    title: str
    caption: str
    runs: list[str]
    paper: dict[str, str] | None
    """The paper's number for each run, shown beside ours (e.g. WaLDORf Table 4 EM)."""
    metric: str | None
    """The metric shown (e.g. ``exact`` for EM); null = each run's primary metric."""
    compare: list[list[str]]
    """Pairs ``[a, b]`` of this table's runs: the report shows ``a - b`` on the same examples, with its
    interval and a paired test (McNemar for accuracy, paired bootstrap otherwise)."""

    def __post_init__(self) -> None:
        bad = [p for p in self.compare if len(p) != 2 or p[0] == p[1] or not set(p) <= set(self.runs)]
        if bad:
            raise ConfigError(f"report table {self.title!r}: compare entries must be pairs of two different runs "
                              f"of the table, got {bad}")


@dataclass(frozen=True)
class BootstrapConfig:
    n_resamples: int
    """Resamples per interval (BCa needs >= ~1,000 for stable 95% limits)."""
    confidence: float
    seed: int

    def __post_init__(self) -> None:
        if self.n_resamples < 100 or not 0 < self.confidence < 1:
            raise ConfigError("report.bootstrap: need n_resamples >= 100 and 0 < confidence < 1")


@dataclass(frozen=True)
class ReportConfig:
    bootstrap: BootstrapConfig
    tables: list[ReportTableConfig]
