"""``distillpipe inspect``: show (and verify) a teacher cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import user_errors
from distillpipe.store.reader import format_info, open_store


@user_errors
def inspect(store: Annotated[Path, typer.Argument(help="a teacher-cache store (data/teacher/<dataset>.zarr)")],
            verify: Annotated[bool, typer.Option(help="also check every shard file against its checksum")] = False,
            ) -> None:
    """Show a teacher cache: manifest, arrays, shapes, dtypes, shards, bytes per row, compression."""
    st = open_store(store, allow_incomplete=True, check_files=False)
    typer.echo(format_info(st.info()))
    problems = st.verify(checksum=verify)
    if problems:
        for i, found in sorted(problems.items()):
            typer.secho(f"shard {i}: {'; '.join(found)}", fg=typer.colors.RED)
        typer.secho("the cache is damaged: `dvc checkout` it (or `dvc pull`), or re-run `dvc repro teacher_cache` "
                    "to recompute the damaged shards", fg=typer.colors.RED)
        raise typer.Exit(1)
    typer.echo("verify: every completed shard matches its checksums" if verify
               else "every completed shard's files are present with their recorded sizes (--verify: checksums)")
