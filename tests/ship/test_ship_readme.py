"""The README's "Use your student" commands use only options the commands have (a renamed option breaks this)."""

import re
import shlex
from pathlib import Path

import typer

from distillpipe.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"


def _section() -> str:
    text = README.read_text()
    start = text.index("## Use your student")
    return text[start:text.index("\n## ", start + 1)]


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
    for option in re.findall(r"`(--[a-z-]+)", commands_part):
        assert any(option in {o for p in c.params for o in p.opts} for c in commands.values()), option
