"""``distillpipe tokenize``: the ``tokenize`` stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import DatasetOpt, ParamsOpt, entry_point, named_entry, user_errors
from distillpipe.config.base import load_section
from distillpipe.config.tokenize import TokenizeConfig
from distillpipe.data.tokenize import tokenize_dataset


@user_errors
def tokenize(dataset: DatasetOpt,
             prepared: Annotated[Path, typer.Option(help="prepared dataset folder")],
             out: Annotated[Path, typer.Option(help="output folder")],
             params: ParamsOpt = Path("params.yaml")) -> None:
    """Tokenize a prepared dataset with the teacher's tokenizer into data/tokens/<dataset>/."""
    cfg = load_section(params, "tokenize", TokenizeConfig)
    named_entry(cfg, dataset, params, "tokenize", "datasets")
    summary = tokenize_dataset(dataset, prepared, cfg, out)
    typer.echo(summary.one_line())


main = entry_point(tokenize, "tokenize")
