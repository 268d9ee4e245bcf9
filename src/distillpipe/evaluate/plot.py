"""The report's speed-vs-quality PNG: one panel per dataset, x = sentences/s (log), y = the primary metric on
test (dev for a run whose dataset has no test split, marked "(dev)" in the legend), one marker per run and per
teacher, named in a legend under the panel (labels beside the points overlap as soon as two runs are alike).
Drawn on a matplotlib Agg canvas (no pyplot state) without a version string in the file, so the same rows give
the same bytes."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEACHER_PREFIX = "teacher:"


@dataclass(frozen=True)
class Point:
    dataset: str
    label: str
    sentences_per_s: float
    score: float
    split: str


def compact(v: float, _pos: object = None) -> str:
    """Axis label of a tick value: 50, 200, 1k, 20k, 1.5M."""
    if v <= 0:
        return ""
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:g}"


def points(rows: Sequence[Any], score: Callable[[Any], tuple[float, str] | None]) -> list[Point]:
    """The plotted points: rows with a speed and a score; ``score(row)`` gives (percent, split)."""
    out = []
    for row in rows:
        got = score(row)
        if got is None or row.sentences_per_s is None or row.sentences_per_s <= 0:
            continue
        name = f"teacher {row.model}" if row.run.startswith(TEACHER_PREFIX) else row.run
        value, split = got
        out.append(Point(row.dataset, name + ("" if split == "test" else f" ({split})"), float(row.sentences_per_s),
                         float(value), split))
    return out


def plot_speed_quality(rows: Sequence[Any], score: Callable[[Any], tuple[float, str] | None],
                       out_png: Path) -> list[Point]:
    """``rows``: the report's rows (``run``, ``model``, ``dataset``, ``primary_metric``, ``sentences_per_s``);
    ``score(row)``: (the y value in percent, the split it is from), None when the row has none. Returns the
    points drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    drawn = points(rows, score)
    datasets = list(dict.fromkeys(r.dataset for r in rows)) or ["(no runs)"]
    ncols = min(3, len(datasets))
    nrows = -(-len(datasets) // ncols)
    most = max([sum(p.dataset == ds for p in drawn) for ds in datasets] + [1])
    panel_h = 3.6 + 0.2 * most  # room for the legend under each panel
    fig = Figure(figsize=(5.0 * ncols, panel_h * nrows), dpi=100)
    FigureCanvasAgg(fig)
    colors = [f"C{i}" for i in range(10) if i != 3]  # C3 (red) is the teachers'
    for i, ds in enumerate(datasets):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        pts = [p for p in drawn if p.dataset == ds]
        metric = next((r.primary_metric for r in rows if r.dataset == ds), "")
        students = 0
        for p in pts:
            teacher = p.label.startswith("teacher ")
            color = "C3" if teacher else colors[students % len(colors)]
            marker = "*" if teacher else "osD^vP"[students // len(colors) % 6]
            students += not teacher
            ax.scatter([p.sentences_per_s], [p.score], marker=marker, s=150 if teacher else 45, color=color,
                       label=p.label, zorder=3, alpha=0.85)
        if pts:
            xs = [p.sentences_per_s for p in pts]
            decades = math.log10(max(xs) / min(xs)) if min(xs) > 0 else 0.0
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10))
            ax.xaxis.set_major_formatter(FuncFormatter(compact))
            if decades < 1.5:  # a narrow range: label 2 and 5 too, else the axis may show no number at all
                ax.xaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
                ax.xaxis.set_minor_formatter(FuncFormatter(compact))
            else:
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.margins(x=0.15, y=0.15)
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, fontsize=8, frameon=False)
        else:
            ax.text(0.5, 0.5, "no run with speed and a score", ha="center", va="center", transform=ax.transAxes)
        splits = {p.split for p in pts}
        ax.set_title(ds)
        ax.set_xlabel("sentences / s (log scale)")
        ax.set_ylabel(f"test {metric} (%)" if splits <= {"test"} else f"{metric} (%): test, or as marked")
        ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, format="png", metadata={"Software": None})  # no version string: stable bytes
    return drawn
