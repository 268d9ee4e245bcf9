"""The report's speed-vs-quality PNG: one panel per dataset, x = sentences/s (log), y = primary dev metric,
one labelled marker per run and per teacher. Drawn on a matplotlib Agg canvas (no pyplot state) without a
version string in the file, so the same rows give the same bytes."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

TEACHER_PREFIX = "teacher:"


def _tick_label(v: float, _pos: object, leading: tuple[int, ...] = (1,)) -> str:
    """Plain-number label ("2,000") for log-axis ticks whose leading digit is in ``leading``."""
    if v <= 0 or round(v / 10 ** math.floor(math.log10(v) + 1e-9)) not in leading:
        return ""
    return f"{v:,.0f}" if v >= 1 else f"{v:g}"


def plot_speed_quality(rows: Sequence[Any], dev_score: Callable[[Any], float | None], out_png: Path) -> None:
    """``rows``: the report's rows (``run``, ``model``, ``dataset``, ``primary_metric``, ``sentences_per_s``);
    ``dev_score(row)``: the y value in percent, None when the row has none."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    datasets = list(dict.fromkeys(r.dataset for r in rows)) or ["(no runs)"]
    ncols = min(3, len(datasets))
    nrows = -(-len(datasets) // ncols)
    fig = Figure(figsize=(5.0 * ncols, 4.0 * nrows), dpi=100)
    FigureCanvasAgg(fig)
    for i, ds in enumerate(datasets):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        pts = []
        for row in rows:
            if row.dataset != ds:
                continue
            y = dev_score(row)
            if y is None or row.sentences_per_s is None or row.sentences_per_s <= 0:
                continue
            pts.append((row, row.sentences_per_s, y))
        metric = next((r.primary_metric for r in rows if r.dataset == ds), "")
        for row, x, y in pts:
            teacher = row.run.startswith(TEACHER_PREFIX)
            ax.scatter(
                [x],
                [y],
                marker="*" if teacher else "o",
                s=140 if teacher else 50,
                color="tab:red" if teacher else "tab:blue",
                zorder=3,
            )
            ax.annotate(
                f"teacher {row.model}" if teacher else row.run,
                (x, y),
                textcoords="offset points",
                xytext=(5, 5),
                fontsize=8,
            )
        if pts:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(_tick_label))
            ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: _tick_label(v, _, leading=(2, 5))))
            ax.margins(x=0.3, y=0.15)  # room for the labels at the edges
        else:
            ax.text(0.5, 0.5, "no run with speed and dev metric", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(ds)
        ax.set_xlabel("sentences / s (log scale)")
        ax.set_ylabel(f"dev {metric} (%)")
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, format="png", metadata={"Software": None})  # no version string: stable bytes
