"""Machine settings: where and how wide work runs. Never a DVC param: they change no output.

How many dask workers compute the teacher cache, which scheduler they join, how many torchrun processes
train a student: these differ between a laptop, a GPU box and a SLURM cluster, while the outputs must
not (the stores are byte-identical whatever the workers; a student's weights are those of the same
global batch). So they live outside ``params.yaml``, and changing them leaves ``dvc status`` clean.

Precedence, lowest first:

1. the defaults below (in-process, one training process);
2. the YAML file named by ``$DISTILLPIPE_MACHINE``, else ``machine.yaml`` in the working directory
   (git-ignored: one per machine; ``machine.example.yaml`` documents every key);
3. environment variables: ``DISTILLPIPE_CLUSTER`` (kind), ``DISTILLPIPE_WORKERS`` (n_workers),
   ``DISTILLPIPE_THREADS`` (threads_per_worker), ``DISTILLPIPE_MEMORY_LIMIT``, ``DISTILLPIPE_SCHEDULER``
   (a scheduler address; alone it also sets kind ``address``), ``DISTILLPIPE_NPROC`` (torchrun
   processes per node) and ``DISTILLPIPE_LOADER_WORKERS`` (DataLoader workers per training process).

Values are checked as strictly as params: an unknown key or a wrong type names the file or variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from distillpipe.config.base import ConfigError, build

FILE_ENV = "DISTILLPIPE_MACHINE"
DEFAULT_FILE = "machine.yaml"
DEFAULTS: dict[str, Any] = {
    "cluster": {"kind": "inprocess", "n_workers": 2, "threads_per_worker": 2, "memory_limit": "auto",
                "address": None, "slurm": {}, "jobs": 1, "retries": 2},
    "students": {"nproc_per_node": 1, "loader_workers": 0},
}
ENV: dict[str, tuple[str, str, type]] = {
    "DISTILLPIPE_CLUSTER": ("cluster", "kind", str),
    "DISTILLPIPE_WORKERS": ("cluster", "n_workers", int),
    "DISTILLPIPE_THREADS": ("cluster", "threads_per_worker", int),
    "DISTILLPIPE_MEMORY_LIMIT": ("cluster", "memory_limit", str),
    "DISTILLPIPE_SCHEDULER": ("cluster", "address", str),
    "DISTILLPIPE_NPROC": ("students", "nproc_per_node", int),
    "DISTILLPIPE_LOADER_WORKERS": ("students", "loader_workers", int),
}


@dataclass(frozen=True)
class ClusterSettings:
    """Where the teacher cache's shards and augment's chunks run (one dask task each)."""

    kind: Literal["inprocess", "local", "local_cuda", "address", "slurm"]
    """``inprocess``: this process, no dask (the embedded default: fastest on 2 cores, see docs/scaling-out.md);
    ``local``: a ``distributed.LocalCluster``; ``local_cuda``: a ``dask_cuda.LocalCUDACluster``, one worker
    per visible GPU (``pip install -e .[cuda]``); ``address``: join the running scheduler at ``address``;
    ``slurm``: a ``dask_jobqueue.SLURMCluster`` of ``jobs`` jobs (``pip install -e .[slurm]``)."""
    n_workers: int | None
    """``local``: worker processes; ``local_cuda``: null = one per visible GPU."""
    threads_per_worker: int
    """Tasks a worker runs at once: one computes (a worker's teacher serves one shard at a time), the others
    encode and write finished shards meanwhile. ``inprocess`` too: ``threads_per_worker - 1`` shard writers.
    2 suits small rows; rows of MBs (WaLDORf's, MiniALBERT's) on a many-core GPU box need more writers, each
    holding one shard twice (docs/at-scale.md). The torch threads of one computation are the stage's
    ``cpu_threads`` param (they decide the bytes)."""
    memory_limit: str | None
    """Per worker (``local``/``local_cuda``): ``16GiB``, ``auto`` (RAM split between workers) or null."""
    address: str | None
    """``address``: the scheduler, e.g. ``tcp://10.0.0.5:8786``."""
    slurm: dict[str, Any]
    """``slurm``: keyword arguments of ``dask_jobqueue.SLURMCluster`` (``cores``, ``memory``, ``queue``,
    ``walltime``, ``job_extra_directives``...); what is not given comes from dask-jobqueue's own config."""
    jobs: int
    """``slurm``: how many jobs to start."""
    retries: int
    """A task that raises is retried this often; a worker that dies is the scheduler's business (its task
    moves to another worker, ``distributed.scheduler.allowed-failures`` times)."""

    def __post_init__(self) -> None:
        if self.n_workers is not None and self.n_workers < 1:
            raise ConfigError(f"cluster.n_workers={self.n_workers} must be >= 1 (or null for local_cuda)")
        if self.threads_per_worker < 1 or self.jobs < 1 or self.retries < 0:
            raise ConfigError("cluster: need threads_per_worker >= 1, jobs >= 1 and retries >= 0")
        if self.kind == "address" and not self.address:
            raise ConfigError("cluster.kind is address but no address is set (DISTILLPIPE_SCHEDULER or "
                              "cluster.address: tcp://host:8786)")
        if self.kind == "local" and self.n_workers is None:
            raise ConfigError("cluster.kind local needs n_workers")


@dataclass(frozen=True)
class StudentSettings:
    nproc_per_node: int
    """Training processes on this machine: > 1 runs train/finetune/train_aug under torchrun (DDP; nccl on
    CUDA, gloo on CPU). The global batch size stays the run's param; the run's ``loader.streams`` must be a
    multiple of it (each process reads whole streams)."""
    loader_workers: int
    """DataLoader worker processes per training process (0: read in the training process). They only add
    parallelism: the batches are the same; it must divide the streams each process reads."""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1 or self.loader_workers < 0:
            raise ConfigError(f"students: need nproc_per_node >= 1 and loader_workers >= 0, got "
                              f"{self.nproc_per_node}, {self.loader_workers}")


@dataclass(frozen=True)
class MachineSettings:
    cluster: ClusterSettings
    students: StudentSettings


def machine_file(environ: dict[str, str]) -> Path | None:
    """The settings file in effect: ``$DISTILLPIPE_MACHINE`` (which must exist) or ./machine.yaml if present."""
    named = environ.get(FILE_ENV)
    if named:
        path = Path(named)
        if not path.is_file():
            raise ConfigError(f"{FILE_ENV}={named}: no such file")
        return path
    path = Path(DEFAULT_FILE)
    return path if path.is_file() else None


def load_machine(environ: dict[str, str] | None = None) -> MachineSettings:
    """Defaults, overlaid by the machine file, overlaid by the environment (see the module docstring)."""
    environ = dict(os.environ if environ is None else environ)
    data = {k: dict(v) for k, v in DEFAULTS.items()}
    path = machine_file(environ)
    source = "defaults"
    if path is not None:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping with `cluster` and/or `students`")
        unknown = sorted(set(loaded) - set(DEFAULTS))
        if unknown:
            raise ConfigError(f"{path}: unknown section(s) {unknown}; expected {sorted(DEFAULTS)}")
        for section, values in loaded.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: {section}: expected a mapping")
            data[section].update(values)
        source = str(path)
    for var, (section, key, kind) in ENV.items():
        raw = environ.get(var)
        if raw is None or raw == "":
            continue
        try:
            data[section][key] = kind(raw)
        except ValueError:
            raise ConfigError(f"{var}={raw!r}: expected {kind.__name__}") from None
        source += f" + ${var}"
    if environ.get("DISTILLPIPE_SCHEDULER") and not environ.get("DISTILLPIPE_CLUSTER"):
        data["cluster"]["kind"] = "address"
    return build(MachineSettings, data, "machine", source)
