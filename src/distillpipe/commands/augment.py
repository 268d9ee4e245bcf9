"""``distillpipe augment``: the ``augment`` stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import ParamsOpt, entry_point, user_errors
from distillpipe.config.augment import AugmentConfig
from distillpipe.config.base import load_section
from distillpipe.qg.augment import augment as run_augment
from distillpipe.scale.machine import load_machine


@user_errors
def augment(name: Annotated[str, typer.Option(help="name of the augmented dataset (its meta.json and row ids)")],
            corpus: Annotated[Path, typer.Option(help="prepared corpus to take paragraphs from")],
            qg: Annotated[Path, typer.Option(help="question generator (qg_finetune's output)")],
            out: Annotated[Path, typer.Option(help="output folder: an unlabeled prepared QA dataset")],
            chunks: Annotated[Path, typer.Option(help="chunk folder (resume: auto; cleared on success)")],
            exclude: Annotated[Path | None, typer.Option(help="prepared QA set whose contexts (and articles of "
                                                         "augment.exclude_article_splits) are left out")] = None,
            params: ParamsOpt = Path("params.yaml")) -> None:
    """Generate questions for unlabeled paragraphs (chunked, resumable) into a prepared QA dataset.

    Where the chunks are generated (this process or a dask cluster) is a machine setting: machine.yaml or
    DISTILLPIPE_CLUSTER / DISTILLPIPE_WORKERS / DISTILLPIPE_SCHEDULER (docs/scaling-out.md)."""
    summary = run_augment(name, corpus, exclude, qg, load_section(params, "augment", AugmentConfig), out, chunks,
                          cluster=load_machine().cluster)
    typer.echo(summary.one_line())


main = entry_point(augment, "augment")
