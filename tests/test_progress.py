"""Progress bars written to a file redraw rarely; on a terminal they behave as tqdm does."""

from __future__ import annotations

import io
import time

from tqdm import tqdm

from distillpipe.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _redraws(bar_cls, stream, steps: int = 80, postfix: bool = False) -> int:
    with bar_cls(total=steps, file=stream, desc="x") as bar:
        for i in range(steps):
            time.sleep(0.01)
            bar.update()
            if postfix:  # as the training loops show their loss
                bar.set_postfix(loss=f"{1 / (i + 1):.3f}")
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
    # a postfix set at every step does not redraw either (tqdm's set_postfix refreshes by default)
    assert _redraws(tqdm, io.StringIO(), 20, postfix=True) >= 20
    out = io.StringIO()
    assert _redraws(Progress, out, postfix=True) <= 3 and "loss=0.013" in out.getvalue()  # the last one shows


def test_the_interval_is_a_setting_and_terminals_keep_tqdms_default(monkeypatch):
    monkeypatch.setenv("DISTILLPIPE_PROGRESS_SECONDS", "0.02")
    assert Progress(total=1, file=io.StringIO()).mininterval == 0.02
    monkeypatch.setenv("DISTILLPIPE_PROGRESS_SECONDS", "30")
    assert Progress(total=1, file=_Terminal()).mininterval == tqdm(total=1, file=_Terminal()).mininterval
