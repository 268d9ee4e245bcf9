"""``distillpipe prepare``: the ``prepare`` and ``prepare_local`` stages."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import DatasetOpt, ParamsOpt, entry_point, user_errors
from distillpipe.config.base import load_section
from distillpipe.config.prepare import PrepareConfig
from distillpipe.data.prepare import prepare_dataset


@user_errors
def prepare(dataset: DatasetOpt, out: Annotated[Path, typer.Option(help="output folder")],
            params: ParamsOpt = Path("params.yaml")) -> None:
    """Read a dataset from its source (embedded, local files, hub) into data/prepared/<dataset>/."""
    cfg = load_section(params, "prepare", PrepareConfig)
    summary = prepare_dataset(dataset, cfg.dataset(dataset), out, cfg.wiki_articles)
    typer.echo(summary.one_line())
    if summary.overlap_line():
        typer.echo(summary.overlap_line())


main = entry_point(prepare, "prepare")
