"""Store test fixtures: one reference store written without interruption, shared by the tests."""

import shutil
from pathlib import Path

import pytest
from store_helpers import build_store, tiny_manifest


@pytest.fixture(scope="session")
def reference_store(tmp_path_factory) -> Path:
    """500 rows in 4 shards of 128 (the last one 116 rows), written in-process in one go."""
    return build_store(tmp_path_factory.mktemp("reference") / "ref.zarr", tiny_manifest())


@pytest.fixture
def store_copy(reference_store, tmp_path) -> Path:
    """A private copy of the reference store to damage."""
    path = tmp_path / "copy.zarr"
    shutil.copytree(reference_store, path)
    return path
