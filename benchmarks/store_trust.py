"""What proving a teacher cache against git costs (``distillpipe.store.anchor``), beside a cached epoch's read.

Builds a synthetic store shaped like a MiniLM-L6 general-distillation cache (the one of ``store_loader.py``: hidden
states of 2 layers and attention scores of 1, pooled 4x, ~74 KB a row) as the output of a stage of a real DVC
repository in a temp folder, commits its ``dvc.lock`` to git, and prints, measured side by side in one run:

1. each digest's speed on one core (GB/s, from the page cache, as a check would read the files): crc32c (what the
   store checks itself with), md5 (DVC's, what ``dvc.lock`` anchors), sha256 (OpenSSL, with the CPU's SHA extensions
   when it has them), BLAKE3 (one thread);
2. a cached epoch's read: the block loader over every row, the files in the page cache (the best of 3 epochs);
3. what each digest would cost if every byte were checked on every epoch's read, as a share of that epoch;
4. what ``prove_store`` costs: the first time (every file's md5, on every core: once per pulled or rebuilt store on a
   machine) and then every time (one ``stat`` a file, the files' stamps compared with what this clone proved), plus
   what a fresh process pays once to read DVC's config and git (measured in a subprocess).

``prove_store`` runs once per training run, before its first epoch, not per epoch.

Usage: python benchmarks/store_trust.py [n_rows]   (default 8192 rows, ~590 MB)
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import crc32c
from store_loader import synthetic

from distillpipe.store.anchor import prove_store
from distillpipe.store.loader import BlockLoader
from distillpipe.store.manifest import Manifest, TeacherInfo
from distillpipe.store.resume import create_or_resume
from distillpipe.store.schema import SignalSpec

STORE = "data/teacher/bench.zarr"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))


def _digests() -> dict[str, object]:
    out = {"crc32c": lambda f: crc32c.crc32c(f.read()), "md5": lambda f: hashlib.file_digest(f, "md5"),
           "sha256": lambda f: hashlib.file_digest(f, "sha256")}
    try:
        import blake3

        out["blake3"] = lambda f: blake3.blake3(f.read()).digest()
    except ImportError:
        print("(blake3 is not installed: pip install -e '.[dev]')")
    return out


def _repo(root: Path, n_rows: int) -> Path:
    """A git + DVC repository whose committed dvc.lock names a synthetic store built by its one stage."""
    dvc = str(Path(sys.executable).parent / "dvc")
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@example.com"}

    def sh(*cmd):
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)

    root.mkdir()
    sh("git", "init", "-q")
    sh(dvc, "init", "-q")
    spec = SignalSpec(max_seq_len=128, pool=4, task="classification", n_classes=2, vocab_size=30522, mlm_topk=0,
                      mlm_max_masked=0, hidden_layers=(3, 6), hidden_size=384, attn_layers=(6,), n_heads=12,
                      attn_probs_layers=(), embedding_size=0)  # fmt: skip
    teacher = TeacherInfo(name="synthetic", weights_sha256="0" * 64, tokenizer_sha256="0" * 64, config={})
    manifest = Manifest(teacher=teacher, tokens_fingerprint="bench", split="train", signals=spec,
                        compute={"precision": "fp32"}, code={}, n_rows=n_rows, shard_rows=1024)
    writer = create_or_resume(root / STORE, manifest)
    for i in writer.pending_shards():
        writer.write_shard(i, synthetic(manifest, i))
    writer.finalize()
    (root / f"{STORE}.lock").unlink(missing_ok=True)
    (root / "dvc.yaml").write_text(f"stages:\n  bench:\n    cmd: 'true'\n    outs: [{STORE}]\n")
    (root / ".gitignore").write_text("/data\n")
    sh(dvc, "commit", "-f", "-q", "bench")  # DVC hashes the store: dvc.lock and the listing in the cache
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "bench store")
    return root


def _best(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(n_rows: int) -> None:
    logging.basicConfig(level=logging.WARNING)
    flags = _cpu_flags()
    cores = len(os.sched_getaffinity(0))
    print(f"CPU: {cores} cores, SHA extensions {'yes' if 'sha_ni' in flags else 'no'}, "
          f"AVX-512 {'yes' if 'avx512f' in flags else 'no'}; load average {os.getloadavg()[0]:.1f}")
    print("Ratios are measured side by side in this run; absolute numbers depend on the machine and its load.")
    with tempfile.TemporaryDirectory() as tmp:
        repo = _repo(Path(tmp) / "repo", n_rows)
        store = repo / STORE
        files = sorted(p for p in store.rglob("*") if p.is_file())
        total = sum(p.stat().st_size for p in files)
        print(f"store: {n_rows:,} rows, {len(files):,} files, {total / 1e9:.3f} GB (in the page cache)")

        names = _arrays(store)
        loader = BlockLoader(store, names, block_rows=256, buffer_blocks=4, seed=0, expected=None, batch_size=64,
                             streams=1)
        sum(len(r) for r, _ in loader)  # warm: pages, buffers
        epoch = _best(lambda: sum(len(r) for r, _ in loader))
        print(f"\ncached epoch's read (block loader, {cores} codec threads): {epoch:.3f} s, {total / epoch / 1e9:.2f} "
              "GB/s")

        print(f"\n{'digest':<8} {'GB/s a core':>11} {'every byte, every epoch':>24}")
        for name, digest in _digests().items():
            def run(digest=digest):
                for p in files:
                    with open(p, "rb") as f:
                        digest(f)

            seconds = _best(run)
            print(f"{name:<8} {total / seconds / 1e9:>11.2f} {seconds / epoch:>23.0%}")

        os.chdir(repo)  # as a stage runs: in the repository
        witness = repo / ".dvc" / "tmp" / "distillpipe-trust"
        first = _best(lambda: (shutil.rmtree(witness, ignore_errors=True), prove_store(STORE)), repeats=2)
        again = _best(lambda: prove_store(STORE), repeats=5)
        print(f"\nprove_store, first time on this machine (md5 of every file on {cores} threads): {first:.3f} s = "
              f"{first / epoch:.0%} of one cached epoch's read, once per pulled or rebuilt store")
        code = ("import time; from distillpipe.store.anchor import prove_store; t = time.perf_counter(); "
                f"prove_store({STORE!r}); print(time.perf_counter() - t)")
        fresh = min(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                          .stdout) for _ in range(3))
        print(f"prove_store, every later run (one stat a file against this clone's record): {again * 1e3:.1f} ms = "
              f"{again / epoch:.1%} of a cached epoch's read (budget: 5%), plus {fresh - again:.2f} s once a process "
              "(DVC's config and git read, their imports), whatever the store's size")


def _arrays(store: Path) -> list[str]:
    """The arrays a training run reads: every array but the row index and lengths."""
    return sorted(p.parent.relative_to(store).as_posix() for p in store.rglob("zarr.json")
                  if p.parent != store and (p.parent / "c").is_dir() and p.parent.name not in ("row_index", "length"))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8192)
