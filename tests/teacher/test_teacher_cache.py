"""The teacher_cache stage end to end: stored signals equal a live teacher, a SIGKILLed run resumes
to bitwise-identical files recomputing only unfinished shards, and changed params rebuild loudly."""

import filecmp
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _tiny import invoke_cli, make_classification_tokens, make_mlm_tokens, make_tiny_bert_dir, signals, write_params

from distillpipe.config.base import build
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.data.schema import longest_list, read_meta
from distillpipe.store.manifest import ManifestMismatch
from distillpipe.store.reader import open_store
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.teacher.targets import TeacherCacheError, TeacherFacts, signal_spec

SHARD = 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    base = make_tiny_bert_dir(root / "base")
    clf = make_tiny_bert_dir(root / "clf", num_labels=2, seed=1)
    return {"base": base, "clf": clf, "mlm": make_mlm_tokens(root / "mlm", base, n_rows=100),
            "cls": make_classification_tokens(root / "cls", clf, n_train=40, n_dev=8), "root": root}


def _cfg(head="base", **sig):
    return build(TeacherCacheDatasetConfig, {"teacher": "t", "head": head, "split": "train",
                                             "max_rows": None, "signals": signals(**sig)},
                 "teacher_cache.datasets.toy")


def _files(folder):
    return sorted((p.relative_to(folder), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file())


def test_cache_equals_live_teacher_row_by_row(tiny, tmp_path):
    before = _files(tiny["mlm"]), _files(tiny["base"])
    s = build_teacher_cache("toy", tiny["mlm"], tiny["base"], _cfg(), "cpu", 8, SHARD, tmp_path / "s.zarr",
                            cpu_threads=1)
    assert (_files(tiny["mlm"]), _files(tiny["base"])) == before  # inputs are other stages' DVC outputs
    assert s.store.rows == 100 and s.computed_rows == 100
    st = open_store(tmp_path / "s.zarr")
    from datasets import load_from_disk
    from transformers import BertModel

    rows = load_from_disk(str(tiny["mlm"]))["train"]
    model = BertModel.from_pretrained(tiny["base"], attn_implementation="eager").eval()
    got = st.read(["row_index", "length", "hidden/L1", "hidden/L2", "attn_scores/L2"], 0, 100)
    assert np.array_equal(got["row_index"], np.arange(100))
    for i in (0, 17, 63, 99):  # one row at a time, no padding: the independent reference
        ids = torch.tensor([rows[i]["input_ids"]])
        n = ids.shape[1]
        with torch.no_grad():
            out = model(ids, output_hidden_states=True, output_attentions=True)
        assert got["length"][i] == n
        for j in (1, 2):
            h = out.hidden_states[j][0]  # (n, d)
            ref = torch.stack([h[g:g + 2].mean(0) for g in range(0, n, 2)]).numpy()  # eq. (3), last group partial
            np.testing.assert_allclose(got[f"hidden/L{j}"][i][: len(ref)].astype(np.float32), ref, rtol=2e-3, atol=2e-3)
            assert not got[f"hidden/L{j}"][i][len(ref):].any()  # groups past the row hold the fill value 0
        # eq. (5): max over 2x2 blocks of the pre-softmax scores = log of the probs up to a per-query constant,
        # so compare through softmax: softmax(stored scores, unpooled p=1 not stored) is not available; check
        # the max-pool of log(probs) + logsumexp instead via the recomputed scores.
        attn = model.encoder.layer[1].attention.self
        x = out.hidden_states[1]
        q = attn.query(x).view(1, n, 4, -1).transpose(1, 2)
        k = attn.key(x).view(1, n, 4, -1).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2))[0] / (q.shape[-1] ** 0.5)  # (H, n, n)
        g = (n + 1) // 2
        ref = np.full((4, g, g), -np.inf, np.float32)
        for a in range(g):
            for b in range(g):
                ref[:, a, b] = scores[:, 2 * a:2 * a + 2, 2 * b:2 * b + 2].amax(dim=(-1, -2)).detach().numpy()
        np.testing.assert_allclose(got["attn_scores/L2"][i][:, :g, :g].astype(np.float32), ref, rtol=3e-3, atol=3e-3)
        assert np.isneginf(got["attn_scores/L2"][i][:, g:, :]).all()


def test_task_logits_equal_live_classifier(tiny, tmp_path):
    cfg = _cfg("classification", logits=True, hidden_layers=[], attn_layers=[], pool=1)
    build_teacher_cache("cls", tiny["cls"], tiny["clf"], cfg, "cpu", 16, SHARD, tmp_path / "c.zarr", cpu_threads=1)
    from datasets import load_from_disk
    from transformers import BertForSequenceClassification

    rows = load_from_disk(str(tiny["cls"]))["train"]
    model = BertForSequenceClassification.from_pretrained(tiny["clf"]).eval()
    got = open_store(tmp_path / "c.zarr").read(["logits"], 0, 40)["logits"]
    with torch.no_grad():
        ref = torch.cat([model(torch.tensor([r["input_ids"]])).logits for r in rows]).numpy()
    np.testing.assert_allclose(got.astype(np.float32), ref, rtol=2e-3, atol=2e-3)


def test_bad_combinations_are_refused(tiny, tmp_path):
    with pytest.raises(TeacherCacheError, match="another tokenizer"):
        other = make_tiny_bert_dir(tmp_path / "other")
        (other / "vocab.txt").write_text((other / "vocab.txt").read_text() + "extra\n")
        build_teacher_cache("toy", tiny["mlm"], other, _cfg(), "cpu", 8, SHARD, tmp_path / "x.zarr", cpu_threads=1)
    with pytest.raises(TeacherCacheError, match="split='dev'"):
        cfg = build(TeacherCacheDatasetConfig,
                    {"teacher": "t", "head": "base", "split": "dev", "max_rows": None, "signals": signals()}, "k")
        build_teacher_cache("toy", tiny["mlm"], tiny["base"], cfg, "cpu", 8, SHARD, tmp_path / "y.zarr", cpu_threads=1)


def test_signal_spec_reads_the_masked_positions_in_arrow_never_row_by_row(tiny):
    """mlm_max_masked (the longest masked_positions list) is read in Arrow batches, so the driver's memory and
    time do not go per row: a Python list per row is ~200 B a row held at once with datasets 3 (20 GB at 100 M
    rows) and ~70 us a row with datasets 4 (two hours). A transform sees every row read through Python."""
    from datasets import load_from_disk

    rows = load_from_disk(str(tiny["mlm"]))["train"]
    reference = max(len(p) for p in rows["masked_positions"])
    seen = []
    spy = rows.with_transform(lambda batch: seen.append(len(batch["length"])) or batch)
    facts = TeacherFacts(config={}, head="mlm", num_labels=0, vocab_size=65, hidden_size=32, n_heads=4, compute={},
                         device="cpu")
    spec = signal_spec(_cfg("mlm", mlm_topk=4), facts, read_meta(tiny["mlm"]), spy)
    assert spec.mlm_max_masked == reference and seen == []
    subset = rows.select(range(3, 100, 7))  # max_rows: an indices mapping over the split; several Arrow batches
    assert longest_list(subset, "masked_positions", batch_size=4) == max(len(p) for p in subset["masked_positions"])
    assert longest_list(rows.select([]), "masked_positions") == 0


def test_reader_refuses_a_stale_cache_naming_the_field(tiny, tmp_path):
    build_teacher_cache("toy", tiny["mlm"], tiny["base"], _cfg(), "cpu", 8, SHARD, tmp_path / "s.zarr", cpu_threads=1)
    st = open_store(tmp_path / "s.zarr")
    expected = st.manifest.to_dict()
    expected["tokens_fingerprint"] = "changed"
    expected["signals"]["hidden_layers"] = [2]
    with pytest.raises(ManifestMismatch) as e:
        open_store(tmp_path / "s.zarr", expected=expected)
    assert "tokens_fingerprint" in str(e.value) and "signals.hidden_layers" in str(e.value)


def test_a_second_writer_is_refused_before_its_teacher_loads(tiny, tmp_path, monkeypatch):
    """The lock comes first: a driver that cannot write the store never loads its teacher (at BERT-Large size, a GPU
    load for nothing); the driver that gets the lock loads the teacher and builds under that same lock."""
    from distillpipe.store.lock import StoreLock, StoreLocked, writer_active
    from distillpipe.teacher import cache

    loads, real = [], cache.load_teacher

    def load_teacher(*args, **kwargs):
        loads.append(writer_active(out))  # who holds the store's lock while the teacher loads
        return real(*args, **kwargs)

    monkeypatch.setattr(cache, "load_teacher", load_teacher)
    monkeypatch.setattr(cache, "_LOADED", None)  # no teacher kept from an earlier test
    out = tmp_path / "s.zarr"
    with StoreLock(out):  # the first writer (another open file description: flock refuses it like another process)
        with pytest.raises(StoreLocked, match="being written by another process"):
            build_teacher_cache("toy", tiny["mlm"], tiny["base"], _cfg(), "cpu", 8, SHARD, out, cpu_threads=1)
    assert loads == [] and not out.exists()
    s = build_teacher_cache("toy", tiny["mlm"], tiny["base"], _cfg(), "cpu", 8, SHARD, out, cpu_threads=1)
    assert s.store.rows == 100 and len(loads) == 1 and f"pid {os.getpid()}" in loads[0]  # loaded under its lock
    assert writer_active(out) is None  # released at the end


def test_writer_threads_write_the_bytes_of_one_writer(tiny, tmp_path):
    """run_shards with several writer threads (shards written concurrently, arrays assembled in the writers'
    threads) leaves exactly the files of one writer, and of the stage itself."""
    from datasets import load_from_disk

    from distillpipe.runtime import torch_threads
    from distillpipe.scale.machine import load_machine
    from distillpipe.store import constants as store_constants
    from distillpipe.store.reader import open_store as _open
    from distillpipe.store.resume import create_or_resume
    from distillpipe.store.schema import constant_names
    from distillpipe.teacher.cache import run_shards
    from distillpipe.teacher.load import load_teacher
    from distillpipe.teacher.shard import compute_shard

    compact = _cfg(embeddings=True, hidden_rank=4, attn_rank=2)  # subspaces, factors and derived embeddings too
    build_teacher_cache("toy", tiny["mlm"], tiny["base"], compact, "cpu", 8, SHARD, tmp_path / "ref.zarr",
                        cpu_threads=1)
    manifest = _open(tmp_path / "ref.zarr").manifest
    assert manifest.signals.hidden_rank == 4 and manifest.signals.attn_rank == 2
    constants = store_constants.load(tmp_path / "ref.zarr", manifest.signals)
    model, _ = load_teacher(tiny["base"], "base", "cpu")
    rows = load_from_disk(str(tiny["mlm"]))["train"]
    for writers in (1, 3):
        store = tmp_path / f"w{writers}.zarr"
        with create_or_resume(store, manifest.with_completed(set())) as w, torch_threads(1):  # the ref's cpu_threads
            store_constants.write_constants(store, *store_constants.read_constants(
                tmp_path / "ref.zarr", constant_names(manifest.signals)))
            done = []
            run_shards(lambda i: compute_shard(model, rows, *manifest.shard_rows_range(i), manifest.signals, 8, 0,
                                               constants),
                       str(store), w.pending_shards(), lambda i, marker: done.append(i), writers=writers)
            assert done == list(range(manifest.n_shards))  # reported in shard order
            w.record(done)
            w.finalize()
        assert _tree(store) == _tree(tmp_path / "ref.zarr")
        for f in _tree(store):
            assert filecmp.cmp(store / f, tmp_path / "ref.zarr" / f, shallow=False), (writers, f)
    # the stage itself with 3 writers (machine setting threads_per_worker 4: one computes, three write)
    (tmp_path / "machine.yaml").write_text("")
    cluster = load_machine({"DISTILLPIPE_MACHINE": str(tmp_path / "machine.yaml"), "DISTILLPIPE_THREADS": "4"}).cluster
    build_teacher_cache("toy", tiny["mlm"], tiny["base"], compact, "cpu", 8, SHARD, tmp_path / "t4.zarr",
                        cpu_threads=1, cluster=cluster)
    for f in _tree(tmp_path / "ref.zarr"):
        assert filecmp.cmp(tmp_path / "t4.zarr" / f, tmp_path / "ref.zarr" / f, shallow=False), f


# -- the stage as a process: kill, resume, rebuild -------------------------------------------------

DRIVER = """
import os, signal, sys
from distillpipe.teacher import cache as C
kill_at = int(os.environ.get("KILL_AT_SHARD", "-1"))
orig = C.write_shard
def write_shard(store, i, arrays, **kw):
    if i == kill_at:  # die half-way through this shard's arrays: a torn shard on disk
        calls = []
        def cb(name, nbytes):
            calls.append(name)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        return orig(store, i, arrays, on_array_written=cb)
    return orig(store, i, arrays, **kw)
C.write_shard = write_shard
from distillpipe.cli import app
app(sys.argv[1:], prog_name="teacher_cache")
"""


def _args(tiny, params, out):
    return ["teacher-cache", "--dataset", "toy", "--tokens", str(tiny["mlm"]), "--teacher", str(tiny["base"]),
            "--out", str(out), "--params", str(params)]


def _run(tiny, params, out, kill_at=None):
    """The stage in a process of its own, to SIGKILL it mid-shard."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KILL_AT_SHARD": str(-1 if kill_at is None else kill_at)}
    return subprocess.run([sys.executable, "-c", DRIVER, *_args(tiny, params, out)], env=env, capture_output=True,
                          text=True)


def _run_here(tiny, params, out):
    """The same command in this process (no ~5 s of imports): references, resumes and rebuilds."""
    return invoke_cli(_args(tiny, params, out))


def _params(tmp_path, **sig):
    return write_params(tmp_path / "params.yaml", {"teacher_cache": {
        "device": "cpu", "batch_size": 8, "cpu_threads": 1, "shard_rows": SHARD,
        "datasets": {"toy": {"teacher": "base", "head": "base", "split": "train", "max_rows": None,
                             "signals": signals(**sig)}}}})


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_sigkill_then_resume_is_bitwise_identical(tiny, tmp_path):
    params = _params(tmp_path)
    ref = _run_here(tiny, params, tmp_path / "ref.zarr")
    assert ref.returncode == 0, ref.stderr
    killed = _run(tiny, params, tmp_path / "run.zarr", kill_at=4)
    assert killed.returncode == -9, killed.stderr  # SIGKILL: shards 0-3 done, shard 4 torn
    res = _run_here(tiny, params, tmp_path / "run.zarr")  # all it knows of the killed run is on disk
    assert res.returncode == 0, res.stderr
    # 100 rows / 16 = 7 shards; 4 survived, so exactly shards 4, 5, 6 (16 + 16 + 4 rows) are recomputed
    assert "4 of 7 shards already complete" in res.stderr
    assert "computed 36 rows" in res.stdout
    assert _tree(tmp_path / "ref.zarr") == _tree(tmp_path / "run.zarr")
    for f in _tree(tmp_path / "ref.zarr"):
        assert filecmp.cmp(tmp_path / "ref.zarr" / f, tmp_path / "run.zarr" / f, shallow=False), f


def test_corrupted_shard_is_recomputed_alone(tiny, tmp_path):
    params = _params(tmp_path)
    assert _run_here(tiny, params, tmp_path / "s.zarr").returncode == 0
    shard_file = tmp_path / "s.zarr" / "hidden" / "L1" / "c" / "2" / "0" / "0"
    data = shard_file.read_bytes()
    shard_file.write_bytes(data[: len(data) // 2])  # truncated, as by a full disk or a bad copy
    res = _run_here(tiny, params, tmp_path / "s.zarr")
    assert res.returncode == 0, res.stderr
    assert "computed 16 rows" in res.stdout and "shard 2" in res.stderr


def test_param_change_rebuilds_and_says_so(tiny, tmp_path):
    assert _run_here(tiny, _params(tmp_path), tmp_path / "s.zarr").returncode == 0
    res = _run_here(tiny, _params(tmp_path, hidden_layers=[2]), tmp_path / "s.zarr")
    assert res.returncode == 0, res.stderr
    assert "rebuilding" in res.stderr and "signals.hidden_layers" in res.stderr
    assert "computed 100 rows" in res.stdout
    st = open_store(tmp_path / "s.zarr")
    assert "hidden/L1" not in st.arrays and "hidden/L2" in st.arrays


# -- a full disk ----------------------------------------------------------------------------------

def _cli_in_process(tiny, params, out):
    from typer.testing import CliRunner

    from distillpipe.cli import app

    return CliRunner().invoke(app, ["teacher-cache", "--dataset", "toy", "--tokens", str(tiny["mlm"]), "--teacher",
                                    str(tiny["base"]), "--out", str(out), "--params", str(params)])


def _unit(text):
    number, unit = re.search(r"needs ~([\d.,]+) (B|kB|MB|GB)", text).groups()
    return float(number.replace(",", "")) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


def test_full_disk_stops_with_one_message_and_resumes_to_identical_bytes(tiny, tmp_path, monkeypatch):
    """A disk that fills up while the store is created, or half-way through its shards: exit 2 with one `error:` line
    naming the store, the space its unfinished shards need (distillpipe plan's estimate, checked against the bytes they
    really take) and the space free; no shard counted complete that is not, no partial file left; once the space is
    back, the same command resumes to the bytes of a build that never stopped."""
    from _fulldisk import FullDisk

    from distillpipe.store.shards import read_marker

    params = _params(tmp_path)
    ref = tmp_path / "ref.zarr"
    assert _cli_in_process(tiny, params, ref).exit_code == 0
    data_bytes = sum(p.stat().st_size for p in ref.rglob("*") if p.is_file())
    for budget in (1_500, data_bytes // 2):  # in the arrays' metadata; after some shards
        out = tmp_path / f"at{budget}" / "s.zarr"
        with monkeypatch.context() as m:
            disk = FullDisk(out.parent, budget).install(m)
            res = _cli_in_process(tiny, params, out)
        assert disk.failed, budget  # the disk did fill up
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith(f"error: no space left on device writing {out}"), res.stderr
        assert "dvc repro teacher_cache@toy" in errors[0] and " is free on its disk" in errors[0]
        marked = {int(p.stem) for p in (out / "shards_done").glob("*.json")}
        unfinished = [i for i in range(7) if i not in marked]
        assert f"for its {len(unfinished)} unfinished shard(s) of 7" in errors[0]
        really = sum(rec["size"] for i in unfinished for rec in read_marker(ref, i)["files"].values() if rec)
        assert 0.75 < _unit(errors[0]) / really < 1.35, (errors[0], really)
        assert not list(out.parent.rglob("*.partial"))
        if marked:  # what counts as complete is complete: every marked shard matches its files, byte for byte
            st = open_store(out, allow_incomplete=True)
            assert set(st.manifest.completed_shards) <= marked and st.verify(checksum=True) == {}
        res = _cli_in_process(tiny, params, out)  # the space is back
        assert res.exit_code == 0, res.output
        assert f"computed {sum(min(SHARD, 100 - SHARD * i) for i in unfinished)} rows" in res.stdout
        assert _tree(out) == _tree(ref)
        for f in _tree(ref):
            assert filecmp.cmp(out / f, ref / f, shallow=False), (budget, f)


def _user_namespaces() -> bool:
    """Whether this machine lets a process mount a filesystem of its own (unshare -rm: a user and mount namespace,
    no root needed where unprivileged user namespaces are allowed)."""
    import shutil

    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


@pytest.mark.slow  # ~30 s: two builds as processes
@pytest.mark.skipif(not _user_namespaces(), reason="needs unshare -rm (user namespaces) to mount a small tmpfs")
def test_a_real_small_filesystem_fills_up_then_grows(tiny, tmp_path):
    """The same as the injected full disk, on a real filesystem: a tmpfs of half the store's size, mounted in a
    private mount namespace, fills up under the build; grown, the build resumes to the bytes of an unstopped one."""
    params = _params(tmp_path)
    ref = tmp_path / "ref.zarr"
    assert _cli_in_process(tiny, params, ref).exit_code == 0
    used = int(subprocess.run(["du", "-sk", str(ref)], capture_output=True, text=True).stdout.split()[0])  # KiB
    mnt, res = tmp_path / "mnt", tmp_path / "res"
    mnt.mkdir()
    res.mkdir()
    build = (f"{sys.executable} -m distillpipe.cli teacher-cache --dataset toy --tokens {tiny['mlm']} --teacher "
             f"{tiny['base']} --out {mnt}/s.zarr --params {params}")
    script = f"""
        mount -t tmpfs -o size={used // 2}k tmpfs {mnt}
        {build} > {res}/1.out 2> {res}/1.err; echo $? > {res}/1.rc
        cp -a {mnt}/s.zarr {res}/full || true
        mount -o remount,size={4 * used}k {mnt}
        {build} > {res}/2.out 2> {res}/2.err; echo $? > {res}/2.rc
        cp -a {mnt}/s.zarr {res}/final
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(["unshare", "-rm", "sh", "-c", script], env=env, check=True, timeout=600)
    err = (res / "1.err").read_text()
    assert (res / "1.rc").read_text().strip() == "2" and "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"error: no space left on device writing {mnt}/s.zarr" in errors[0], err[-3000:]
    assert "more for its" in errors[0] and "unfinished shard(s) of 7" in errors[0]
    full = res / "full"
    if (full / "zarr.json").exists() and (full / "shards_done").is_dir():  # what counts as complete is complete
        st = open_store(full, allow_incomplete=True)
        assert st.verify(checksum=True) == {}
    assert not list(full.rglob("*.partial"))
    assert (res / "2.rc").read_text().strip() == "0", (res / "2.err").read_text()[-3000:]
    final = res / "final"
    assert _tree(final) == _tree(ref)
    for f in _tree(ref):
        assert filecmp.cmp(final / f, ref / f, shallow=False), f
