"""``distillpipe fingerprint``: the ``fingerprint`` stage; each stage's code fingerprint, the code DVC sees.

Writes ``fingerprints/<script>.json`` for every stage script and ``fingerprints/students/<key>.json`` for every
student architecture (:mod:`distillpipe.fingerprints`): the fingerprint by meaning of each file the stage's code is
made of. Every other stage of ``dvc.yaml`` depends on its file instead of the source, so a comment re-runs this
stage only (seconds; it writes the same bytes) and an edit that changes behaviour re-runs exactly the stages whose
code holds it. ``--check`` writes nothing and exits 1 naming the files that are out of date.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import entry_point, user_errors
from distillpipe.fingerprints import FOLDER, STAGES, stage_scripts, stale, write

CHECK_HELP = "write nothing; exit 1 naming each fingerprint file that differs from the code"


@user_errors
def fingerprint(out: Annotated[Path, typer.Option(help="folder to write the fingerprint files into")] = Path(FOLDER),
                root: Annotated[Path, typer.Option(help="repository root (holds stages/ and src/)")] = Path("."),
                check: Annotated[bool, typer.Option("--check", help=CHECK_HELP)] = False) -> None:
    """Write each stage's code fingerprint (its import closure's files, by meaning: comments, docstrings and
    layout do not count) into fingerprints/; the stages depend on those files, not on the source."""
    if not stage_scripts(root):
        raise FileNotFoundError(f"no stage scripts in {root / STAGES} ({STAGES}/<stage>.py): run from the repository "
                                "root or pass --root")
    if check:
        differ = stale(root, out)
        if differ:
            typer.echo(f"{out}: out of date (run `distillpipe fingerprint` or `make deps`): {', '.join(differ)}",
                       err=True)
            raise typer.Exit(1)
        typer.echo(f"{out}: every fingerprint matches the code")
        return
    changed, removed = write(root, out)
    what = [f"changed {', '.join(changed)}"] if changed else []
    what += [f"removed {', '.join(removed)}"] if removed else []
    typer.echo(f"{out}: " + ("; ".join(what) if what else "no stage's code changed meaning"))


main = entry_point(fingerprint, "fingerprint")
