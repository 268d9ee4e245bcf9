"""The team's DVC remote over the three kinds of storage the tests run, each a real server or folder of the test's own:
a directory, SSH/SFTP (`tests/_sftp.py`) and S3 (`tests/_s3.py`). :func:`team_remote` yields a :class:`Remote` that
says how a clone connects to it and lets a test write an object on it directly, as someone who can write the remote
(not through DVC) would. Also a small DVC repository whose stage outputs a teacher cache (:func:`store_repo`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from _dvc import DVC, env, sh

KINDS = ("local", "sftp", "s3")
STORE = "data/teacher/toy.zarr"
STORE_YAML = """\
stages:
  teacher_cache:
    cmd: rm -rf {store} && mkdir -p data/teacher && cp -r seed/toy.zarr {store}
    deps: [seed/toy.zarr]
    outs: [{store}]
  other:
    cmd: mkdir -p models && python -c "open('models/other.bin', 'wb').write(bytes(range(256)) * 64)"
    outs: [models/other.bin]
  check:
    cmd: mkdir -p reports && cat {store}/zarr.json {store}/shards_done/*.json > reports/check.txt
    deps: [{store}]
    params: [check.note]
    outs: [reports/check.txt]
"""


@dataclass
class Remote:
    kind: str
    url: str
    options: dict[str, str]
    """`dvc remote modify --local` options (keys, endpoint): this machine's, not committed."""
    write: Callable[[str, bytes], None]
    """(object key under the remote's URL, bytes): write it on the remote directly."""
    server: object | None = None
    """The SFTP or S3 server: ``throttle_s`` slows what it receives, :meth:`received` counts it."""

    def received(self) -> int:
        """Files (SFTP) or objects (S3) the server has received whole since the count was last reset."""
        return getattr(self.server, "files_closed", None) or getattr(self.server, "objects_put", 0)

    def reset_count(self) -> None:
        for name in ("files_closed", "objects_put"):
            if hasattr(self.server, name):
                setattr(self.server, name, 0)


@contextmanager
def team_remote(kind: str, tmp: Path) -> Iterator[Remote]:
    if kind == "local":
        root = tmp / "remote"

        def write(key: str, data: bytes) -> None:
            path = root / key
            path.chmod(0o644)  # DVC leaves its objects read-only; the remote's owner can write them anyway
            path.write_bytes(data)

        yield Remote(kind, str(root), {}, write)
    elif kind == "sftp":
        from _sftp import SFTPServer

        root = tmp / "remote"
        with SFTPServer(tmp / "sftp") as server:
            def write_sftp(key: str, data: bytes) -> None:
                (root / key).chmod(0o644)
                (root / key).write_bytes(data)

            yield Remote(kind, server.url(root), server.remote_options(), write_sftp, server)
    elif kind == "s3":
        from _s3 import S3Server

        with S3Server() as server:
            client = server.client()
            prefix = "distillpipe"

            def write_s3(key: str, data: bytes) -> None:
                client.put_object(Bucket=server.bucket, Key=f"{prefix}/{key}", Body=data)

            yield Remote(kind, server.url(prefix), server.remote_options(), write_s3, server)
    else:
        raise ValueError(kind)


def killed_push(repo: Path, remote: Remote) -> int:
    """Start `dvc push` with the server slowed down, SIGKILL its process group once a few files have arrived:
    files in flight are cut off. Returns the count of files the server had received whole."""
    remote.server.throttle_s = 0.05 if remote.kind == "sftp" else 0.5
    remote.reset_count()
    log = repo.parent / f"{repo.name}-killed-push.log"
    with log.open("wb") as f:
        proc = subprocess.Popen([DVC, "push"], cwd=repo, env=env(), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + 120
        while remote.received() < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        ended = proc.poll()
        if ended is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    remote.server.throttle_s = 0.0
    assert ended is None, f"`dvc push` ended (status {ended}) before it could be killed:\n{log.read_text()}"
    return remote.received()


def connect(repo: Path, remote: Remote, *, verify: bool | None = None) -> None:
    """Point a clone at the remote: its URL (committed by the first clone), its options (this machine's)."""
    sh(repo, DVC, "remote", "add", "-f", "-d", "shared", remote.url)
    for k, v in remote.options.items():
        sh(repo, DVC, "remote", "modify", "--local", "shared", k, v)
    if verify is not None:
        sh(repo, DVC, "remote", "modify", "--local", "shared", "verify", str(verify).lower())


def small_store(path: Path, n_rows: int = 96, shard_rows: int = 32) -> Path:
    """A logits-only teacher cache of ``n_rows`` random rows at ``path``, written by the real writer: the store of a
    2-class task (row index, lengths, logits; ~16 files)."""
    import numpy as np

    from distillpipe.store.manifest import Manifest, TeacherInfo
    from distillpipe.store.resume import create_or_resume
    from distillpipe.store.schema import SignalSpec

    spec = SignalSpec(max_seq_len=16, pool=1, task="classification", n_classes=2, vocab_size=100, mlm_topk=0,
                      mlm_max_masked=0, hidden_layers=(), hidden_size=8, attn_layers=(), n_heads=2,
                      attn_probs_layers=(), embedding_size=0)  # fmt: skip
    teacher = TeacherInfo(name="tiny", weights_sha256="a" * 64, tokenizer_sha256="b" * 64, config={})
    manifest = Manifest(teacher=teacher, tokens_fingerprint="tokens", split="train", signals=spec,
                        compute={"precision": "fp32", "batch_size": 8}, code={}, n_rows=n_rows, shard_rows=shard_rows)
    writer = create_or_resume(path, manifest)
    rng = np.random.default_rng(0)
    for i in writer.pending_shards():
        a, b = manifest.shard_rows_range(i)
        writer.write_shard(i, {"row_index": np.arange(a, b, dtype=np.int64),
                               "length": rng.integers(4, 17, size=b - a).astype(np.int32),
                               "logits": rng.standard_normal((b - a, 2)).astype(np.float16)})
    writer.finalize()
    Path(f"{path}.lock").unlink(missing_ok=True)
    return path


def store_repo(dst: Path, store: Path, *, stages: tuple[str, ...] = ("teacher_cache",)) -> Path:
    """A git + DVC repository at ``dst`` whose stage ``teacher_cache`` outputs a copy of ``store`` (kept in git under
    ``seed/``, its dependency) at :data:`STORE`; stage ``other`` outputs a file nothing reads and stage ``check`` reads
    the store (its manifest and markers: no Python process, no seconds of imports). ``stages`` are run and committed
    with ``dvc.lock``."""
    dst.mkdir(parents=True)
    shutil.copytree(store, dst / "seed" / "toy.zarr")
    (dst / "dvc.yaml").write_text(STORE_YAML.format(store=STORE))
    (dst / "params.yaml").write_text("check:\n  note: first\n")
    sh(dst, "git", "init", "-q")
    sh(dst, DVC, "init", "-q")
    sh(dst, DVC, "config", "core.analytics", "false")
    sh(dst, DVC, "repro", "-q", *stages)
    sh(dst, "git", "add", "-A")
    sh(dst, "git", "commit", "-qm", "teacher cache")
    return dst


def remote_key(repo: Path, rel: str, store: str = STORE) -> str:
    """The remote's object key of ``store``'s file ``rel`` (store-relative), from the listing in ``repo``'s cache."""
    md5 = listing_of(repo, store)[rel]
    return f"files/md5/{md5[:2]}/{md5[2:]}"


def listing_of(repo: Path, store: str = STORE) -> dict[str, str]:
    """{store-relative path: md5} of ``store``, as the listing its dvc.lock entry names in ``repo``'s DVC cache says."""
    import yaml

    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    d = next(o["md5"] for stage in lock["stages"].values() for o in stage.get("outs", []) if o["path"] == store)
    return {e["relpath"]: e["md5"] for e in json.loads((repo / ".dvc/cache/files/md5" / d[:2] / d[2:]).read_text())}
