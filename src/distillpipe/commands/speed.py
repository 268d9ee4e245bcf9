"""``distillpipe speed``: the ``speed`` stage (sentences/s of a student and its teacher, side by side)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import ParamsOpt, RunOpt, entry_point, user_errors
from distillpipe.config.base import load_section
from distillpipe.config.speed import SpeedConfig
from distillpipe.evaluate.timing import time_run


@user_errors
def speed(run: RunOpt,
          student: Annotated[Path, typer.Option(help="trained student folder")],
          teacher: Annotated[Path, typer.Option(help="the teacher model folder to compare with")],
          out: Annotated[Path, typer.Option(help="timings JSON to write (not a result: it differs at every run)")],
          params: ParamsOpt = Path("params.yaml")) -> None:
    """Time a student and its teacher under the same protocol, back to back in one process."""
    r = time_run(run, load_section(params, "speed", SpeedConfig), student_dir=student, teacher_dir=teacher,
                 out_path=out)
    typer.echo(f"speed {run}: {r['student_sentences_per_s']:,.0f} vs {r['teacher_sentences_per_s']:,.0f} "
               f"sentences/s ({r['speedup']:.1f}x) on {r['device']}")


main = entry_point(speed, "speed")
