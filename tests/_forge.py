"""Altering a teacher cache the way someone who can write a shared remote could: the teacher's verdicts flipped in
one shard of the logits, with every crc32c (each inner chunk's, the shard index's) and the shard's completion marker
recomputed to match, so that every check a store makes of itself passes."""

from __future__ import annotations

import json
from pathlib import Path

from distillpipe.store.codec import layout_codec
from distillpipe.store.reader import open_store
from distillpipe.store.shards import MARKER_DIR, read_marker, shard_key


def forged_shard(store: Path, shard: int, array: str = "logits") -> dict[str, bytes]:
    """{store-relative path: forged bytes} of shard ``shard``'s ``array`` file and its marker (nothing written)."""
    st = open_store(store)
    spec = st.stored[array]
    a, b = st.manifest.shard_rows_range(shard)
    rows = st.read([array], a, b)[array][:, ::-1].copy()  # (rows, classes): each row's classes swapped
    encoded = layout_codec(spec)[1].encode_parts(rows, a, st.n_rows)
    key = shard_key(spec, shard)
    marker = read_marker(store, shard)
    marker["files"][key] = {"crc32c": encoded.digest, "size": encoded.nbytes}
    return {key: encoded.to_bytes(),
            f"{MARKER_DIR}/{shard}.json": (json.dumps(marker, indent=1, sort_keys=True) + "\n").encode()}
