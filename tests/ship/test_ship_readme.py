"""docs/use-your-student.md's commands use only options the commands have (a renamed option breaks this).

tests/test_docs.py checks every command line of every page with click's parser; this test adds what is particular
to this page: it shows exactly export and predict, and every `--option` its prose names is an option of a command."""

import re
import shlex
from pathlib import Path

import typer

from distillpipe.cli import app

PAGE = Path(__file__).resolve().parents[2] / "docs" / "use-your-student.md"


def _section() -> str:
    return PAGE.read_text()


def test_readme_commands_use_existing_options():
    commands = {c.name: c for c in typer.main.get_command(app).commands.values()}
    lines = [line.split("  #")[0] for line in _section().splitlines() if line.startswith("distillpipe ")]
    assert {shlex.split(line)[1] for line in lines} == {"export", "predict"}
    for line in lines:
        words = shlex.split(line.replace("$'", "'"))
        known = {o for p in commands[words[1]].params for o in p.opts}
        used = {w for w in words if w.startswith("--")}
        assert used <= known, (line, used - known)
    commands_part = _section().split("**Speed where people deploy.**")[0]  # the benchmark's options are its own
    for option in re.findall(r"`(--[a-z0-9-]+)", commands_part):
        assert any(option in {o for p in c.params for o in p.opts} for c in commands.values()), option
