"""dask.distributed for the teacher cache and augmentation: connect to the machine's cluster, run one task
per unit of work, report progress.

:func:`open_client` turns :class:`~distillpipe.scale.machine.ClusterSettings` into a connected
``distributed.Client`` (a ``LocalCluster``, a ``dask_cuda.LocalCUDACluster``, a running scheduler, or a
``dask_jobqueue.SLURMCluster``) and closes what it started. :func:`run_tasks` submits one task per
item, yields results as they complete, lets dask retry a task that raised (``retries``) and move the task
of a worker that died to another worker (the scheduler's ``allowed-failures``), and fails clearly when an
item keeps failing. The engines do the scheduling, retries and worker restarts; nothing here schedules.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from distillpipe.errors import UserError
from distillpipe.scale.machine import ClusterSettings

log = logging.getLogger(__name__)


class ClusterError(UserError, RuntimeError):
    """The cluster cannot be reached or started, or a task keeps failing on it."""


@contextlib.contextmanager
def open_client(settings: ClusterSettings) -> Iterator[Any]:
    """A ``distributed.Client`` on the cluster ``settings`` describe (not for ``inprocess``)."""
    from distributed import Client

    with contextlib.ExitStack() as stack:
        kind = settings.kind
        if kind == "address":
            try:
                client = stack.enter_context(Client(settings.address, timeout="30s"))
            except OSError as e:
                raise ClusterError(f"cannot reach the dask scheduler at {settings.address} ({e}); start it "
                                   "(`dask scheduler`) and its workers (`dask worker ADDRESS`), or change "
                                   "DISTILLPIPE_SCHEDULER / cluster.address") from None
        else:
            cluster = stack.enter_context(_start_cluster(settings))
            client = stack.enter_context(Client(cluster))
        link = getattr(client, "dashboard_link", None)
        log.info("dask cluster %s: %d workers; dashboard %s", kind, len(client.scheduler_info().get("workers", {})),
                 link or "unavailable")
        yield client


# dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, so that glibc hands freed memory back at once;
# with the teacher's large per-batch allocations that made its forward ~15% slower on CPU (measured: 6.8 s vs
# 5.9 s for the same batches). The clusters started here leave glibc's default instead.
_WORKER_ENV = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}


def _start_cluster(settings: ClusterSettings) -> Any:
    import dask

    with dask.config.set(_WORKER_ENV):
        return _new_cluster(settings)


def _new_cluster(settings: ClusterSettings) -> Any:
    kind = settings.kind
    if kind == "local":
        from distributed import LocalCluster

        return LocalCluster(n_workers=settings.n_workers, threads_per_worker=settings.threads_per_worker,
                            memory_limit=settings.memory_limit, processes=True, dashboard_address=":0")
    if kind == "local_cuda":
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError as e:
            raise ClusterError(f"cluster.kind local_cuda needs dask-cuda: pip install -e '.[cuda]' ({e})") from None
        kwargs = {"threads_per_worker": settings.threads_per_worker, "memory_limit": settings.memory_limit,
                  "dashboard_address": ":0"}
        if settings.n_workers is not None:
            kwargs["n_workers"] = settings.n_workers
        return LocalCUDACluster(**kwargs)
    if kind == "slurm":
        try:
            from dask_jobqueue import SLURMCluster
        except ImportError as e:
            raise ClusterError(f"cluster.kind slurm needs dask-jobqueue: pip install -e '.[slurm]' ({e})") from None
        cluster = SLURMCluster(**settings.slurm)
        cluster.scale(jobs=settings.jobs)
        log.info("submitted %d SLURM job(s); job script:\n%s", settings.jobs, cluster.job_script())
        return cluster
    raise ValueError(f"no cluster to start for kind {kind!r}")  # programming error


def run_tasks(client: Any, fn: Callable[..., Any], items: Iterable[Any], *, key: Callable[[Any], str],
              retries: int, args: tuple = ()) -> Iterator[tuple[Any, Any]]:
    """Submit ``fn(*args, item)`` for every item (task key ``key(item)``); yield ``(item, result)`` as
    tasks finish, in completion order. A task that raised is retried ``retries`` times by dask; then its
    error is raised here, naming the item."""
    from distributed import as_completed

    futures = {client.submit(fn, *args, item, key=key(item), retries=retries, pure=False): item for item in items}
    for future in as_completed(futures):
        item = futures[future]
        try:
            result = future.result()
        except UserError:
            raise
        except Exception as e:
            raise ClusterError(f"task {key(item)} failed on the cluster after {retries} retries: "
                               f"{type(e).__name__}: {e}") from e
        yield item, result
