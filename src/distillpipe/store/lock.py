"""One writer per store: an OS file lock beside the store, with its owner recorded.

The lock is ``<store>.lock`` next to the store (``data/teacher/wiki.zarr.lock``), never inside it: the
store is a DVC output, and a lock file in it would change its hash. The driver of a build takes it
before it reads, deletes or creates anything in the store and holds it until the build ends; a second
writer is refused at once with the owner's host, pid and start time. Shard writers in other processes
(dask workers) do not take it: the driver that holds it hands them disjoint shards.

Mechanism: ``fcntl.flock(LOCK_EX | LOCK_NB)`` on the lock file. The kernel releases the lock when its
process dies (SIGKILL included), so a lock left by a dead process is taken over; the stale owner
record is then logged as a warning. The file itself is never deleted (deleting a lock file while a
contender holds it open lets two processes lock different inodes).

What this guarantees: on a local filesystem, two processes on one machine never write one store at
once. On NFS (v4, or v3 with lockd), Linux maps ``flock`` to POSIX byte-range locks that the server
arbitrates, so writers on different machines exclude each other too; a client that dies holding the
lock releases it when its lease expires (about 90 s). On filesystems without working locks (some FUSE
and SMB mounts, object-store mounts) ``flock`` succeeds everywhere and nothing is guaranteed: keep
one writer per store by hand there. (The standard library has no portable lock that records its
owner; ``filelock`` truncates the file on every attempt, which would erase the owner record.)
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from distillpipe.errors import UserError

log = logging.getLogger(__name__)
_ATTEMPTS, _RETRY_S = 5, 0.1


class StoreLocked(UserError, RuntimeError):
    """Another process is writing this store."""


def lock_path(store: str | Path) -> Path:
    store = Path(store)
    return store.with_name(store.name + ".lock")


class StoreLock:
    """The exclusive write lock of one store; ``acquire()``/``release()`` or a ``with`` block."""

    def __init__(self, store: str | Path):
        self.store = Path(store)
        self.path = lock_path(store)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> StoreLock:
        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o664)
        for attempt in range(_ATTEMPTS):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                if attempt + 1 < _ATTEMPTS:  # a reader's check holds a shared lock for microseconds
                    time.sleep(_RETRY_S)
        else:
            owner = _read_owner(fd)
            os.close(fd)
            raise StoreLocked(
                f"teacher cache {self.store} is being written by another process ({_describe(owner)}); "
                f"wait for it to finish, or stop it. The lock is {self.path}; the OS releases it when that "
                "process ends."
            ) from None
        stale = _read_owner(fd)
        if stale:
            log.warning("taking over the write lock of %s left by %s, which no longer holds it (killed or crashed); "
                        "its unfinished shards are checked and recomputed", self.store, _describe(stale))
        record = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # an empty record: released cleanly
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __del__(self) -> None:  # like a file object: a writer that is dropped releases its lock
        try:
            self.release()
        except Exception:  # interpreter shutdown: the OS releases it anyway
            pass

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def writer_active(store: str | Path) -> str | None:
    """A description of the process writing ``store`` now, or None when no writer holds its lock (or the
    lock cannot be checked: a read-only folder). Readers call this to refuse a store mid-build."""
    path = lock_path(store)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _describe(_read_owner(fd))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_owner(fd: int) -> dict[str, Any] | None:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def _describe(owner: dict[str, Any] | None) -> str:
    if not owner:
        return "owner unknown"
    return f"pid {owner.get('pid')} on {owner.get('host')}, since {owner.get('since')}"
