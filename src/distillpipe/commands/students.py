"""What the four student-training commands (train, train_aug, train_lm, finetune) share: checking a run's tokens
are its dataset's, handing over to torchrun when the machine trains on several processes, and printing from rank 0
only. (Not in ``commands/base.py``, which every stage imports: what only these commands call is code of theirs
alone, docs/code-deps.md.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from distillpipe.config.base import ConfigError, load_section
from distillpipe.config.run import LoaderConfig, teacher_is_live
from distillpipe.config.teacher_cache import TeacherCacheConfig
from distillpipe.data.schema import read_meta
from distillpipe.errors import UserError
from distillpipe.scale.ddp import relaunch_under_torchrun, under_torchrun
from distillpipe.store.loader import check_processes
from distillpipe.teacher.live import LiveSettings


class TrainingProcessFailed(UserError, RuntimeError):
    """A torchrun worker of a student training died; torchrun stopped the others."""


def handed_to_torchrun(nproc: int, *, params: Path, section: str, run: str, loader: LoaderConfig,
                       batch_size: int) -> bool:
    """Run this training command under torchrun with ``nproc`` processes when the machine asks for more than
    one and this process is not already a torchrun worker; True when it did (the work is done). First the run's
    loader and batch size are checked against ``nproc`` (one message naming the value to set, not one from each
    of ``nproc`` workers)."""
    if nproc <= 1 or under_torchrun():
        return False
    try:
        check_processes(loader.streams, nproc, batch_size, streams_key=f"{section}.loader.streams",
                        batch_key=f"{section}.runs.{run}.optim.batch_size")
    except ValueError as e:
        raise ConfigError(f"{params}: {e} (DISTILLPIPE_NPROC, or machine.yaml students.nproc_per_node, is {nproc})"
                          ) from None
    try:
        relaunch_under_torchrun(nproc)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        code = failure.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        raise TrainingProcessFailed(f"training process rank {rank} of {nproc} {how} and torchrun stopped the others; "
                                    "the checkpoints written so far are kept: run the stage again to resume") from None
    return True


def is_main_process() -> bool:
    """Rank 0 of a torchrun job, or a process on its own: the one that prints."""
    return os.environ.get("RANK", "0") == "0"


def check_dataset(tokens: Path, dataset: str, where: str) -> None:
    """Refuse tokens of another dataset than the run names (a wrong path in dvc.yaml or on the command line)."""
    found = read_meta(tokens).get("name")
    if found != dataset:
        raise ConfigError(f"{where}.dataset is {dataset!r} but {tokens} holds {found!r}")


def teacher_source(teacher: Path, run_teacher: str, dataset: str, params: Path, where: str) -> Path | LiveSettings:
    """What a run's ``--teacher`` path is: its dataset's cache (returned as it is), or a teacher folder to run live
    (:class:`~distillpipe.teacher.live.LiveSettings` from ``teacher_cache.datasets.<dataset>``, whose signals, rows
    and constants the live targets have). ``run_teacher`` is the run's ``teacher`` param, which the path must be
    (the stage passes it; a hand-typed path of the other kind is refused: a store of another dataset is refused by
    the store's own checks, a teacher folder other than the entry's below)."""
    live = teacher_is_live(run_teacher)
    if live == (teacher.suffix == ".zarr"):
        raise ConfigError(f"{where}.teacher is {run_teacher!r} but --teacher is {str(teacher)!r}: "
                          f"{'a teacher folder to run live' if live else 'a teacher cache store'} was expected")
    if not live:
        return teacher
    tc = load_section(params, "teacher_cache", TeacherCacheConfig)
    if dataset not in tc.datasets:
        raise ConfigError(f"{params}: {where}.teacher runs {run_teacher} live, which computes the signals "
                          f"teacher_cache.datasets.{dataset} names, but there is no such entry; add one (its teacher, "
                          "head and signals) as for a cache")
    cfg = tc.datasets[dataset]
    if cfg.teacher != teacher.name:
        raise ConfigError(f"{params}: {where}.teacher runs {run_teacher} live but teacher_cache.datasets.{dataset}."
                          f"teacher is {cfg.teacher!r}: the live teacher is the one whose signals that entry "
                          f"describes; set {where}.teacher to models/teacher/{cfg.teacher}")
    return LiveSettings(dataset, teacher, cfg, tc.batch_size, tc.shard_rows, tc.cpu_threads)
