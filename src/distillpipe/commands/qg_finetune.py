"""``distillpipe qg-finetune``: the ``qg_finetune`` stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import CheckpointsOpt, ParamsOpt, entry_point, user_errors
from distillpipe.config.base import load_section
from distillpipe.config.qg_finetune import QgFinetuneConfig
from distillpipe.qg.finetune import finetune_qg


@user_errors
def qg_finetune(prepared: Annotated[Path, typer.Option(help="prepared QA set (its answerable train/dev rows)")],
                out: Annotated[Path, typer.Option(help="output model folder (models/qg)")],
                checkpoints: CheckpointsOpt,
                metrics: Annotated[Path, typer.Option(help="dev metrics JSON to write")],
                params: ParamsOpt = Path("params.yaml")) -> None:
    """Fine-tune T5 for question generation (context -> question); resumes from its checkpoints."""
    summary = finetune_qg(prepared, load_section(params, "qg_finetune", QgFinetuneConfig), out, checkpoints, metrics)
    typer.echo(summary.one_line())


main = entry_point(qg_finetune, "qg-finetune")
