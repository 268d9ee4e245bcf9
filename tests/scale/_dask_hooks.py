"""Functions the dask tests run inside worker processes (pickled by value: workers need not see this file)."""

import os
import signal


def kill_mid_shard(shard: int, flag: str) -> None:
    """Make this worker process SIGKILL itself half-way through publishing ``shard`` (after two of its array
    files), once per test: ``flag`` is created first, so the retry of the shard runs normally."""
    from distillpipe.teacher import cache

    orig = cache.write_shard

    def write_shard(store, i, arrays, **kw):
        if i != shard or os.path.exists(flag):
            return orig(store, i, arrays, **kw)
        open(flag, "w").close()
        written = []

        def after_array(name, nbytes):
            written.append(name)
            if len(written) == 2:
                os.kill(os.getpid(), signal.SIGKILL)

        return orig(store, i, arrays, on_array_written=after_array)

    cache.write_shard = write_shard


def pid() -> int:
    return os.getpid()


def fill_disk(root: str, budget: int, tests_dir: str) -> None:
    """Give this worker process a disk that is full once ``budget`` bytes are written under ``root``
    (tests/_fulldisk.py: a write that crosses it writes what fits and raises ENOSPC), until the worker ends."""
    import sys

    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    from _fulldisk import FullDisk

    FullDisk(root, budget).__enter__()


def disk_failed() -> list[str]:
    """The files whose write found this worker's disk (:func:`fill_disk`) full."""
    import builtins

    return list(builtins.open.__self__.failed)
