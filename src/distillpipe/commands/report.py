"""``distillpipe report``: the ``report`` stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import ParamsOpt, entry_point, user_errors
from distillpipe.config.base import load_section
from distillpipe.config.report import ReportConfig
from distillpipe.evaluate.report import write_report


@user_errors
def report(metrics: Annotated[Path, typer.Option(help="folder of per-run metrics JSONs (evaluate's outputs)")],
           predictions: Annotated[Path, typer.Option(help="folder of per-run predictions JSONs (evaluate's)")],
           speed: Annotated[Path, typer.Option(help="folder of per-run timings JSONs (the speed stage's outputs)")],
           out: Annotated[Path, typer.Option(help="Markdown report to write")],
           plot: Annotated[Path, typer.Option(help="speed-vs-quality PNG to write")],
           params: ParamsOpt = Path("params.yaml")) -> None:
    """Collect every evaluated run into reports/results.md and a speed-vs-quality plot."""
    typer.echo(write_report(metrics, predictions, speed, load_section(params, "report", ReportConfig), out, plot))


main = entry_point(report, "report")
