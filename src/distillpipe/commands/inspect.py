"""``distillpipe inspect``: show (and verify) a teacher cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import user_errors
from distillpipe.store.manifest import StoreDamaged
from distillpipe.store.reader import format_info, open_store


@user_errors
def inspect(store: Annotated[Path, typer.Argument(help="a teacher-cache store (data/teacher/<dataset>.zarr)")],
            verify: Annotated[bool, typer.Option(help="also check every shard file against its checksum")] = False,
            ) -> None:
    """Show a teacher cache: manifest, arrays, shapes, dtypes, shards, bytes per row, compression."""
    st = open_store(store, allow_incomplete=True, check_files=False)
    typer.echo(format_info(st.info()))
    problems = st.verify(checksum=verify)
    if problems:  # exit 2 with the message training gives for the same damage
        raise StoreDamaged.of_shards(str(store), problems)
    typer.echo("verify: every completed shard matches its checksums" if verify
               else "every completed shard's files are present with their recorded sizes (--verify: checksums)")
