"""What every command shares: logging set-up, turning user errors into exit status 2, option types.

This is the only place that turns exceptions into exit codes: a :class:`~distillpipe.errors.UserError`
(bad params, bad input files, a stale or damaged cache, a locked store, a full disk the library
describes), a missing file or any other full disk prints one message and exits 2; set ``DISTILLPIPE_DEBUG=1``
to see the traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from distillpipe.config.base import ConfigError
from distillpipe.errors import UserError, disk_full_cause, free_space

USER_ERRORS: tuple[type[BaseException], ...] = (UserError, FileNotFoundError)

ParamsOpt = Annotated[Path, typer.Option("--params", help="params.yaml to read the stage's section from")]
DatasetOpt = Annotated[str, typer.Option("--dataset", help="dataset name (a key of the stage's `datasets`)")]
RunOpt = Annotated[str, typer.Option("--run", help="run name (a key of the section's `runs`)")]
TokensOpt = Annotated[Path, typer.Option("--tokens", help="tokens folder of the run's dataset")]
CacheOpt = Annotated[Path, typer.Option("--teacher-cache", help="teacher-cache store of the run's dataset")]
TeacherOpt = Annotated[Path, typer.Option(
    "--teacher", help="the run's teacher param: its dataset's cache (data/teacher/<dataset>.zarr) or a teacher "
                      "folder to run live (models/teacher/<name>)")]
PreparedOpt = Annotated[Path, typer.Option("--prepared", help="prepared dataset folder (QA contexts for dev EM/F1)")]
StudentOutOpt = Annotated[Path, typer.Option("--out", help="output student folder")]
CheckpointsOpt = Annotated[Path, typer.Option("--checkpoints", help="checkpoint folder (resume: auto)")]
LiveOpt = Annotated[Path, typer.Option("--live", help="dvclive folder to write (metrics.json, params.yaml, plots/)")]


def setup_logging() -> None:
    level = os.environ.get("DISTILLPIPE_LOG", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "filelock", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def user_errors(fn: Callable) -> Callable:
    """Run a command; print a user-fixable error as one clear message and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        setup_logging()
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            if os.environ.get("DISTILLPIPE_DEBUG"):
                raise
            typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
        except Exception as e:  # a full disk the library did not describe: still one message, never a traceback
            cause = disk_full_cause(e)
            if cause is None or os.environ.get("DISTILLPIPE_DEBUG"):
                raise
            typer.secho(f"error: {disk_full_text(cause)}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None

    return wrapper


def disk_full_text(e: OSError) -> str:
    """What a full disk that no library code described says: the file, the space free there, the fix."""
    folder, free = free_space(e.filename) if e.filename else (None, None)
    where = f" writing {e.filename} ({free / 1e6:,.1f} MB free on {folder})" if folder is not None else ""
    return (f"{e.strerror or 'no space left on device'}{where}: free space on that disk (or point the output at a "
            "larger one), then run the command again")


MALLOC_MMAP_THRESHOLD = 1 << 30
MALLOC_TOP_PAD = 256 << 20


def keep_freed_memory() -> None:
    """Have glibc's malloc reuse the memory this process frees instead of handing it back to the kernel at once.

    By default a block over 128 KB (the threshold rises to at most 32 MB) is a mapping of its own, unmapped when it is
    freed, so the large tensors every training step or batch allocates are fresh pages each time, and a fresh page
    costs a fault and its zeroing (~4 CPU-ms a MB on these VMs, DEVELOPERS.md): ``train@hybrid`` spent 63 of its
    180 CPU-seconds in the kernel doing that. Here blocks up to 1 GiB come from the heap, which keeps 256 MiB free at
    its top. Results do not change (only where freed memory goes); the peak resident memory can. Called by the
    process entry points (stage scripts, the ``distillpipe`` command), never on import; does nothing off glibc or when
    the user set malloc's environment variables."""
    if sys.platform != "linux" or any(k.startswith("MALLOC_") or k == "GLIBC_TUNABLES" for k in os.environ):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, MALLOC_MMAP_THRESHOLD)  # M_MMAP_THRESHOLD (a fixed one: no dynamic threshold either)
    mallopt(-2, MALLOC_TOP_PAD)  # M_TOP_PAD


def entry_point(command: Callable, name: str) -> Callable[[], None]:
    """``main()`` of a stage script: run ``command`` alone on ``sys.argv`` (in a process whose malloc keeps the
    memory it frees: :func:`keep_freed_memory`)."""

    def main() -> None:
        keep_freed_memory()
        app = typer.Typer(add_completion=False)
        app.command(name)(command)
        app(sys.argv[1:], prog_name=f"distillpipe {name}")

    return main


def named_entry(section, name: str, params: Path, section_name: str, what: str):
    """``section.<what>[name]`` or a ConfigError naming the known entries."""
    entries = getattr(section, what)
    if name not in entries:
        raise ConfigError(f"{params}: {section_name}.{what} has no {name!r}; known: {sorted(entries)}")
    return entries[name]
