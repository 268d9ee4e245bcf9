"""``distillpipe teacher-cache``: the ``teacher_cache`` stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import DatasetOpt, ParamsOpt, entry_point, named_entry, user_errors
from distillpipe.config.base import load_section
from distillpipe.config.teacher_cache import TeacherCacheConfig
from distillpipe.scale.machine import load_machine
from distillpipe.teacher.cache import build_teacher_cache


@user_errors
def teacher_cache(dataset: DatasetOpt,
                  tokens: Annotated[Path, typer.Option(help="tokens folder")],
                  teacher: Annotated[Path, typer.Option(help="teacher model folder")],
                  out: Annotated[Path, typer.Option(help="Zarr store to create or resume")],
                  params: ParamsOpt = Path("params.yaml")) -> None:
    """Run the teacher over a tokens split and cache its signals in a sharded, resumable Zarr store.

    Where the shards are computed (this process or a dask cluster) is a machine setting: machine.yaml or
    DISTILLPIPE_CLUSTER / DISTILLPIPE_WORKERS / DISTILLPIPE_SCHEDULER (docs/scaling-out.md)."""
    cfg = load_section(params, "teacher_cache", TeacherCacheConfig)
    dcfg = named_entry(cfg, dataset, params, "teacher_cache", "datasets")
    summary = build_teacher_cache(dataset, tokens, teacher, dcfg, cfg.device, cfg.batch_size, cfg.shard_rows, out,
                                  cluster=load_machine().cluster, cpu_threads=cfg.cpu_threads)
    typer.echo(summary.one_line())


main = entry_point(teacher_cache, "teacher-cache")
