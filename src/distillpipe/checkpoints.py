"""Atomic training checkpoints with ``resume: auto`` semantics, taken by the clock and written in the background.

A checkpoint is one ``step-<n>.pt`` file written to a temp name and renamed into place, so a
kill at any moment leaves either the old or the new checkpoint, never a torn one; so does a full disk,
which stops the run with one message (the space needed and free). Only the newest ``keep`` files are kept.
:func:`resume_or_restart` is the resume decision of every training loop: the newest checkpoint if the run
that wrote it had the same identity, else a fresh start.

**When and how** (:class:`Checkpointer`, used by every training loop): a checkpoint is due once
``checkpoint_minutes`` of wall-clock time have passed since the last one (the loops also take one at each dev
evaluation that improves the best score), so a kill loses at most that interval, whatever a step costs. The state
is copied to host memory (buffers reused from one checkpoint to the next) and written by a background thread while
training goes on; the next checkpoint waits for the previous write, so there is never more than one in flight
and one host copy. :func:`checkpoint_interval` is the interval that keeps the cost under a share of the run
(``distillpipe new-task --budget`` writes it).

No checkpoint is unpickled: a checkpoint holds tensors and plain Python values only (checked when it is
saved) and is read with ``torch.load(weights_only=True)``, whose unpickler builds nothing else and calls
nothing. A file it refuses is told apart by disassembling its pickle (:mod:`pickletools`: nothing imported or
called): one written by an older distillpipe (numpy RNG states and scalars) starts the run over, naming why; one
that asks for anything else is not a distillpipe checkpoint and stops the run (:class:`CheckpointRefused`); one
that cannot be parsed at all is damaged, and the previous checkpoint is used.
"""

from __future__ import annotations

import io
import logging
import math
import os
import pickle
import pickletools
import re
import tempfile
import threading
import time
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from distillpipe.errors import DiskFull, UserError, disk_full_cause, free_space

log = logging.getLogger(__name__)
_NAME = re.compile(r"^step-(\d+)\.pt$")


class CheckpointRefused(UserError):
    """A checkpoint file that is not a plain-weights checkpoint: not loaded, and the run stops."""


class OutdatedCheckpoint(Exception):
    """A checkpoint of an older distillpipe, which a weights-only load refuses: the run starts over."""


_PLAIN_LEAVES = (str, int, float, bool, type(None), bytes)
_OLD_GLOBALS = {f"numpy.{core}.multiarray.{name}" for core in ("core", "_core") for name in ("_reconstruct", "scalar")}
_OLD_GLOBALS |= {"numpy.ndarray", "numpy.dtype"}
"""What checkpoints of distillpipe before weights-only loading held besides tensors: numpy's RNG state (an ndarray)
and numpy scalars."""
_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}


def save_checkpoint(folder: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``state`` as ``<folder>/step-<step>.pt`` (temp file, fsync, rename), then drop all but the newest
    ``keep``. A full disk raises :class:`~distillpipe.errors.DiskFull` naming the file, the space it needs and the
    space free, and leaves the folder as it was (the partial file is removed; older checkpoints stay)."""
    check_plain(state)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step:09d}.pt"
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as f:  # a file object: torch.save to a path reports a full disk without its errno
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        if disk_full_cause(e) is None:
            raise
        where, free = free_space(folder)
        kept = list_checkpoints(folder)
        raise DiskFull(
            f"no space left on device writing checkpoint {path}: it needs ~{_mb(state_bytes(state))} (its tensors) "
            f"and {_mb(free)} is free on {where}. Free that much there, then run the stage again: it resumes from "
            + (f"{kept[-1].name} (kept until a newer checkpoint is complete)" if kept else "the start")) from e
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def check_plain(x: Any, where: str = "state") -> None:
    """Raise TypeError unless ``x`` is tensors and plain Python values (str, int, float, bool, None, bytes) in dicts,
    lists and tuples: what ``torch.load(weights_only=True)`` rebuilds. Exact types: a numpy float is a float
    subclass that only a full unpickler rebuilds."""
    if type(x) in _PLAIN_LEAVES or isinstance(x, torch.Tensor):
        return
    if type(x) in (dict, OrderedDict):
        for k, v in x.items():
            check_plain(k, f"{where} key {k!r}")
            check_plain(v, f"{where}[{k!r}]")
    elif type(x) in (list, tuple):
        for i, v in enumerate(x):
            check_plain(v, f"{where}[{i}]")
    else:
        raise TypeError(f"checkpoint {where} is a {type(x).__module__}.{type(x).__qualname__}: a checkpoint holds "
                        "tensors and plain Python values only (str, int, float, bool, None in dicts, lists, tuples), "
                        "so that it loads with torch.load(weights_only=True); convert it (e.g. float(x), "
                        "torch.from_numpy(a))")


def state_bytes(state: Any) -> int:
    """Bytes of the tensor storages in ``state`` (dicts, lists and tuples walked; a storage shared by several
    tensors counted once, as torch.save writes it): about the size of its checkpoint file."""
    seen: dict[tuple[str, int], int] = {}

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            seen[(str(x.device), storage.data_ptr())] = storage.nbytes()
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(state)
    return sum(seen.values())


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def list_checkpoints(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def load_latest(folder: str | Path) -> dict[str, Any] | None:
    """The newest readable checkpoint in ``folder`` (stray ``*.partial`` files are removed), or None. A damaged
    file is skipped for the previous one; one of an older distillpipe raises :class:`OutdatedCheckpoint`, one that
    is not a plain-weights checkpoint :class:`CheckpointRefused`."""
    folder = Path(folder)
    if folder.is_dir():
        for stray in folder.glob("*.partial"):
            stray.unlink(missing_ok=True)
    for path in reversed(list_checkpoints(folder)):
        try:
            state = read_checkpoint(path)
        except (OutdatedCheckpoint, CheckpointRefused):
            raise
        except Exception as e:  # a damaged file: fall back to the previous one, loudly
            log.warning("checkpoint %s is unreadable (%s); trying an older one", path,
                        (str(e).splitlines() or [type(e).__name__])[0])
            continue
        log.info("found checkpoint %s", path)
        return state
    return None


def read_checkpoint(path: Path) -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``; when that refuses the file, why (see the module docstring)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        found, parsed = pickle_globals(path)
        foreign = sorted(g for g in found if g not in _OLD_GLOBALS and not _torch_plain(g))
        if not foreign and (not parsed or not isinstance(e, pickle.UnpicklingError)):
            raise  # damaged: not a pickle, or a pickle whose tensors' records are missing
        if not foreign and found & _OLD_GLOBALS:
            raise OutdatedCheckpoint(f"checkpoint {path} was written by an older distillpipe (its RNG state is a numpy "
                                     "object, which a weights-only load refuses)") from None
        asks = ", ".join(foreign) if foreign else "objects a weights-only load refuses"
        raise CheckpointRefused(
            f"refusing checkpoint {path}: it is not a plain-weights checkpoint (its pickle asks for {asks}, which no "
            "distillpipe checkpoint holds), so it was not loaded and no code in it ran. It is not a damaged file "
            "(one of those is skipped for the previous checkpoint): something other than distillpipe wrote it, so "
            f"check who can write to {path.parent}. Then delete the file, or the whole folder {path.parent} to start "
            "the run over, and run the stage again") from None


def _torch_plain(name: str) -> bool:
    """Globals ``torch.save`` writes for tensors, storages and state dicts."""
    return name.startswith("torch.") or name in ("collections.OrderedDict", "_codecs.encode")


def pickle_globals(path: Path) -> tuple[set[str], bool]:
    """(the ``module.name`` of every global the checkpoint's pickle would import, whether the pickle parsed to its
    end), read by disassembling it with :mod:`pickletools`: nothing is imported or called. A ``torch.save`` file is
    a zip whose ``data.pkl`` holds the pickle; any other file is read as a bare pickle. A name the pickle computes
    (``STACK_GLOBAL`` from values not pushed as plain strings) is ``<computed>``."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
        else:
            data = Path(path).read_bytes()
    except Exception:
        return set(), False
    found: set[str] = set()
    pushed: list[Any] = []  # what each opcode pushed, approximately: strings, and None for anything else
    memo: dict[Any, Any] = {}
    try:
        for op, arg, _ in pickletools.genops(io.BytesIO(data)):
            if op.name in ("GLOBAL", "INST"):
                found.add(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL":
                module, name = (pushed[-2:] if len(pushed) >= 2 else [None, None])
                found.add(f"{module}.{name}" if isinstance(module, str) and isinstance(name, str) else "<computed>")
            if op.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                memo[len(memo) if op.name == "MEMOIZE" else arg] = pushed[-1] if pushed else None
            elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                pushed.append(memo.get(arg))
            elif op.name not in ("PROTO", "FRAME"):
                pushed.append(arg if op.name in _STRING_OPS else None)
    except Exception:
        return found, False
    return found, True


def clear_checkpoints(folder: str | Path) -> None:
    for p in list_checkpoints(folder):
        p.unlink(missing_ok=True)


def identity_changes(old: Any, new: dict[str, Any]) -> list[str]:
    """Names of the identity fields that differ (all of them for a checkpoint without an identity)."""
    if not isinstance(old, dict):
        return ["identity (a checkpoint of an older version)"]
    return [_why(k, old.get(k)) for k in new if old.get(k) != new[k]]


def _why(field: str, old: Any) -> str:
    """The field's name; for code identified by its bytes (bare digests, from before code fingerprints by meaning:
    ``identity.old_code_identity``, a sibling this layer cannot import), also why it differs."""
    values = old.values() if isinstance(old, dict) else [old]
    if field == "code" and old is not None and all(isinstance(v, str) and ":" not in v for v in values):
        return ("code (identified by its files' bytes before code fingerprints by meaning, docs/up-to-date.md: "
                "this once, the run starts over)")
    return field


def resume_or_restart(folder: str | Path, identity: dict[str, Any] | str, *, key: str, covers: str = "",
                      main: bool = True, barrier: Callable[[], None] | None = None) -> dict[str, Any] | None:
    """The newest checkpoint in ``folder`` when the run that wrote it had this ``identity`` (which the checkpoint
    holds under ``key``); otherwise None, with the folder's checkpoints removed and a warning naming what differs.

    ``identity``: a dict of digests, whose changed fields are named; or one digest of everything, for which
    ``covers`` says what went into it. Under torchrun every process calls this: ``main`` (rank 0) warns and
    removes, after ``barrier`` has let every process read the checkpoint."""
    try:
        state = load_latest(folder)
    except OutdatedCheckpoint as e:
        return _restart(folder, str(e), main, barrier)
    if state is None:
        return None
    old = state.get(key)
    changed = identity_changes(old, identity) if isinstance(identity, dict) else [] if old == identity else [covers]
    if not changed:
        return state
    return _restart(folder, f"checkpoint in {folder} was made with other {', '.join(changed)}", main, barrier)


def _restart(folder: str | Path, why: str, main: bool, barrier: Callable[[], None] | None) -> None:
    if main:
        log.warning("%s: starting over", why)
    if barrier is not None:
        barrier()  # every process has read it before the main one removes it
    if main:
        clear_checkpoints(folder)
    return None


class Checkpointer:
    """A training loop's checkpoints: due by the clock, staged in host memory, written on a background thread.

    ``minutes`` is the wall-clock interval: :meth:`due` is true once it has passed since the last checkpoint began
    (or since the run started or resumed); 0 makes every step due (the resume tests use it). :meth:`save` copies the
    state's tensors into host buffers (kept for the next checkpoint: no fresh GBs each time), so the caller may
    change its weights as soon as it returns, and starts :func:`save_checkpoint` on a thread: the same atomic file
    (temp name, fsync, rename) and the same :class:`~distillpipe.errors.DiskFull` message, raised in the training
    thread by the next :meth:`due`, :meth:`save` or :meth:`wait`. A second :meth:`save` first waits for the write
    in flight. Use it as a context manager: leaving it waits for the last write (quietly when an error is already
    on its way out, so that error is the one reported). ``main=False`` (a DDP rank other than 0) writes nothing.

    Why a plain thread and not ``torch.distributed.checkpoint.async_save``: DCP writes a folder of shards plus
    metadata that only ``dcp.load`` reads back, in place, into a state dict built beforehand, and it needs a process
    group; our checkpoint is one file that ``torch.load(weights_only=True)`` reads on its own, renamed into place
    atomically, with the resume identity and logs beside the weights. What async_save adds is the staging copy to
    (pinned) host memory and a thread that writes it: both are here in a few lines. A thread and not a process,
    because the write is I/O (file writes and fsync release the GIL) and a process would need the state copied to
    it a second time.
    """

    def __init__(self, folder: str | Path, minutes: float, *, keep: int = 2, main: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        self.folder, self.interval_s, self.keep, self.main = Path(folder), 60.0 * minutes, keep, main
        self._clock = clock
        self._last = clock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict[tuple, torch.Tensor] = {}
        self.saved: list[int] = []
        """The steps whose checkpoint was started, in order (written unless an error was raised since)."""

    def due(self) -> bool:
        """True when the interval has passed since the last checkpoint; raises a failed write's error."""
        self._raise_failed()
        return self._clock() - self._last >= self.interval_s

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Stage ``state`` in host memory and write it as ``step-<step>.pt`` in the background."""
        self.wait()  # never two writes in flight; the staging buffers are free again
        self._last = self._clock()
        if not self.main:
            return
        check_plain(state)
        staged = self._stage(state, (), {})
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the non-blocking copies are in the buffers before the caller changes weights
        self.saved.append(step)
        self._thread = threading.Thread(target=self._write, args=(step, staged), name=f"checkpoint-{step}")
        self._thread.start()

    def wait(self) -> None:
        """Block until the write in flight is on disk; raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise_failed()

    def clear(self) -> None:
        """Wait for the write in flight, then remove every checkpoint (the stage's outputs are saved)."""
        self.wait()
        if self.main:
            clear_checkpoints(self.folder)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.wait()
        elif self._thread is not None:
            self._thread.join()  # the file is complete or removed; the error already leaving is the one to report

    def _write(self, step: int, staged: dict[str, Any]) -> None:
        try:
            save_checkpoint(self.folder, step, staged, self.keep)
        except BaseException as e:  # handed to the training thread
            self._error = e

    def _raise_failed(self) -> None:
        if self._error is not None and (self._thread is None or not self._thread.is_alive()):
            error, self._error, self._thread = self._error, None, None
            raise error

    def _stage(self, x: Any, path: tuple, memo: dict) -> Any:
        """A copy of ``x`` whose tensors are host buffers (reused per position in the state; one copy of a tensor
        that appears twice, such as tied weights, as torch.save would write it once)."""
        if isinstance(x, torch.Tensor):
            key = (x.device, x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape), tuple(x.stride()),
                   x.dtype)
            if key in memo:
                return memo[key]
            buf = self._buffers.get(path)
            if buf is None or buf.shape != x.shape or buf.dtype != x.dtype:
                buf = torch.empty(x.shape, dtype=x.dtype, pin_memory=x.is_cuda)
                self._buffers[path] = buf
            buf.copy_(x.detach(), non_blocking=x.is_cuda)  # synchronised once, after the whole state (save)
            memo[key] = buf
            return buf
        if isinstance(x, dict):
            return type(x)((k, self._stage(v, (*path, k), memo)) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return type(x)(self._stage(v, (*path, i), memo) for i, v in enumerate(x))
        return x  # a plain immutable value (check_plain made sure)


def measure_write_bandwidth(folder: str | Path, nbytes: int = 128 * 2**20) -> float:
    """Bytes a second that a checkpoint-like write reaches in ``folder`` now: ``nbytes`` of random data written to a
    fresh file and fsync'd (as :func:`save_checkpoint` does), then removed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)).numpy()
    fd, name = tempfile.mkstemp(dir=folder, suffix=".bandwidth")
    try:
        t0 = time.perf_counter()
        with os.fdopen(fd, "wb") as f:
            f.write(memoryview(data))
            f.flush()
            os.fsync(f.fileno())
        return nbytes / (time.perf_counter() - t0)
    finally:
        Path(name).unlink(missing_ok=True)


COPY_BYTES_PER_S = 2e9
"""A conservative rate of the staging copy into reused host buffers (memcpy; a GPU's copy to pinned memory is
faster): the only part of a background checkpoint that holds training up."""


def checkpoint_interval(checkpoint_bytes: int, write_bytes_per_s: float, *, share: float = 0.02,
                        at_least_minutes: float = 10.0) -> tuple[float, str]:
    """``(minutes, why)``: the checkpoint interval for a state of ``checkpoint_bytes`` on a disk that writes
    ``write_bytes_per_s``, so that checkpointing costs at most ``share`` of the run: ``at_least_minutes`` (what
    trainers use) unless the checkpoint is so large that even that costs more. Counted as cost: the staging copy
    (training waits for it) plus the whole write, as if the background write took its time from training (it shares
    the disk, memory bandwidth and, on a CPU run, the cores), so the bound holds with margin. Whole minutes."""
    stage_s = checkpoint_bytes / COPY_BYTES_PER_S
    write_s = checkpoint_bytes / write_bytes_per_s
    need = (stage_s + write_s) / share / 60
    minutes = float(max(at_least_minutes, math.ceil(need)))
    return minutes, (f"a checkpoint of {_mb(checkpoint_bytes)} costs ~{stage_s + write_s:.1f} s (copy "
                     f"{stage_s:.1f} s, write {write_s:.1f} s at {write_bytes_per_s / 1e6:,.0f} MB/s): every "
                     f"{minutes:g} min is {100 * (stage_s + write_s) / (60 * minutes):.2f}% of the run")
