"""``distillpipe inspect``: show (and verify) a teacher cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import user_errors
from distillpipe.store.anchor import prove_store
from distillpipe.store.manifest import StoreDamaged
from distillpipe.store.reader import format_info, open_store


@user_errors
def inspect(store: Annotated[Path, typer.Argument(help="a teacher-cache store (data/teacher/<dataset>.zarr)")],
            verify: Annotated[bool, typer.Option(help="also check every file against the committed dvc.lock and "
                                                      "every shard file against its checksum")] = False,
            ) -> None:
    """Show a teacher cache: manifest, arrays, shapes, dtypes, shards, bytes per row, compression."""
    anchor, why = prove_store(store, recheck=True) if verify else (None, "")  # before anything reads its bytes
    st = open_store(store, allow_incomplete=True, check_files=False)
    typer.echo(format_info(st.info()))
    problems = st.verify(checksum=verify)
    if problems:  # exit 2 with the message training gives for the same damage
        raise StoreDamaged.of_shards(str(store), problems)
    typer.echo("verify: every completed shard matches its checksums" if verify
               else "every completed shard's files are present with their recorded sizes (--verify: checksums)")
    if anchor is not None:
        typer.echo(f"anchored: every file is the one the committed dvc.lock names ({anchor.stage} at "
                   f"{anchor.commit[:10]}, {anchor.listing}, {len(anchor.files)} files, md5 of each read)")
    elif verify:
        typer.echo(f"unanchored: {why}; the checksums catch damage, not an altered copy (commit dvc.lock to anchor "
                   "it: docs/sharing.md)")
