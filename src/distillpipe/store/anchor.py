"""Anchoring a teacher cache in git: proof that a store's files are the ones the committed ``dvc.lock`` names.

A store's own checks (sizes, crc32c values, completion markers: :mod:`distillpipe.store.shards`) catch damage, not
alteration: crc32c is public and linear, so whoever can write a shared DVC remote can rewrite a shard file and its
marker so that every one of them matches. What that person cannot rewrite is git. The chain of trust:

1. ``dvc.lock`` at the git commit checked out (``HEAD``) names the store's output by the md5 of its file listing
   (``<md5>.dir``, an object of the DVC cache: a JSON list of every file's path and md5);
2. the listing's bytes must have that md5, so every file's md5 in it is anchored too;
3. every file of the store must have the md5 its listing gives (markers, metadata and shard files alike).

:func:`prove_store` checks all three (DVC's md5, so that nothing is added to the store's format and the digests are
the ones DVC computed when the builder committed the store), reading every file once, in parallel, and records in
this clone's ``.dvc/tmp`` what it proved: each file by (device, inode, size, mtime, ctime), the stamp git's index
and DVC's own state trust. A file whose stamp is unchanged is not read again, so a training run on a store already
proved on this machine pays one ``stat`` per file, and only a store that changed (pulled, checked out, rebuilt) is
hashed again. Nothing on a remote can change a stamp here without writing the file here, and any write changes its
ctime. ``benchmarks/store_trust.py`` measures what each digest would cost per epoch and what this costs.

A store is **unanchored** when git cannot vouch for it: not inside a DVC repository, ``dvc.lock`` not committed, no
output of the committed ``dvc.lock`` at its path, or the workspace's ``dvc.lock`` names other content than the
commit's (built here after the last commit). It is used as before, and the log says so. A mismatch raises
:class:`StoreAltered`: one line naming the file (array and shard), where it came from (this clone's DVC cache, which
DVC fills from the default remote) and what to do.

:func:`explain_missing` says the same for a store that ``dvc pull`` did not check out: DVC's ``verify = true`` refuses
an object whose bytes are not its name, and then says only "Is your cache up to date?".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from distillpipe.errors import UserError
from distillpipe.progress import Progress

log = logging.getLogger(__name__)

WITNESS_DIR = "distillpipe-trust"
"""Under the clone's ``.dvc/tmp`` (git-ignored, never pushed): what :func:`prove_store` proved, per store."""
_SHARD_FILE = re.compile(r"^(?P<array>.+)/c/(?P<shard>\d+)(?:/0)*$")
_MARKER = re.compile(r"^shards_done/(?P<shard>\d+)\.json$")


class StoreAltered(UserError, RuntimeError):
    """A store's files are not the ones the committed ``dvc.lock`` names (one line: array, shard, source, fix)."""


@dataclass(frozen=True)
class Anchor:
    """What git says a store holds: the output of a committed ``dvc.lock`` stage and its file listing."""

    store: Path
    path: str
    """The store's path as ``dvc.lock`` names it (relative to the repository root)."""
    stage: str
    commit: str
    listing: str
    """``<md5>.dir``: the listing's name in the DVC cache."""
    files: Mapping[str, str]
    """{store-relative path: md5}."""
    cache: Path
    """This clone's DVC cache folder."""
    legacy: bool
    """An output of DVC 2 (its objects lie in the cache's root, not in ``files/md5``)."""
    source: str
    """Where DVC gets objects it lacks: the default remote, in words."""
    remote: str
    """The default remote's name (``<remote>`` when there is none)."""
    witness: Path

    def cache_path(self, md5: str) -> Path:
        """Where DVC keeps the object ``md5`` in this clone's cache (DVC 3's layout: ``dvc.cache``)."""
        return (self.cache if self.legacy else self.cache / "files" / "md5") / md5[:2] / md5[2:]


def prove_store(store: str | Path, *, recheck: bool = False, threads: int | None = None,
                what: str = "teacher cache") -> tuple[Anchor | None, str]:
    """Check that the files of ``store`` are the ones the committed ``dvc.lock`` names: (the anchor, ''), or (None,
    why) when the store is unanchored (logged as a WARNING). Raises :class:`StoreAltered` on any missing, extra or
    changed file, or a listing that is not the one named. ``recheck``: hash every file, even those this clone has
    proved unchanged since (``distillpipe inspect --verify``). Any folder a stage outputs is proved the same way:
    ``what`` names it in the messages (a run's live teacher: ``teacher``)."""
    store = Path(store)
    anchor, why = find_anchor(store, what)
    if anchor is None:
        checked = ("its files are checked against their own crc32c values only, which catch damage but not an "
                   "altered copy") if what == "teacher cache" else "nothing would catch an altered copy"
        log.warning("%s %s is unanchored (%s): %s; commit dvc.lock to anchor it", what, store, why, checked)
        return None, why
    on_disk = _files(anchor.store)
    missing = sorted(set(anchor.files) - set(on_disk))
    extra = sorted(set(on_disk) - set(anchor.files))
    if missing:
        raise StoreAltered(_missing_text(anchor, missing, what))
    if extra:
        raise StoreAltered(f"{what} {anchor.path} holds {_describe(extra[0])} ({extra[0]}"
                           f"{_more(extra)}), which the committed dvc.lock's listing of it ({anchor.stage}, "
                           f"{anchor.listing}) does not name: run `dvc checkout --force {anchor.path}`")
    known = {} if recheck else _read_witness(anchor)
    todo = [rel for rel in sorted(anchor.files) if known.get(rel) != list(on_disk[rel])]
    started, size = time.perf_counter(), sum(on_disk[rel][2] for rel in todo)
    with Progress(total=size, unit="B", unit_scale=True, desc=f"trust {anchor.path}", disable=size < 2**30) as bar:
        def check(rel: str) -> tuple[str, str, tuple | None]:
            digest, stamp = _md5(anchor.store / rel)
            bar.update(on_disk[rel][2])
            return rel, digest, stamp

        with ThreadPoolExecutor(max_workers=threads or len(os.sched_getaffinity(0))) as pool:
            results = list(pool.map(check, todo))
    bad = [rel for rel, digest, _ in results if digest != anchor.files[rel]]
    if bad:
        bad.sort(key=lambda rel: _MARKER.match(rel) is not None)  # name a data file before its marker
        raise StoreAltered(_altered_text(anchor, bad, what))
    proved = {rel: known[rel] for rel in anchor.files if rel not in todo}
    proved.update({rel: list(stamp) for rel, _, stamp in results if stamp is not None})
    _write_witness(anchor, proved)
    log.info("%s %s: every file is the one the committed dvc.lock names (%s at %s, %s): %d files, "
             "%d hashed (%.2f GB in %.1f s), %d unchanged since proved", what, anchor.path, anchor.stage,
             anchor.commit[:10], anchor.listing, len(anchor.files), len(todo), size / 1e9,
             time.perf_counter() - started, len(anchor.files) - len(todo))
    return anchor, ""


def find_anchor(store: str | Path, what: str = "teacher cache") -> tuple[Anchor | None, str]:
    """(the anchor of ``store``, '') or (None, why it is unanchored). Raises :class:`StoreAltered` when the committed
    ``dvc.lock`` names the store but this clone's DVC cache lacks its listing or holds another one under its name.

    Reads DVC's config (the cache folder, the default remote) and git (``dvc.lock`` at ``HEAD``) with DVC's own
    libraries, without opening the whole repository (~0.15 s a process, imports included, instead of ~0.6)."""
    from dvc.config import Config
    from scmrepo.exceptions import SCMError
    from scmrepo.git import Git

    store = Path(store).absolute()
    root = next((p for p in store.parents if (p / ".dvc").is_dir()), None)
    if root is None:
        return None, "not inside a DVC repository"
    path = store.relative_to(root).as_posix()
    config = Config(dvc_dir=str(root / ".dvc"))
    if config["core"].get("no_scm"):
        return None, "its DVC repository has no git (core.no_scm)"
    try:
        with Git(str(root)) as git:
            commit = git.get_rev()
            lock_in_git = Path(os.path.relpath(root / "dvc.lock", git.root_dir)).as_posix()
            fs = git.get_fs(commit)
            committed = fs.read_text(lock_in_git) if fs.exists(lock_in_git) else None
    except SCMError:  # no git repository, or no commit yet
        committed = None
    if committed is None:
        return None, "dvc.lock is not committed to git"
    entry = _output(committed, path)
    if entry is None:
        return None, f"no stage of the committed dvc.lock outputs {path}"
    stage, out = entry
    here = _output((root / "dvc.lock").read_text(), path) if (root / "dvc.lock").is_file() else None
    if here is None or here[1].get("md5") != out.get("md5"):
        return None, f"it was built here after the last commit: dvc.lock's {stage} differs from git's"
    remote = config["core"].get("remote")
    url = config["remote"].get(remote, {}).get("url") if remote else None
    witness = root / ".dvc" / "tmp" / WITNESS_DIR / f"{hashlib.sha256(path.encode()).hexdigest()[:16]}.json"
    anchor = Anchor(store=store, path=path, stage=stage, commit=commit, listing=str(out["md5"]), files={},
                    cache=Path(config["cache"].get("dir") or root / ".dvc" / "cache"),
                    legacy=out.get("hash") != "md5",
                    source=f"remote '{remote}' ({url})" if url else "no default remote", remote=remote or "<remote>",
                    witness=witness)
    return replace(anchor, files=_listing(anchor, what)), ""


def explain_missing(store: str | Path) -> str | None:
    """What to say when ``store`` is absent but the committed ``dvc.lock`` names it (None when it does not): which of
    its files this clone's DVC cache lacks, and why ``dvc pull`` may have left it out."""
    try:
        anchor, _ = find_anchor(store)
    except StoreAltered as e:
        return str(e)
    if anchor is None:
        return None
    return _missing_text(anchor, sorted(anchor.files))


# -- the chain's links -------------------------------------------------------------------------------------------------


def _output(lock_text: str, path: str) -> tuple[str, dict] | None:
    """(stage, out entry) of the output at ``path`` in a ``dvc.lock``'s text, or None."""
    lock = yaml.load(lock_text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    for stage, body in (lock.get("stages") or {}).items():
        for out in body.get("outs") or []:
            if Path(out.get("path", "")).as_posix() == path and str(out.get("md5", "")).endswith(".dir"):
                return stage, out
    return None


def _listing(anchor: Anchor, what: str) -> dict[str, str]:
    """{relative path: md5} from the listing object in this clone's DVC cache, after checking its md5."""
    where = Path(anchor.cache_path(anchor.listing))
    try:
        raw = where.read_bytes()
    except FileNotFoundError:
        raise StoreAltered(
            f"{what} {anchor.path} cannot be checked: this clone's DVC cache lacks the listing of its files "
            f"that the committed dvc.lock names ({anchor.stage}, {anchor.listing}): run `dvc pull --force "
            f"{anchor.path}` ({anchor.source})") from None
    digest = hashlib.md5(raw).hexdigest()
    if digest + ".dir" != anchor.listing:
        raise StoreAltered(
            f"{what} {anchor.path}: the listing of its files in this clone's DVC cache ({where}) has md5 "
            f"{digest}, not the {anchor.listing} the committed dvc.lock names ({anchor.stage}); it came from "
            f"{anchor.source}, altered there or on the way: delete {where} and run `dvc pull --force {anchor.path}` "
            f"with `verify = true` on the remote, or rebuild with `dvc repro -f {anchor.stage}` and `dvc push`")
    return {e["relpath"]: e["md5"] for e in json.loads(raw)}


def _files(root: Path) -> dict[str, tuple[int, ...]]:
    """{relative path: stamp} of every file under ``root``."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            out[Path(os.path.relpath(path, root)).as_posix()] = _stamp(os.stat(path))
    return out


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    """What changes whenever a file's bytes may have: (device, inode, size, mtime, ctime), in ns."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _md5(path: Path) -> tuple[str, tuple | None]:
    """(md5 of the file, its stamp if it did not change while read, else None)."""
    with open(path, "rb") as f:
        before = _stamp(os.fstat(f.fileno()))
        digest = hashlib.file_digest(f, "md5").hexdigest()
    after = _stamp(os.stat(path))
    return digest, before if before == after else None


def _read_witness(anchor: Anchor) -> dict[str, list]:
    try:
        record = json.loads(anchor.witness.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict) or record.get("listing") != anchor.listing or record.get("store") != anchor.path:
        return {}
    return record.get("files") or {}


def _write_witness(anchor: Anchor, files: dict[str, list]) -> None:
    text = json.dumps({"store": anchor.path, "listing": anchor.listing, "files": files})
    tmp = anchor.witness.with_name(f"{anchor.witness.name}.{os.getpid()}.partial")
    try:
        anchor.witness.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, anchor.witness)
    except OSError as e:  # a read-only clone proves again next time
        log.debug("could not record the proof of %s in %s: %s", anchor.path, anchor.witness, e)
        tmp.unlink(missing_ok=True)


# -- messages ----------------------------------------------------------------------------------------------------------


def _describe(rel: str) -> str:
    """A store file in words: 'logits shard 1', 'the completion marker of shard 1', 'logits metadata'."""
    if m := _SHARD_FILE.match(rel):
        return f"{m['array']} shard {m['shard']}"
    if m := _MARKER.match(rel):
        return f"the completion marker of shard {m['shard']}"
    if rel == "zarr.json":
        return "the manifest"
    if rel.endswith("/zarr.json"):
        return f"{rel[:-len('/zarr.json')]} metadata"
    return rel


def _more(rels: list[str]) -> str:
    if len(rels) == 1:
        return ""
    shown = ", ".join(_describe(r) for r in rels[1:4])
    return f"; and {len(rels) - 1} more: {shown}{', ...' if len(rels) > 4 else ''}"


def _altered_text(anchor: Anchor, bad: list[str], what: str) -> str:
    rel = bad[0]
    expected = anchor.files[rel]
    obj = Path(anchor.cache_path(expected))
    head = (f"{what} {anchor.path}: {_describe(rel)} ({rel}{_more(bad)}) is not the file the committed "
            f"dvc.lock names ({anchor.stage} at {anchor.commit[:10]}: md5 {expected})")
    try:
        same = obj.samefile(anchor.store / rel)
        cached = None if same else hashlib.md5(obj.read_bytes()).hexdigest()
    except FileNotFoundError:
        return (f"{head}; this clone's DVC cache lacks it: run `dvc pull --force {anchor.path}` ({anchor.source}), "
                f"or rebuild it with `dvc repro -f {anchor.stage}`")
    if not same and cached == expected:
        return (f"{head}; it changed in the workspace after checkout (the DVC cache holds the right bytes): delete "
                f"{anchor.path}/{rel} and run `dvc checkout {anchor.path}`")
    return (f"{head}; it came from {anchor.source} through this clone's DVC cache ({obj}), which holds altered "
            f"bytes under that name: the remote's copy was altered or damaged. Delete {obj}, set `dvc remote modify "
            f"{anchor.remote} verify true` and run `dvc pull --force {anchor.path}` (DVC then refuses an altered "
            f"copy), or rebuild it with `dvc repro -f {anchor.stage}` and `dvc push`")


def _missing_text(anchor: Anchor, missing: list[str], what: str) -> str:
    uncached = [rel for rel in missing if not Path(anchor.cache_path(anchor.files[rel])).exists()]
    if not uncached:
        return (f"{what} {anchor.path} lacks {_describe(missing[0])} ({missing[0]}{_more(missing)}), which "
                f"this clone's DVC cache holds: run `dvc checkout --force {anchor.path}`")
    return (f"{what} {anchor.path}: this clone's DVC cache lacks {_describe(uncached[0])} ({uncached[0]}, md5 "
            f"{anchor.files[uncached[0]]}{_more(uncached)}) of the committed dvc.lock ({anchor.stage}): run `dvc pull "
            f"{anchor.path}`. If `dvc pull` said 'Is your cache up to date?', DVC refused a copy from {anchor.source} "
            f"whose bytes are not its md5 (`verify = true`): the remote's copy was altered or damaged; rebuild it "
            f"with `dvc repro -f {anchor.stage}` and `dvc push`")
