"""``distillpipe train``: the ``train`` stage (students from random initialisation)."""

from __future__ import annotations

from pathlib import Path

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
from distillpipe.config.base import load_section
from distillpipe.config.train import TrainConfig
from distillpipe.scale.machine import load_machine
from distillpipe.train.loop import train_student


@user_errors
def train(run: RunOpt,
          tokens: TokensOpt,
          teacher: TeacherOpt,
          prepared: PreparedOpt,
          out: StudentOutOpt,
          checkpoints: CheckpointsOpt,
          live: LiveOpt,
          params: ParamsOpt = Path("params.yaml")) -> None:
    """Train a student from random initialisation against a teacher cache (general or task distillation)."""
    students = load_machine().students
    cfg = load_section(params, "train", TrainConfig)
    rcfg = named_entry(cfg, run, params, "train", "runs")
    if handed_to_torchrun(students.nproc_per_node, params=params, section="train", run=run, loader=cfg.loader,
                          batch_size=rcfg.optim.batch_size):
        return
    check_dataset(tokens, rcfg.dataset, f"train.runs.{run}")
    source = teacher_source(teacher, rcfg.teacher, rcfg.dataset, params, f"train.runs.{run}")
    summary = train_student(run, model_cfg=rcfg.model, run=rcfg, loader_cfg=cfg.loader, device=cfg.device,
                            tokens_dir=tokens, store_path=source, prepared_dir=prepared, out_dir=out,
                            ckpt_dir=checkpoints, live_dir=live,
                            loader_workers=students.loader_workers)
    if is_main_process():
        typer.echo(summary.one_line())


main = entry_point(train, "train")
