"""Store test fixtures: one reference store written without interruption, shared by the tests."""

import shutil
from pathlib import Path

import pytest
from store_helpers import shard_arrays, tiny_manifest

from distillpipe.store.resume import create_or_resume


@pytest.fixture(scope="session")
def reference_store(tmp_path_factory) -> Path:
    """500 rows in 4 shards of 128 (the last one 116 rows), written in-process in one go."""
    path = tmp_path_factory.mktemp("reference") / "ref.zarr"
    manifest = tiny_manifest()
    writer = create_or_resume(path, manifest)
    for i in writer.pending_shards():
        writer.write_shard(i, shard_arrays(manifest, i))
    writer.finalize()
    return path


@pytest.fixture
def store_copy(reference_store, tmp_path) -> Path:
    """A private copy of the reference store to damage."""
    path = tmp_path / "copy.zarr"
    shutil.copytree(reference_store, path)
    return path
