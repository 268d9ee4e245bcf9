"""A DVC cache shared through links (docs/sharing.md: `cache.type hardlink,symlink`,
`cache.shared group`): workspace outputs are links to the cache's files, so a stage that wrote into an existing
file would silently corrupt the cache for everyone. A teacher_cache build, a rebuild, a resumed build and a
training run must never modify a cache file in place: afterwards every file of the cache still has the md5 its
name says. Two clones sharing one cache dir build and check out without clobbering each other.

Two things keep the cache intact, and this test checks what they give together: DVC copies a persisted output
(the store) out of the cache before it re-runs its stage (`unprotect`; a run of this test with a store writer
sabotaged to write its manifest in place still passed), and the stages replace files by renames, never writing
into one (tests/store/test_store_writer.py::test_a_resume_and_a_rebuild_never_write_through_a_link fails for
that same sabotage)."""

import hashlib
import shutil

import pytest
import yaml
from _dvc import DVC, out, sh, tiny_params, working_tree_repo, write_params
from _tiny import make_tiny_bert_dir

from distillpipe.store.shards import marker_path

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")


def _shard_of(rel) -> int:
    """The shard a store file belongs to (-1: metadata)."""
    parts = rel.parts
    return int(parts[parts.index("c") + 1]) if "c" in parts[:-1] else -1


def _cache_damage(cache) -> list[str]:
    """Files of a DVC 3 cache (files/md5/xx/yyyy...) whose md5 is not their name."""
    bad, n = [], 0
    for p in (cache / "files" / "md5").rglob("*"):
        if p.is_file() and not p.name.endswith(".unpacked"):
            n += 1
            name = p.parent.name + p.name.removesuffix(".dir")
            if hashlib.md5(p.read_bytes()).hexdigest() != name:
                bad.append(str(p.relative_to(cache)))
    assert n > 10, f"only {n} files in the cache {cache}: the test ran nothing"
    return bad


@pytest.mark.slow  # ~2 min: two clones, five `dvc repro`s
@pytest.mark.parametrize("link", ["hardlink", "symlink"])
def test_link_caches_are_never_written_in_place(tmp_path, link):
    teacher = make_tiny_bert_dir(tmp_path / "tiny_teacher")
    cache = tmp_path / "shared-cache"
    a = working_tree_repo(tmp_path / "A")
    params = tiny_params(teacher)
    write_params(a, params)
    for repo in (a,):
        sh(repo, DVC, "cache", "dir", cache)
        sh(repo, DVC, "config", "cache.shared", "group")
        sh(repo, DVC, "config", "cache.type", link)
    store = a / "data/teacher/polarity.zarr"

    sh(a, DVC, "repro", "train@tiny")  # build: teacher_cache and a training run
    marker = marker_path(store, 0)
    assert marker.is_symlink() if link == "symlink" else marker.stat().st_nlink == 2  # outputs are links
    assert _cache_damage(cache) == []

    # resume: a build killed after its first shard (the other shards' markers and files gone), repro finishes it
    n_shards = len(list(marker_path(store, 0).parent.glob("*.json")))
    assert n_shards >= 2, n_shards
    later = [p for p in store.rglob("*") if p.is_file() and _shard_of(p.relative_to(store)) >= 1]
    for p in later + [marker_path(store, i) for i in range(1, n_shards)]:
        p.unlink()
    res = out(sh(a, DVC, "repro", "train@tiny"))
    assert "resuming teacher cache" in res, res
    assert _cache_damage(cache) == []

    # rebuild: a signal param changes the store's identity; the student re-trains on it
    params["teacher_cache"]["datasets"]["polarity"]["signals"].update(hidden_layers=[1], pool=2)
    write_params(a, params)
    res = out(sh(a, DVC, "repro", "train@tiny"))
    assert "Running stage 'teacher_cache@polarity'" in res and "Running stage 'train@tiny'" in res, res
    assert _cache_damage(cache) == []

    # a second clone on the same cache: checks out A's outputs from it, builds its own, and A's stay intact
    sh(a, "git", "add", "params.yaml", "dvc.lock", ".dvc/config")
    sh(a, "git", "commit", "-qm", "run")
    b = tmp_path / "B"
    sh(tmp_path, "git", "clone", "-q", str(a), str(b))
    sh(b, DVC, "cache", "dir", cache)
    sh(b, DVC, "checkout", "--with-deps", "train@tiny")
    assert "up to date" in out(sh(b, DVC, "status", "teacher_cache@polarity"))
    other = yaml.safe_load((b / "params.yaml").read_text())
    other["train"]["runs"]["tiny"]["optim"]["lr"] *= 2
    write_params(b, other)
    sh(b, DVC, "repro", "train@tiny")
    assert _cache_damage(cache) == []
    assert "up to date" in out(sh(a, DVC, "status", "train@tiny"))  # A's workspace still matches its lock
