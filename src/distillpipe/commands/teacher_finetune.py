"""``distillpipe teacher-finetune``: the ``teacher_finetune`` stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import CheckpointsOpt, LiveOpt, ParamsOpt, entry_point, named_entry, user_errors
from distillpipe.config.base import load_section
from distillpipe.config.teacher_finetune import TeacherFinetuneConfig
from distillpipe.train.teacher_finetune import finetune_teacher


@user_errors
def teacher_finetune(task: Annotated[str, typer.Option(help="a key of teacher_finetune.tasks")],
                     base: Annotated[Path, typer.Option(help="base teacher folder")],
                     tokens: Annotated[Path, typer.Option(help="tokenized task folder")],
                     prepared: Annotated[Path, typer.Option(help="prepared task folder (QA contexts for dev EM/F1)")],
                     out: Annotated[Path, typer.Option(help="output model folder")],
                     checkpoints: CheckpointsOpt,
                     live: LiveOpt,
                     params: ParamsOpt = Path("params.yaml")) -> None:
    """Fine-tune the teacher on a task; resumes from its checkpoints; writes the model and dev metrics."""
    cfg = load_section(params, "teacher_finetune", TeacherFinetuneConfig)
    tcfg = named_entry(cfg, task, params, "teacher_finetune", "tasks")
    summary = finetune_teacher(task, base, tokens, prepared, tcfg, cfg.device, out, checkpoints, live)
    typer.echo(summary.one_line())


main = entry_point(teacher_finetune, "teacher-finetune")
