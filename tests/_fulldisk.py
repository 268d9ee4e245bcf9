"""A disk that fills up, for tests that cannot mount a small filesystem: files opened for writing under one folder
(through ``open``, ``io.open`` or ``Path.open``: our writers, Zarr's and ``torch.save`` into an open file) take bytes
from a budget; the write that crosses it writes what still fits and raises ``OSError(ENOSPC)``, as a real full disk
does. Deleting files gives nothing back (the tests fail a build once, then lift the budget)."""

from __future__ import annotations

import builtins
import errno
import io
import os
from pathlib import Path


class FullDisk:
    def __init__(self, root: str | Path, budget: int):
        self.root = Path(root).resolve()
        self.left = budget
        self.failed: list[str] = []
        """The files whose write found the disk full."""
        self._open = io.open

    def install(self, monkeypatch) -> FullDisk:
        monkeypatch.setattr(builtins, "open", self.open)
        monkeypatch.setattr(io, "open", self.open)
        return self

    def __enter__(self) -> FullDisk:  # without pytest (a test's driver subprocess)
        builtins.open = io.open = self.open
        return self

    def __exit__(self, *exc) -> None:
        builtins.open = io.open = self._open

    def open(self, file, mode="r", *args, **kwargs):
        f = self._open(file, mode, *args, **kwargs)
        if isinstance(file, int) or not any(c in mode for c in "wax+"):
            return f
        if not Path(os.fspath(file)).resolve().is_relative_to(self.root):
            return f
        return _Limited(f, self, os.fspath(file))


class _Limited:
    def __init__(self, f, disk: FullDisk, name: str):
        self._f, self._disk, self._name = f, disk, name

    def write(self, data):
        n = len(data) if isinstance(data, str) else memoryview(data).nbytes
        if n <= self._disk.left:
            self._disk.left -= n
            return self._f.write(data)
        fits = self._disk.left
        self._disk.left = 0
        if fits:
            self._f.write(data[:fits] if isinstance(data, str) else memoryview(data).cast("B")[:fits])
        self._disk.failed.append(self._name)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._f, name)
