"""One writer per store: a second writer is refused naming the owner, nothing of the first one's store is
touched, a lock left by a killed writer is taken over, and readers never use a store mid-build."""

import logging
import os
import signal
import subprocess
import sys

import pytest
from store_helpers import HERE, shard_arrays, tiny_manifest, tree_files

from distillpipe.store.lock import StoreLock, StoreLocked, lock_path
from distillpipe.store.reader import open_store
from distillpipe.store.resume import create_or_resume

HELPER = str(HERE / "store_helpers.py")


def _hold(path, n_rows=500, shard_rows=128):
    """A writer in another process that has created the store, written shard 0 and keeps the lock."""
    p = subprocess.Popen([sys.executable, HELPER, "hold", str(path), str(n_rows), str(shard_rows)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "holding", p.stderr.read()
    return p


def test_second_writer_is_refused_and_the_first_store_survives(tmp_path):
    path = tmp_path / "s.zarr"
    holder = _hold(path)
    try:
        before = tree_files(path)
        # other shard_rows: a second writer would have deleted and rebuilt the store under the first one
        with pytest.raises(StoreLocked, match=rf"being written by another process \(pid {holder.pid} on .*since"):
            create_or_resume(path, tiny_manifest(shard_rows=64))
        # another teacher: both would have "completed", one's logits under the other's manifest
        with pytest.raises(StoreLocked):
            create_or_resume(path, tiny_manifest(tokens_fingerprint="other"))
        assert tree_files(path) == before
        with pytest.raises(StoreLocked, match="being written right now"):
            open_store(path)  # readers do not use a store mid-build
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0, holder.stderr.read()
    writer = create_or_resume(path, tiny_manifest())  # released: the store resumes where the holder stopped
    assert writer.pending_shards() == [1, 2, 3]
    writer.close()


def test_lock_of_a_killed_writer_is_taken_over_with_a_warning(tmp_path, caplog):
    path = tmp_path / "s.zarr"
    holder = _hold(path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=60)
    assert str(holder.pid) in lock_path(path).read_text()  # the dead owner's record is still there
    with caplog.at_level(logging.WARNING, logger="distillpipe.store"):
        writer = create_or_resume(path, tiny_manifest())
    assert f"left by pid {holder.pid}" in caplog.text and "no longer holds it" in caplog.text
    assert writer.pending_shards() == [1, 2, 3]  # shard 0, written and marked before the kill, is kept
    for i in writer.pending_shards():
        writer.write_shard(i, shard_arrays(writer.manifest, i))
    writer.finalize()
    assert lock_path(path).read_text() == ""  # released cleanly: no owner recorded
    assert open_store(path).manifest.complete


def test_lock_is_beside_the_store_never_inside_it(tmp_path):
    """The store is a DVC output: a lock file inside it would change its hash."""
    path = tmp_path / "s.zarr"
    with StoreLock(path) as lock:
        assert lock.path == tmp_path / "s.zarr.lock" and lock.held
        with pytest.raises(StoreLocked):
            StoreLock(path).acquire()  # even from this process, through another open file
    assert not lock.held
    StoreLock(path).acquire().release()
