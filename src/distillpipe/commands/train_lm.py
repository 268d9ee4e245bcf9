"""``distillpipe train-lm``: the ``train_lm`` stage (language-model students, ELMo-C and its baselines, that
read a word-vector table)."""

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
from distillpipe.config.base import ConfigError, load_section
from distillpipe.config.train_lm import TrainLMConfig
from distillpipe.scale.machine import load_machine
from distillpipe.train.loop import train_student


@user_errors
def train_lm(run: RunOpt,
             tokens: TokensOpt,
             teacher_cache: CacheOpt,
             word_vectors: Annotated[Path, typer.Option(help="the run's word-vector table (word_vectors' output)")],
             prepared: PreparedOpt,
             out: StudentOutOpt,
             checkpoints: CheckpointsOpt,
             live: LiveOpt,
             params: ParamsOpt = Path("params.yaml")) -> None:
    """Train a language-model student (ELMo-C, ELMo-A, ELMo-Sub) from random initialisation on a corpus, its input
    layer the fixed word-vector table."""
    students = load_machine().students
    cfg = load_section(params, "train_lm", TrainLMConfig)
    rcfg = named_entry(cfg, run, params, "train_lm", "runs")
    if handed_to_torchrun(students.nproc_per_node, params=params, section="train_lm", run=run, loader=cfg.loader,
                          batch_size=rcfg.optim.batch_size):
        return
    check_dataset(tokens, rcfg.dataset, f"train_lm.runs.{run}")
    if word_vectors.name != rcfg.word_vectors:
        raise ConfigError(f"train_lm.runs.{run}.word_vectors is {rcfg.word_vectors!r} but --word-vectors is "
                          f"{word_vectors}")
    summary = train_student(run, model_cfg=rcfg.model, run=rcfg, loader_cfg=cfg.loader, device=cfg.device,
                            tokens_dir=tokens, store_path=teacher_cache, prepared_dir=prepared, out_dir=out,
                            ckpt_dir=checkpoints, live_dir=live,
                            loader_workers=students.loader_workers, word_vectors=word_vectors)
    if is_main_process():
        typer.echo(summary.one_line())


main = entry_point(train_lm, "train-lm")
