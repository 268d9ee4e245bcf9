"""The one base class of the errors a user can fix, and how a full disk is recognised.

Library code raises a subclass with a message that says what went wrong, where, and how to fix it;
the command line (``distillpipe.commands.base``) prints that message and exits with status 2, without
a traceback (``DISTILLPIPE_DEBUG=1`` shows it). Anything else is a bug and keeps its traceback, except a
full disk (:func:`disk_full_cause`): never a bug, always the user's to fix.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
"""No space left on the device, or the user's disk quota is used up: the same fix."""


class UserError(Exception):
    """An error the user can fix; the message is the whole story."""


class DiskFull(UserError):
    """A write found the disk full; the message names the path, the space needed and how to go on."""


def disk_full_cause(exc: BaseException) -> OSError | None:
    """The OSError saying that the disk (or the quota) is full, among ``exc`` and the exceptions it was raised from
    or while handling (``torch.save`` reports a full disk as a RuntimeError raised while handling the OSError; a dask
    task's error arrives wrapped); None when the disk is not why ``exc`` was raised."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def free_space(path: str | Path) -> tuple[Path, int]:
    """(the nearest existing folder at or above ``path``, the bytes free on its disk for this user)."""
    folder = Path(path).absolute()
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return folder, shutil.disk_usage(folder).free
