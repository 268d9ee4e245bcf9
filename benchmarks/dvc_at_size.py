"""DVC at size: the teacher_cache stage's DVC bookkeeping on a store of >= 20 GB, measured on this disk.

Builds a throwaway git + DVC repository (in ``--workdir``, default ``build/`` of this repository, so on its disk)
holding ``data/teacher/big.zarr`` in our real layout, written through our own writer (``create_or_resume`` +
``write_shard``: real shard files, markers and manifest) for a WaLDORf-like BERT-Large spec (L 384, d 1024, 16
heads; dense hidden states and attention scores of layers 6, 12, 18, 24 pooled 4x, QA logits: DVC's costs are per
GB, so the dense forms make the GBs quickest; the measurements in docs/at-scale.md also held the embedding output,
which stores now derive). Values are
random float16 (like real activations, they barely compress) masked like real rows (lengths 128-384: scores -inf
and the rest 0 past a row's length). A trivial stage in ``dvc.yaml`` has the store as its ``persist: true`` out,
as ``teacher_cache`` has. Then, each a subprocess, with the page cache of every file in the work folder dropped
first (``posix_fadvise``: a 100 GB store does not fit in RAM either), it times

  * ``dvc commit -f`` (hashing + filling .dvc/cache) for each cache.type (reflink only where the filesystem has it),
  * ``dvc status`` on the unchanged store (twice; and after touching every file: what a re-hash costs),
  * ``dvc repro -f`` of the stage (its command does nothing: DVC's bookkeeping around a re-run),
  * ``dvc checkout`` into an empty workspace for each cache.type,
  * ``dvc push`` to a local directory remote and ``dvc pull`` into a fresh ``git clone``, verified,

and prints a table (seconds, GB/s, seconds per 100 GB, bytes the command read from and wrote to disk), the disk's
raw sequential write and read speed measured in the same run, and the cache type to use. Writes the numbers to
``benchmarks/results/dvc_at_size.json``. The disk and the CPU are shared with whatever else runs: numbers are noisy.

Disk: the store (S) plus at most one more copy of it (2S, checked up front and before every step that grows it);
everything is deleted at the end (``--keep`` keeps it).

Usage: python benchmarks/dvc_at_size.py [--gb 20] [--shard-rows 512] [--workdir DIR] [--max-peak-gb 45] [--keep]
                                       [--out FILE]
Smoke run (a minute): python benchmarks/dvc_at_size.py --gb 0.3 --shard-rows 64 --out /tmp/dvc_at_size.json
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from distillpipe.store.manifest import Manifest, TeacherInfo
from distillpipe.store.resume import create_or_resume
from distillpipe.store.schema import ATTN_SCORES, END_LOGITS, HIDDEN, START_LOGITS, SignalSpec, array_layout
from distillpipe.store.shards import MARKER_DIR, marker_path

GB = 1e9  # decimal gigabytes throughout
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RESERVE = 5 * GB  # left free for everyone else on the disk
LAYERS = (6, 12, 18, 24)
SPEC = SignalSpec(max_seq_len=384, pool=4, task="qa", n_classes=0, vocab_size=30522, mlm_topk=0, mlm_max_masked=0,
                  hidden_layers=LAYERS, hidden_size=1024, attn_layers=LAYERS, n_heads=16, attn_probs_layers=(),
                  embedding_size=0)  # dense forms, as in the measurements below (the embedding output is derived)
STORE = "data/teacher/big.zarr"
DVC_YAML = f"""stages:
  teacher_cache:
    cmd: "true"
    deps:
      - synthetic.txt
    outs:
      - {STORE}:
          persist: true
"""


# --- disk: free space, page cache, usage --------------------------------------------------------------------------

def files_under(root: Path) -> list[Path]:
    """Regular files under ``root`` (symlinks not followed, not listed)."""
    return [Path(d, f) for d, _, fs in os.walk(root) for f in fs if not os.path.islink(os.path.join(d, f))]


def evict(root: Path) -> None:
    """Write back and drop from the page cache every file under ``root``, so the next command reads the disk."""
    os.sync()
    for path in files_under(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_used(root: Path) -> int:
    """Bytes of disk blocks under ``root``, each inode once (hardlinks share their blocks)."""
    seen, total = set(), 0
    for path in files_under(root):
        st = path.stat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


class Disk:
    """Refuses (SystemExit, before anything is written) a step that would leave less than RESERVE free."""

    def __init__(self, workdir: Path):
        self.workdir, self.peak = workdir, 0

    def need(self, nbytes: float, what: str) -> None:
        free = shutil.disk_usage(self.workdir).free
        if free - nbytes < RESERVE:
            raise SystemExit(f"not enough disk for {what}: it needs {nbytes / GB:.1f} GB, {free / GB:.1f} GB are free "
                             f"on {self.workdir} and {RESERVE / GB:.0f} GB stay free for others; free some space or "
                             "pass a smaller --gb")

    def note(self) -> float:
        used = disk_used(self.workdir)
        self.peak = max(self.peak, used)
        return used / GB


def raw_speed(folder: Path, nbytes: int) -> tuple[float, float]:
    """(write, read) GB/s of one file of ``nbytes`` written sequentially with an fsync, then read cold (dd-like)."""
    block = np.random.default_rng(0).integers(0, 256, 64 * 2**20, dtype=np.uint8).tobytes()
    path = folder / "raw.bin"
    t = time.perf_counter()
    with path.open("wb") as f:
        for _ in range(nbytes // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    write = nbytes / (time.perf_counter() - t) / GB
    evict(folder)
    t = time.perf_counter()
    with path.open("rb", buffering=0) as f:
        while f.read(len(block)):
            pass
    read = nbytes / (time.perf_counter() - t) / GB
    path.unlink()
    return write, read


def reflink_supported(folder: Path) -> bool:
    (folder / "reflink.a").write_bytes(b"x" * 4096)
    ok = subprocess.run(["cp", "--reflink=always", folder / "reflink.a", folder / "reflink.b"],
                        capture_output=True).returncode == 0
    for name in ("reflink.a", "reflink.b"):
        (folder / name).unlink(missing_ok=True)
    return ok


# --- the synthetic store, through our own writer --------------------------------------------------------------------

class Rows:
    """Shard contents fast: one random float16 buffer per array, XORed per shard in its mantissa bits (so every file
    hashes differently) and masked past each row's length as the capture masks real rows."""

    def __init__(self, shard_rows: int, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.base, self.work = {}, {}
        for spec in array_layout(SPEC, shard_rows, shard_rows):
            if spec.dtype == np.float16:
                base = np.empty((shard_rows, *spec.row_shape), np.float16)
                for r in range(0, shard_rows, 64):  # float32 in slices: no 2x-size temporary
                    base[r:r + 64] = self.rng.standard_normal(base[r:r + 64].shape, np.float32)
                self.base[spec.name], self.work[spec.name] = base, np.empty_like(base)

    def shard(self, i: int, start: int, stop: int) -> dict[str, np.ndarray]:
        n = stop - start
        lengths = self.rng.integers(128, SPEC.max_seq_len + 1, n).astype(np.int32)
        out = {"row_index": np.arange(start, stop, dtype=np.int64), "length": lengths}
        for name, base in self.base.items():
            np.bitwise_xor(base[:n].view(np.uint16), np.uint16(i % 1024), out=self.work[name][:n].view(np.uint16))
            out[name] = self.work[name][:n]
        for r, length in enumerate(lengths):
            pooled = -(-int(length) // SPEC.pool)
            for name, a in out.items():
                if name.startswith(HIDDEN):
                    a[r, pooled:] = 0
                elif name.startswith(ATTN_SCORES):
                    a[r, :, pooled:, :] = -np.inf
                    a[r, :, :, pooled:] = -np.inf
                elif name in (START_LOGITS, END_LOGITS):
                    a[r, length:] = 0
        return out


def manifest(n_rows: int, shard_rows: int) -> Manifest:
    code = {"benchmarks/dvc_at_size.py": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}
    teacher = TeacherInfo(name="synthetic-bert-large", weights_sha256="0" * 64, tokenizer_sha256="0" * 64,
                          config={"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16})
    return Manifest(teacher=teacher, tokens_fingerprint="synthetic", split="train", signals=SPEC,
                    compute={"precision": "synthetic", "batch_size": 0}, code=code, n_rows=n_rows,
                    shard_rows=shard_rows)


def write_store(path: Path, n_rows: int, shard_rows: int, rows: Rows, log: bool = True) -> dict:
    """Write the store with our writer; returns sizes and the seconds spent generating vs writing."""
    gen = write = 0.0
    writer = create_or_resume(path, manifest(n_rows, shard_rows), checksum=False)
    for i in writer.pending_shards():
        t = time.perf_counter()
        arrays = rows.shard(i, *writer.manifest.shard_rows_range(i))
        t2 = time.perf_counter()
        writer.write_shard(i, arrays)
        gen, write = gen + t2 - t, write + time.perf_counter() - t2
        if log:
            print(f"  shard {i + 1}/{writer.manifest.n_shards} written ({write:.0f} s)",
                  end="\r" if sys.stdout.isatty() else "\n", flush=True)
    summary = writer.finalize()
    if log and sys.stdout.isatty():
        print()
    files = files_under(path)
    return {"rows": n_rows, "shard_rows": shard_rows, "shards": summary.shards, "files": len(files),
            "bytes": summary.bytes_on_disk, "gb": summary.bytes_on_disk / GB, "bytes_per_row": summary.bytes_per_row,
            "generate_s": gen, "write_s": write, "files_per_shard": len(array_layout(SPEC, 1, 1)) + 1}


# --- timed DVC commands ---------------------------------------------------------------------------------------------

@dataclass
class Op:
    operation: str
    cache_type: str
    s: float
    """Wall seconds of the command."""
    flush_s: float
    """Seconds of the ``sync`` after it (writing back what it left dirty in the page cache)."""
    cpu_s: float
    read_gb: float
    """Read from the disk (not the page cache, which was dropped before): a command that re-hashes reads the store."""
    written_gb: float
    gb: float
    """Store size the command handled."""

    @property
    def total_s(self) -> float:
        return self.s + self.flush_s

    def row(self) -> dict:
        sized = self.gb > 0  # else a command on no data (DVC's start-up)
        return {**asdict(self), "gb_per_s": self.gb / self.total_s if sized else None,
                "s_per_100gb": self.total_s * 100 / self.gb if sized else None}


class Dvc:
    def __init__(self, workdir: Path, store_gb: float):
        self.workdir, self.gb, self.ops = workdir, store_gb, []
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
                    "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com", "GIT_COMMITTER_NAME": "b",
                    "GIT_COMMITTER_EMAIL": "b@example.com"}
        self.env.pop("DVC_SITE_CACHE_DIR", None)

    def sh(self, cwd: Path, *cmd) -> str:
        res = subprocess.run([str(c) for c in cmd], cwd=cwd, env=self.env, capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"{' '.join(map(str, cmd))} failed in {cwd}:\n{res.stdout}\n{res.stderr}")
        return res.stdout + res.stderr

    def timed(self, operation: str, cache_type: str, cwd: Path, *cmd) -> tuple[Op, str]:
        evict(self.workdir)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        output = self.sh(cwd, *cmd)
        s = time.perf_counter() - t
        os.sync()
        flush = time.perf_counter() - t - s
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        op = Op(operation, cache_type, s, flush,
                cpu_s=after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                read_gb=(after.ru_inblock - before.ru_inblock) * 512 / GB,
                written_gb=(after.ru_oublock - before.ru_oublock) * 512 / GB, gb=self.gb)
        self.ops.append(op)
        print(f"  {operation:<44} {cache_type:<24} {s:7.1f} s +{flush:5.1f} s flush, cpu {op.cpu_s:6.1f} s, "
              f"read {op.read_gb:5.1f} GB, wrote {op.written_gb:5.1f} GB", flush=True)
        return op, output

    def status(self, label: str, cache_type: str, cwd: Path, rehash_expected: bool = False) -> Op:
        op, output = self.timed(label, cache_type, cwd, "dvc", "status")
        if "up to date" not in output:
            print(f"    !! dvc status is not clean:\n{output}")
        rehashed = op.read_gb > 0.1 * self.gb
        if rehashed != rehash_expected:
            print(f"    !! dvc status read {op.read_gb:.1f} GB of a {self.gb:.1f} GB store: "
                  f"{'it RE-HASHED the store' if rehashed else 'it did NOT re-hash'}, contrary to expectation")
        return op


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=20.0, help="store size to reach, GB (1e9 bytes) on disk")
    ap.add_argument("--shard-rows", type=int, default=512, help="rows per shard (a BERT-Large shard of 512 rows is "
                    "1.4 GB in memory; params.yaml's 1,024 needs twice that, and the writer holds it twice)")
    ap.add_argument("--workdir", type=Path, default=ROOT / "build", help="parent of the throwaway folder")
    ap.add_argument("--max-peak-gb", type=float, default=45.0, help="refuse a --gb whose peak disk use exceeds this")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dvc_at_size.json",
                    help="where the numbers go (a smoke run: somewhere else)")
    args = ap.parse_args()
    target = args.gb * GB
    peak = 2.05 * target + 64 * 2**20  # the store, one more copy of it (commit/checkout with copy, push, pull)
    if peak > args.max_peak_gb * GB:
        raise SystemExit(f"--gb {args.gb} needs about {peak / GB:.0f} GB of disk at its peak, over --max-peak-gb "
                         f"{args.max_peak_gb}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    Disk(args.workdir).need(peak, f"a {args.gb:g} GB store (peak {peak / GB:.0f} GB)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below cleans up
    work = Path(tempfile.mkdtemp(prefix="dvc_at_size.", dir=args.workdir))
    try:
        run(args, work, target)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
            print(f"removed {work} ({shutil.disk_usage(args.workdir).free / GB:.0f} GB free)")


def run(args: argparse.Namespace, work: Path, target: float) -> None:
    disk = Disk(work)
    reflink = reflink_supported(work)
    fstype = subprocess.run(["findmnt", "-no", "FSTYPE", "-T", str(work)], capture_output=True, text=True).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GB
    device = {"cpu": cpu, "cores": os.cpu_count(), "ram_gb": ram, "filesystem": fstype.strip() or "?",
              "reflink": reflink, "workdir": str(work)}
    dvc_version = subprocess.run([BIN / "dvc", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"{cpu}, {os.cpu_count()} cores, {device['ram_gb']:.0f} GB RAM; {device['filesystem']} at {work} "
          f"(reflink {'supported' if reflink else 'NOT supported: skipped'}); dvc {dvc_version}; "
          f"load {os.getloadavg()[0]:.1f}")
    print("The disk and CPU are shared with other processes: numbers are noisy. Page cache dropped before each "
          "command.")
    raw_bytes = int(min(4 * GB, max(GB / 4, target / 5))) // (64 * 2**20) * (64 * 2**20)
    raw_w, raw_r = raw_speed(work, raw_bytes)
    print(f"raw disk: sequential write {raw_w:.2f} GB/s (fsync), read {raw_r:.2f} GB/s ({raw_bytes / GB:.1f} GB file)")

    repo, dvc = work / "repo", Dvc(work, 0.0)
    repo.mkdir()
    dvc.sh(repo, "git", "init", "-q")
    dvc.sh(repo, "dvc", "init", "-q")
    dvc.sh(repo, "dvc", "config", "core.analytics", "false")
    dvc.sh(repo, "dvc", "config", "core.site_cache_dir", work / "site-cache")  # DVC's state DB: deletable
    dvc.sh(repo, "dvc", "remote", "add", "-d", "local", work / "remote")
    (repo / "dvc.yaml").write_text(DVC_YAML)
    (repo / "synthetic.txt").write_text("inputs of the synthetic teacher cache\n")
    (repo / ".gitignore").write_text("*.lock\n!dvc.lock\n")  # the store's flock file sits beside it

    dvc.timed("dvc status, no store yet (DVC's start-up)", "-", repo, "dvc", "status")
    rows = Rows(args.shard_rows)
    calib = write_store(work / "calib.zarr", args.shard_rows, args.shard_rows, rows, log=False)
    shutil.rmtree(work / "calib.zarr")
    n_shards = max(1, round(target / (calib["bytes_per_row"] * args.shard_rows)))
    disk.need(n_shards * args.shard_rows * calib["bytes_per_row"] * 1.05, "the store")
    print(f"writing {STORE}: {n_shards} shards of {args.shard_rows} rows, "
          f"{calib['bytes_per_row'] / 2**20:.2f} MiB/row on disk")
    store = write_store(repo / STORE, n_shards * args.shard_rows, args.shard_rows, rows)
    del rows
    S = store["gb"]
    dvc.gb = S
    store["write_gb_per_s"] = S / store["write_s"]
    store["files_per_100gb"] = {n: round(100 * GB / (store["bytes_per_row"] * n) * store["files_per_shard"])
                                for n in (256, 512, 1024, 4096)}
    print(f"store: {store['rows']:,} rows, {store['shards']} shards, {store['files']} files, {S:.2f} GB; "
          f"generating {store['generate_s']:.0f} s, our writer {store['write_s']:.0f} s "
          f"({store['write_gb_per_s']:.2f} GB/s on disk, page cache included); files per 100 GB by shard_rows: "
          f"{store['files_per_100gb']}")
    dvc.sh(repo, "git", "add", "dvc.yaml", "synthetic.txt", ".gitignore", ".dvc/config", ".dvc/.gitignore")
    dvc.sh(repo, "git", "commit", "-qm", "synthetic teacher cache stage")
    results = measure(dvc, repo, work, disk, S, reflink)
    print_table(dvc.ops, raw_w, raw_r, reflink)
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "device": device, "dvc": dvc_version,
        "spec": SPEC.to_dict(), "store": store, "raw_disk": {"write_gb_per_s": raw_w, "read_gb_per_s": raw_r,
                                                            "file_gb": raw_bytes / GB},
        "ops": [op.row() for op in dvc.ops], **results, "peak_disk_gb": disk.peak / GB}, indent=1) + "\n")
    print(f"peak disk use {disk.peak / GB:.1f} GB; numbers in {out}")


def measure(dvc: Dvc, repo: Path, work: Path, disk: Disk, S: float, reflink: bool) -> dict:
    """Every timed DVC step, ordered so that the work folder never holds more than two copies of the store."""
    ws, cache, state = repo / STORE, repo / ".dvc" / "cache", work / "site-cache"

    def cache_type(t: str) -> str:
        dvc.sh(repo, "dvc", "config", "--local", "cache.type", t)
        return t

    def fresh_cache() -> None:  # the workspace keeps its bytes: it holds real files or hardlinks, never symlinks
        assert not any(p.is_symlink() for p in ws.rglob("*"))
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)

    print("commit, status, repro (copy):")
    disk.need(S * GB, "dvc commit with cache.type copy")
    t = cache_type("copy")
    dvc.timed("dvc commit -f (hash + copy into cache)", t, repo, "dvc", "commit", "-f", "teacher_cache")
    dvc.sh(repo, "git", "add", "dvc.lock", "data/teacher/.gitignore")
    dvc.sh(repo, "git", "commit", "-qm", "dvc.lock")
    dvc.status("dvc status, unchanged (1st)", t, repo)
    dvc.status("dvc status, unchanged (2nd)", t, repo)
    now = time.time()
    for p in files_under(ws):
        os.utime(p, (now, now))
    dvc.status("dvc status after touching every file", t, repo, rehash_expected=True)
    dvc.status("dvc status again", t, repo)
    dvc.timed("dvc repro -f (no-op command)", t, repo, "dvc", "repro", "-f", "teacher_cache")
    disk.note()

    print("checkout into an empty workspace:")
    for t in ["copy", *(["reflink"] * reflink), "symlink", "hardlink"]:  # hardlink last: the repro below needs it
        shutil.rmtree(ws)
        cache_type(t)
        dvc.timed("dvc checkout", t, repo, "dvc", "checkout")
        dvc.status("dvc status", t, repo)
        disk.note()
    # the workspace now holds hardlinks into the cache
    disk.need(S * GB, "dvc repro -f with hardlinks (DVC copies a persisted out's links back to files first)")
    dvc.timed("dvc repro -f (no-op command)", "hardlink", repo, "dvc", "repro", "-f", "teacher_cache")
    dvc.status("dvc status", "hardlink", repo)
    disk.note()

    print("commit into an empty cache (state DB deleted too, so DVC hashes):")
    for t in ["hardlink", *(["reflink"] * reflink), "reflink,hardlink,symlink", "symlink"]:  # symlink last
        fresh_cache()
        disk.need(S * GB, f"dvc commit with cache.type {t}")
        cache_type(t)
        dvc.timed("dvc commit -f", t, repo, "dvc", "commit", "-f", "teacher_cache")
        dvc.status("dvc status", t, repo)
        disk.note()

    print("push to a local remote, pull into a fresh clone:")
    disk.need(S * GB, "dvc push")
    dvc.timed("dvc push (local remote)", "symlink", repo, "dvc", "push")
    disk.note()
    sizes = {str(p.relative_to(ws)): p.stat().st_size for p in ws.rglob("*") if p.is_file()}
    markers = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ws / MARKER_DIR).iterdir()}
    shutil.rmtree(ws)
    shutil.rmtree(cache)
    clone = work / "clone"
    dvc.sh(work, "git", "clone", "-q", repo, clone)
    shutil.rmtree(repo)
    t = "hardlink"
    dvc.sh(clone, "dvc", "config", "--local", "cache.type", t)
    dvc.timed("dvc pull (fresh clone)", t, clone, "dvc", "pull")
    disk.note()
    dvc.status("dvc status in the clone", t, clone)
    verified = verify(clone / STORE, sizes, markers)
    print(f"  pulled store equals the original: {verified}")
    shutil.rmtree(work / "remote")
    return {"pull_verified": verified, "dvc_dir_entries": len(sizes)}


def verify(store: Path, sizes: dict[str, int], markers: dict[str, str]) -> str:
    """The pulled store against the original: the same files and sizes, the same markers (they hold every shard
    file's sha256), and the files of one shard hashed against its marker."""
    got = {str(p.relative_to(store)): p.stat().st_size for p in store.rglob("*") if p.is_file()}
    if got != sizes:
        differ = sum(got.get(k) != v for k, v in sizes.items())
        return f"NO: {len(set(got) ^ set(sizes))} files differ in name, {differ} in size"
    got_markers = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (store / MARKER_DIR).iterdir()}
    if got_markers != markers:
        return "NO: completion markers differ"
    i = len(markers) // 2
    marker = json.loads(marker_path(store, i).read_text())
    for key, rec in marker["files"].items():
        if rec and hashlib.sha256((store / key).read_bytes()).hexdigest() != rec["sha256"]:
            return f"NO: {key} differs from its marker's sha256"
    return f"yes ({len(got)} files and sizes, {len(markers)} markers, shard {i}'s files hashed)"


def print_table(ops: list[Op], raw_w: float, raw_r: float, reflink: bool) -> None:
    print(f"\n{'operation':<44} {'cache.type':<24} {'s':>7} {'GB/s':>6} {'s/100GB':>8} {'cpu s':>6} {'read GB':>8} "
          f"{'wrote GB':>8}")
    for op in ops:
        r = op.row()
        rate = f"{r['gb_per_s']:6.2f} {r['s_per_100gb']:8.0f}" if op.gb else f"{'-':>6} {'-':>8}"
        print(f"{op.operation:<44} {op.cache_type:<24} {op.total_s:7.1f} {rate} {op.cpu_s:6.1f} {op.read_gb:8.1f} "
              f"{op.written_gb:8.1f}")
    print(f"(s includes the sync after each command; raw disk: write {raw_w:.2f} GB/s, read {raw_r:.2f} GB/s, "
          f"i.e. {100 / raw_w:.0f} s and {100 / raw_r:.0f} s per 100 GB)")
    print("Recommended: cache.type " + ("reflink (copy-on-write: nothing is copied, and the workspace files are "
                                        "independent of the cache)" if reflink else
                                        "hardlink,symlink, hardlink FIRST: DVC links a committed file into the cache "
                                        "only when hardlink is the first type, any other order copies every byte "
                                        "(reflink is not available on this filesystem; symlink serves a cache on "
                                        "another filesystem)"))


if __name__ == "__main__":
    main()
