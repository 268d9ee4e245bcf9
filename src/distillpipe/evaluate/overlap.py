"""The report's table of overlap between splits: per dataset, the leakage report ``prepare`` wrote to its meta.json
(:func:`distillpipe.data.overlap.leakage_report`), carried into each run's metrics by ``evaluate``, so a score on a
dev or test split that shares text with train is read beside how much it shares."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["overlap_section"]


def overlap_section(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown lines: a caption and one table row per dataset and pair of splits ([] when no run has a report)."""
    reports: dict[str, dict] = {}
    for r in results:
        if r.get("leakage"):
            reports.setdefault(r["dataset"], r["leakage"])
    if not reports:
        return []
    some = next((rep for rep in reports.values() if "pairs" in rep), None)
    lines = ["## Overlap between splits", ""]
    if some:
        lines += [f"Rows of the later split whose text (lowercased words and punctuation marks) equals a text of the "
                  f"earlier split, sits inside one (word for word), or shares at least "
                  f"{100 * some['ngram_fraction']:g}% of its {some['ngram']}-word n-grams with it (near duplicates), "
                  f"counted once each in that order, from `data/prepared/<dataset>/meta.json`. A dev or test score "
                  f"over such rows measures recall of training text, not generalisation; ⚠ marks more than "
                  f"{100 * some['warn_fraction']:g}% of a split (prepare warned about it).", ""]
    lines += ["| dataset | splits | rows | equal | inside | near | example |", "|---|---|---|---|---|---|---|"]
    for ds, rep in reports.items():
        if "pairs" not in rep:
            lines.append(f"| {ds} | | | | | | not measured: {rep.get('skipped', '?')} |")
            continue
        for p in rep["pairs"]:
            a, b = p["splits"]
            leaked = p["exact"] + p["inside"] + p["ngram"]
            flag = " ⚠" if p["rows"] and leaked > rep["warn_fraction"] * p["rows"] else ""
            ex = p["example"]
            example = f"{ex['kind']}: {_cell(ex['text'])} in {_cell(ex['overlaps'])}" if ex else ""
            lines.append(f"| {ds} | {a} → {b}{flag} | {p['rows']:,} | {p['exact']:,} | {p['inside']:,} | "
                         f"{p['ngram']:,} | {example} |")
    return lines


def _cell(text: str, limit: int = 60) -> str:
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return "“" + text.replace("|", "\\|") + "”"
