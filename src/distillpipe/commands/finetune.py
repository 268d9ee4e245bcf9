"""``distillpipe finetune``: the ``finetune`` stage (a trained student's encoder, a fresh task head)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import torch
import typer

from distillpipe.commands.base import (
    CheckpointsOpt,
    LiveOpt,
    ParamsOpt,
    PreparedOpt,
    RunOpt,
    StudentOutOpt,
    TeacherOpt,
    TokensOpt,
    entry_point,
    named_entry,
    user_errors,
)
from distillpipe.commands.students import check_dataset, handed_to_torchrun, is_main_process, teacher_source
from distillpipe.config.base import ConfigError, load_section
from distillpipe.config.finetune import FinetuneConfig
from distillpipe.scale.machine import load_machine
from distillpipe.students import load_student
from distillpipe.train.loop import train_student


@user_errors
def finetune(run: RunOpt,
             init: Annotated[Path, typer.Option(help="the trained student (a `train` run) to start from")],
             tokens: TokensOpt,
             teacher: TeacherOpt,
             prepared: PreparedOpt,
             out: StudentOutOpt,
             checkpoints: CheckpointsOpt,
             live: LiveOpt,
             params: ParamsOpt = Path("params.yaml")) -> None:
    """Fine-tune a trained student's encoder on a task with a fresh head (task-specific distillation)."""
    students = load_machine().students
    cfg = load_section(params, "finetune", FinetuneConfig)
    rcfg = named_entry(cfg, run, params, "finetune", "runs")
    if handed_to_torchrun(students.nproc_per_node, params=params, section="finetune", run=run, loader=cfg.loader,
                          batch_size=rcfg.optim.batch_size):
        return
    check_dataset(tokens, rcfg.dataset, f"finetune.runs.{run}")
    source = teacher_source(teacher, rcfg.teacher, rcfg.dataset, params, f"finetune.runs.{run}")
    _, record = load_student(init, torch.device("cpu"), student=rcfg.student, where=f"finetune.runs.{run}.student")
    if record["name"] != rcfg.init:
        raise ConfigError(f"finetune.runs.{run}.init is {rcfg.init!r} but {init} holds the student {record['name']!r}")
    summary = train_student(run, model_cfg=record["model"], run=rcfg, loader_cfg=cfg.loader, device=cfg.device,
                            tokens_dir=tokens, store_path=source, prepared_dir=prepared, out_dir=out,
                            ckpt_dir=checkpoints, live_dir=live,
                            loader_workers=students.loader_workers, init_dir=init)
    if is_main_process():
        typer.echo(summary.one_line())


main = entry_point(finetune, "finetune")
