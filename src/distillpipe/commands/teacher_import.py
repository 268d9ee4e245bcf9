"""``distillpipe teacher-import``: the ``teacher_import`` stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import ParamsOpt, entry_point, named_entry, user_errors
from distillpipe.config.base import load_params, load_section
from distillpipe.config.teacher_import import TeacherImportConfig
from distillpipe.teacher.arch import teacher_signals
from distillpipe.teacher.importer import import_teacher


@user_errors
def teacher_import(name: Annotated[str, typer.Option(help="a key of teacher_import.models")],
                   out: Annotated[Path, typer.Option(help="output folder (models/teacher/<name>)")],
                   params: ParamsOpt = Path("params.yaml")) -> None:
    """Save a teacher (embedded, local or hub) into a DVC-tracked model folder."""
    cfg = load_section(params, "teacher_import", TeacherImportConfig)
    spec = named_entry(cfg, name, params, "teacher_import", "models")
    # refused here, before teacher_finetune spends hours on a teacher whose cache cannot be built (arch.py)
    typer.echo(import_teacher(spec, out, teacher_signals(load_params(params), name)))


main = entry_point(teacher_import, "teacher-import")
