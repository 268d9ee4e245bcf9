"""``distillpipe train-aug``: the ``train_aug`` stage (a dataset plus augmented, unlabeled rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import (
    CacheOpt,
    CheckpointsOpt,
    LiveOpt,
    ParamsOpt,
    PreparedOpt,
    RunOpt,
    StudentOutOpt,
    TokensOpt,
    entry_point,
    named_entry,
    user_errors,
)
from distillpipe.commands.students import check_dataset, handed_to_torchrun, is_main_process
from distillpipe.config.base import load_section
from distillpipe.config.train_aug import TrainAugConfig
from distillpipe.scale.machine import load_machine
from distillpipe.train.loop import train_student


@user_errors
def train_aug(run: RunOpt,
              tokens: TokensOpt,
              teacher_cache: CacheOpt,
              augment_tokens: Annotated[Path, typer.Option(help="tokens folder of the augmented (unlabeled) rows")],
              augment_cache: Annotated[Path, typer.Option(help="teacher-cache store of the augmented rows")],
              prepared: PreparedOpt,
              out: StudentOutOpt,
              checkpoints: CheckpointsOpt,
              live: LiveOpt,
              params: ParamsOpt = Path("params.yaml")) -> None:
    """Train a student from random initialisation on a dataset plus augmented unlabeled rows (teacher losses)."""
    students = load_machine().students
    cfg = load_section(params, "train_aug", TrainAugConfig)
    rcfg = named_entry(cfg, run, params, "train_aug", "runs")
    if handed_to_torchrun(students.nproc_per_node, params=params, section="train_aug", run=run, loader=cfg.loader,
                          batch_size=rcfg.optim.batch_size):
        return
    check_dataset(tokens, rcfg.dataset, f"train_aug.runs.{run}")
    check_dataset(augment_tokens, rcfg.augment, f"train_aug.runs.{run}.augment: the")
    summary = train_student(run, model_cfg=rcfg.model, run=rcfg, loader_cfg=cfg.loader, device=cfg.device,
                            tokens_dir=tokens, store_path=teacher_cache, prepared_dir=prepared, out_dir=out,
                            ckpt_dir=checkpoints, live_dir=live,
                            loader_workers=students.loader_workers,
                            augment=(rcfg.augment, augment_tokens, augment_cache))
    if is_main_process():
        typer.echo(summary.one_line())


main = entry_point(train_aug, "train-aug")
