"""Progress bars for long stages, fit for where their output goes.

On a terminal a bar redraws as usual. When stderr is a file or a pipe (``dvc repro > log``, CI, a SLURM
job) every redraw would be one more carriage-return line, megabytes for a long stage, so the bar then
prints at most once every ``DISTILLPIPE_PROGRESS_SECONDS`` seconds (30 by default), plus its first and
last lines.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from tqdm.auto import tqdm

NOT_A_TTY_SECONDS = 30.0


def _interval() -> float:
    raw = os.environ.get("DISTILLPIPE_PROGRESS_SECONDS", "")
    try:
        return float(raw) if raw else NOT_A_TTY_SECONDS
    except ValueError:
        return NOT_A_TTY_SECONDS


class Progress(tqdm):
    """``tqdm`` that redraws at most every ``DISTILLPIPE_PROGRESS_SECONDS`` when its stream is not a TTY."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        stream = kwargs.get("file") or sys.stderr
        self._rate_limited = not getattr(stream, "isatty", lambda: False)()
        if self._rate_limited:
            seconds = _interval()
            kwargs.setdefault("mininterval", seconds)
            kwargs.setdefault("maxinterval", seconds)  # tqdm's monitor would otherwise redraw every 10 s
        super().__init__(*args, **kwargs)

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        """As tqdm's, but into a file the new postfix waits for the next timed redraw (tqdm's default redraws
        at every call: a loss shown every few steps would undo the rate limit)."""
        super().set_postfix(ordered_dict, refresh=refresh and not self._rate_limited, **kwargs)
