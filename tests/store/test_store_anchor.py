"""store/anchor.py in a real git + DVC repository (`tests/_remotes.py`'s stage that outputs a teacher cache): what
makes a store anchored or unanchored, that a proof is remembered per clone and never hides a later change, and the
message for each way a file can differ from what the committed dvc.lock names. Over real remotes (a directory,
SFTP, S3): tests/test_dvc_remote_trust.py."""

import logging
import os
import shutil

import pytest
from _dvc import DVC, sh
from _forge import forged_shard
from _remotes import STORE, listing_of, small_store, store_repo

from distillpipe.store.anchor import StoreAltered, prove_store

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory):
    return small_store(tmp_path_factory.mktemp("store") / "toy.zarr")


def test_unanchored_stores_are_used_and_say_why(tmp_path, toy_store, caplog):
    caplog.set_level(logging.WARNING)
    assert prove_store(toy_store) == (None, "not inside a DVC repository")
    assert f"teacher cache {toy_store} is unanchored (not inside a DVC repository)" in caplog.text

    a = store_repo(tmp_path / "A", toy_store)
    assert prove_store(a / STORE)[0] is not None  # committed: anchored
    sh(a, "git", "rm", "-q", "--cached", "dvc.lock")
    sh(a, "git", "commit", "-qm", "forget the lock")
    assert prove_store(a / STORE) == (None, "dvc.lock is not committed to git")
    sh(a, "git", "add", "dvc.lock")
    sh(a, "git", "commit", "-qm", "the lock again")
    forged = forged_shard(a / "seed" / "toy.zarr", 1)  # a new build here: other bytes, not yet committed
    for rel, data in forged.items():
        (a / "seed" / "toy.zarr" / rel).write_bytes(data)
    sh(a, DVC, "repro", "-q", "teacher_cache")
    assert prove_store(a / STORE) == (
        None, "it was built here after the last commit: dvc.lock's teacher_cache differs from git's")
    sh(a, "git", "commit", "-qam", "rebuilt")
    assert prove_store(a / STORE)[0].listing == f"{_md5_of_listing(a)}"  # committed: anchored again


def _md5_of_listing(repo):
    import yaml

    return yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["teacher_cache"]["outs"][0]["md5"]


def test_a_proof_is_remembered_per_clone_and_never_hides_a_change(tmp_path, toy_store, caplog):
    caplog.set_level(logging.INFO)
    a = store_repo(tmp_path / "A", toy_store)
    store = a / STORE
    n = len(listing_of(a))
    prove_store(store)
    assert f"{n} files, {n} hashed" in caplog.text
    caplog.clear()
    prove_store(store)
    assert f"{n} files, 0 hashed" in caplog.text and f"{n} unchanged since proved" in caplog.text
    caplog.clear()
    prove_store(store, recheck=True)  # inspect --verify reads every file again
    assert f"{n} files, {n} hashed" in caplog.text

    # rewritten in place with the same size and mtime: the ctime still tells, and the cache's copy is intact
    target = store / "logits" / "c" / "2" / "0"
    st = target.stat()
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.chmod(0o644)
    target.write_bytes(bytes(data))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(StoreAltered) as e:
        prove_store(store)
    assert str(e.value).startswith(f"teacher cache {STORE}: logits shard 2 (logits/c/2/0) is not the file the "
                                   "committed dvc.lock names (teacher_cache at ")
    assert "it changed in the workspace after checkout" in str(e.value)
    assert f"delete {STORE}/logits/c/2/0 and run `dvc checkout {STORE}`" in str(e.value) and "\n" not in str(e.value)
    target.unlink()  # (DVC itself trusts size and mtime: `dvc checkout --force` alone would keep this file)
    sh(a, DVC, "checkout", "-q", STORE)
    prove_store(store)  # restored

    (store / "logits" / "c" / "9").write_bytes(b"x")  # a file the listing does not name
    with pytest.raises(StoreAltered, match=r"holds logits shard 9 \(logits/c/9\), which the committed dvc.lock's "):
        prove_store(store)
    (store / "logits" / "c" / "9").unlink()
    (store / "shards_done" / "0.json").unlink()
    with pytest.raises(StoreAltered, match=r"lacks the completion marker of shard 0 \(shards_done/0.json\), which "
                                           r"this clone's DVC cache holds: run `dvc checkout --force"):
        prove_store(store)


def test_an_altered_cache_object_and_listing_are_named_as_such(tmp_path, toy_store):
    """What a pull without verification leaves: the DVC cache holds altered bytes under the object's name."""
    a = store_repo(tmp_path / "A", toy_store)
    listing = listing_of(a)
    cache = a / ".dvc" / "cache" / "files" / "md5"
    for rel, data in forged_shard(a / STORE, 0).items():
        for path in (cache / listing[rel][:2] / listing[rel][2:], a / STORE / rel):
            path.chmod(0o644)
            path.write_bytes(data)
    with pytest.raises(StoreAltered) as e:
        prove_store(a / STORE)
    obj = cache / listing["logits/c/0/0"][:2] / listing["logits/c/0/0"][2:]
    assert "logits shard 0 (logits/c/0/0; and 1 more: the completion marker of shard 0)" in str(e.value)
    assert f"it came from no default remote through this clone's DVC cache ({obj}), which holds altered bytes" \
           in str(e.value)
    assert f"Delete {obj}" in str(e.value) and "dvc repro -f teacher_cache" in str(e.value)

    d = _md5_of_listing(a)
    (cache / d[:2] / d[2:]).chmod(0o644)
    (cache / d[:2] / d[2:]).write_text("[]")
    with pytest.raises(StoreAltered, match=r"the listing of its files in this clone's DVC cache \(.*\) has md5 "):
        prove_store(a / STORE)
