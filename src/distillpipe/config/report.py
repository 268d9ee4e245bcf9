"""The ``report`` section: the tables of ``reports/results.md``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReportTableConfig:
    title: str
    caption: str
    runs: list[str]
    paper: dict[str, str] | None
    """The paper's number for each run, shown beside ours (e.g. WaLDORf Table 4 EM)."""
    metric: str | None
    """The metric shown (e.g. ``exact`` for EM); null = each run's primary metric."""


@dataclass(frozen=True)
class ReportConfig:
    tables: list[ReportTableConfig]
