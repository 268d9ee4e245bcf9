"""Progress bars written to a file redraw rarely; on a terminal they behave as tqdm does."""

from __future__ import annotations

import io
import time

from tqdm import tqdm

from distillpipe.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _redraws(bar_cls, stream, steps: int = 80) -> int:
    with bar_cls(total=steps, file=stream, desc="x") as bar:
        for _ in range(steps):
            time.sleep(0.01)
            bar.update()
    return stream.getvalue().count("\r")


def test_a_bar_into_a_file_draws_only_its_first_and_last_lines(monkeypatch):
    monkeypatch.delenv("DISTILLPIPE_PROGRESS_SECONDS", raising=False)
    # the same loop through plain tqdm, redrawing every 5 ms, draws many lines: the reference
    plain = io.StringIO()
    with tqdm(total=40, file=plain, mininterval=0.005, desc="x") as bar:
        for _ in range(40):
            time.sleep(0.01)
            bar.update()
    assert plain.getvalue().count("\r") > 10
    assert _redraws(Progress, io.StringIO()) <= 3  # initial, final (and close)


def test_the_interval_is_a_setting_and_terminals_keep_tqdms_default(monkeypatch):
    monkeypatch.setenv("DISTILLPIPE_PROGRESS_SECONDS", "0.02")
    assert Progress(total=1, file=io.StringIO()).mininterval == 0.02
    monkeypatch.setenv("DISTILLPIPE_PROGRESS_SECONDS", "30")
    assert Progress(total=1, file=_Terminal()).mininterval == tqdm(total=1, file=_Terminal()).mininterval
