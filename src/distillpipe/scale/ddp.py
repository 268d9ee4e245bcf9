"""Student training on several processes: torchrun launches them, torch DDP keeps their weights equal.

``train``, ``finetune`` and ``train_aug`` call :func:`relaunch_under_torchrun` when the machine setting
``students.nproc_per_node`` is above 1 and they are not yet a torchrun worker: it runs torchrun
(``torch.distributed.run``, standalone rendezvous on this machine) on the same command, and each worker
joins the process group with :func:`join` (nccl on CUDA, one GPU per process; gloo on CPU). The
global batch size stays the run's param; the block loader gives each process its streams' part of it.
A worker that dies takes the job down (torchrun stops the others, ``max_restarts`` 0) with a non-zero
exit; the checkpoints of rank 0 stay, and the next run resumes every rank from them.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distillpipe.runtime import resolve_device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessGroup:
    """This process's place among the training processes (rank 0 of 1 when alone)."""

    rank: int
    world: int
    local_rank: int

    @property
    def main(self) -> bool:
        """Rank 0: the one that evaluates, logs, and writes checkpoints and outputs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def under_torchrun() -> bool:
    """Whether this process was started by torchrun (it sets these for every worker)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ and "RANK" in os.environ


def join(device_spec: str) -> tuple[ProcessGroup, torch.device]:
    """This process's group and device: alone, or (under torchrun) rank ``$RANK`` of ``$WORLD_SIZE`` with
    the process group initialised (nccl and GPU ``$LOCAL_RANK`` on CUDA, gloo on CPU)."""
    device = resolve_device(device_spec)
    if not under_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return ProcessGroup(0, 1, 0), device
    group = ProcessGroup(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        device = torch.device("cuda", group.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if not group.main:  # one process speaks; the others only warn
        logging.getLogger("distillpipe").setLevel(logging.WARNING)
    return group, device


def leave(group: ProcessGroup) -> None:
    if group.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def relaunch_under_torchrun(nproc: int) -> None:
    """Run this very command again under torchrun with ``nproc`` processes on this machine, and return when
    they all finished; raise ``torch.distributed.elastic.multiprocessing.errors.ChildFailedError`` when one
    failed (torchrun has stopped the others)."""
    from torch.distributed.run import main as torchrun

    module, argv = _this_command()
    log.info("running %s under torchrun with %d processes", module, nproc)
    # "--": torchrun's own options would otherwise swallow abbreviations of ours (--run matches --run-path)
    torchrun(["--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc), "--max-restarts", "0",
              "--module", module, "--", *argv])


def _this_command() -> tuple[str, list[str]]:
    """(module, arguments) that run this command: the stage script's module for ``python -m stages.train``,
    else the ``distillpipe`` command itself."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return spec.name, sys.argv[1:]
    return "distillpipe.cli", sys.argv[1:]
