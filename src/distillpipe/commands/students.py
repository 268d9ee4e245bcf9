"""What the three student-training commands (train, finetune, train_aug) share: handing over to torchrun
when the machine trains on several processes, and printing from rank 0 only."""

from __future__ import annotations

import os
import signal

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from distillpipe.errors import UserError
from distillpipe.scale.ddp import relaunch_under_torchrun, under_torchrun


class TrainingProcessFailed(UserError, RuntimeError):
    """A torchrun worker of a student training died; torchrun stopped the others."""


def handed_to_torchrun(nproc: int) -> bool:
    """Run this training command under torchrun with ``nproc`` processes when the machine asks for more than
    one and this process is not already a torchrun worker; True when it did (the work is done)."""
    if nproc <= 1 or under_torchrun():
        return False
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
