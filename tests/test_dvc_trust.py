"""In a real DVC repository: what DVC and the teacher store call fresh is what the code and data would produce. A
comment, a docstring or a reformat re-runs only the fingerprint stage; a renamed local variable is a change; a code
edit that changes the cached values re-runs exactly the stages whose code holds it and rebuilds the store (and
reverting it gives the original bytes back), wherever in the stage's code it is (the pooling, the driver's row
selection, the teacher loader), and the rebuilt store equals a clean build with the edited code; a one-byte change
in a user's local input file re-runs exactly that dataset's chain; two teacher-cache processes on one store: the
second is refused."""

import ast
import json
import re
import shutil
import subprocess
import sys
import time

import pytest
from _dvc import DVC, env, out, sh, tiny_params, working_tree_repo, write_params
from _edits import before_return, edit_function, rename_first_local, scale_first_returned, source_file, swap_method_call
from _tiny import make_tiny_bert_dir

import distillpipe.errors
import distillpipe.teacher.cache as driver
import distillpipe.teacher.capture as capture
import distillpipe.teacher.targets as targets

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")
# Every edit below is found by meaning (tests/_edits.py): the function a stage really calls, wherever it lives now.
ERRORS = source_file(distillpipe.errors)  # every stage imports it
CAPTURE = source_file(capture)  # the teacher's signals


def _store_files(repo, name="polarity"):
    root = repo / "data" / "teacher" / f"{name}.zarr"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return make_tiny_bert_dir(tmp_path_factory.mktemp("teacher") / "tiny")


def _ran(res) -> list[str]:
    return [line.split("'")[1] for line in out(res).splitlines() if line.startswith("Running stage")]


CHAIN = ["prepare@polarity", "tokenize@polarity", "teacher_import@base", "teacher_finetune@polarity",
         "teacher_cache@polarity"]


def _stale(repo) -> set[str]:
    return set(json.loads(sh(repo, DVC, "status", "--json", "fingerprint", *CHAIN, repo=repo).stdout or "{}"))


def _holders(repo, rel) -> set[str]:
    """The stages of CHAIN whose fingerprint file covers ``rel`` (read from the files the stage wrote)."""
    return {s for s in CHAIN if rel in json.loads((repo / "fingerprints" / f"{s.split('@')[0]}.json").read_text())[
        "files"]}


def _layout_only(source: str) -> str:
    """``source`` with a comment, a docstring and its layout changed, and nothing it does."""
    edited = source.replace('"""', '"""Edited: ', 1) + "\n# a comment at the end\n"
    edited = re.sub(r"^def (\w+)\(", r"def \1 (", edited, flags=re.M).replace("\n\n\ndef ", "\n\n\n\n# between\ndef ")
    assert edited != source
    ast.parse(edited)
    return edited


# ~95 s: five DVC runs and six `dvc status` of a real pipeline (make test-all). The default suite keeps what it proves
# at the fingerprint level (test_identity.py, test_dvc_deps.py: a comment or layout changes no fingerprint, a rename
# and a one-token edit change exactly the importing stages' ones, DVC's status lists exactly them).
@pytest.mark.slow
def test_code_edit_rebuilds_the_teacher_cache_and_reverting_restores_its_bytes(tmp_path, teacher):
    repo = working_tree_repo(tmp_path / "repo")
    params = tiny_params(teacher)
    params["teacher_cache"]["datasets"]["polarity"]["signals"].update(hidden_layers=[2], pool=2)
    write_params(repo, params)
    sh(repo, DVC, "repro", "teacher_cache@polarity", repo=repo)
    original = _store_files(repo)
    assert _stale(repo) == set()

    # (a) a comment, a docstring and a reformat, in a file every stage imports and in the teacher's capture: only the
    # fingerprint stage runs, and writes the same fingerprints
    sources = {rel: (repo / rel).read_text() for rel in (ERRORS, CAPTURE)}
    fingerprints = {p.name: p.read_bytes() for p in (repo / "fingerprints").rglob("*.json")}
    for rel, source in sources.items():
        (repo / rel).write_text(_layout_only(source))
    assert _stale(repo) == {"fingerprint"}  # DVC sees the source folder change...
    res = sh(repo, DVC, "repro", "teacher_cache@polarity", repo=repo)
    assert _ran(res) == ["fingerprint"], out(res)  # ...and runs the fingerprint stage only
    assert {p.name: p.read_bytes() for p in (repo / "fingerprints").rglob("*.json")} == fingerprints
    assert _stale(repo) == set() and _store_files(repo) == original

    # (c) a renamed local variable counts as a change (conservative): the stages holding capture.py are stale
    assert edit_function(repo, capture.capture_batch, rename_first_local()) == CAPTURE
    sh(repo, DVC, "repro", "-s", "fingerprint", repo=repo)
    assert _stale(repo) == _holders(repo, CAPTURE) == {"teacher_cache@polarity"}
    for rel, source in sources.items():
        (repo / rel).write_text(source)
    sh(repo, DVC, "repro", "-s", "fingerprint", repo=repo)
    assert _stale(repo) == set()

    # (b) one token of behaviour in the capture's average pooling (the first value it returns, doubled): exactly the
    # stages whose code holds it are stale (the teacher cache, not the teacher's fine-tuning), the store rebuilds
    pooling = source_file(capture.avg_pool_seq)
    source = (repo / pooling).read_text()
    edit_function(repo, capture.avg_pool_seq, scale_first_returned("2"))
    sh(repo, DVC, "repro", "-s", "fingerprint", repo=repo)
    assert _holders(repo, pooling) == {"teacher_cache@polarity"}
    assert _stale(repo) == {"teacher_cache@polarity"}
    res = out(sh(repo, DVC, "repro", "teacher_cache@polarity", repo=repo))
    assert "rebuilding the teacher cache" in res and f"code.{pooling.removeprefix('src/')}: cache has" in res, res
    rebuilt = _store_files(repo)
    assert rebuilt.keys() == original.keys()
    changed = {k for k in original if rebuilt[k] != original[k]}
    assert any(k.startswith("hidden/L2/c/") for k in changed), changed  # the values, not only the manifest
    assert not any(k.startswith("logits/c/") for k in changed)  # what pooling does not touch is the same

    (repo / pooling).write_text(source)
    res = out(sh(repo, DVC, "repro", "teacher_cache@polarity", repo=repo))
    assert "rebuilding the teacher cache" in res, res
    assert _store_files(repo) == original  # every byte, manifest and markers included


def _clean_build(repo, name):
    """The stage's command run by hand into a new store with the repo's current code: the reference."""
    ref = repo / "ref" / f"{name}.zarr"
    sh(repo, sys.executable, "-m", "stages.teacher_cache", "--dataset", name, "--tokens", f"data/tokens/{name}",
       "--teacher", f"models/teacher/{name}", "--out", ref, repo=repo)
    files = {p.relative_to(ref).as_posix(): p.read_bytes() for p in sorted(ref.rglob("*")) if p.is_file()}
    shutil.rmtree(ref)
    return files


@pytest.mark.slow  # ~60 s: four real `dvc repro`s; tests/test_identity.py checks the same hole structurally, fast
def test_edits_to_the_driver_and_the_loader_rebuild_the_store(tmp_path, teacher):
    """The two edits that a narrower code identity (shard computation and writer only) let resume a stale
    store with "0 to write": the driver's row selection and the teacher loader, each found by meaning (the
    functions the driver calls, wherever they live: row_subset in data/subset.py, reached through teacher/targets.py
    today). Each must rebuild, name the file, and leave exactly the bytes of a clean build with the edited code."""
    import numpy as np

    from distillpipe.store.reader import open_store

    repo = working_tree_repo(tmp_path / "repo")
    params = tiny_params(teacher)
    params["teacher_cache"]["datasets"]["polarity"]["max_rows"] = 50  # 50 of 140 train rows: row_subset decides
    write_params(repo, params)
    sh(repo, DVC, "repro", "teacher_cache@polarity", repo=repo)
    store = repo / "data" / "teacher" / "polarity.zarr"
    before = open_store(store).read(["row_index", "logits"], 0, 50)

    rows = edit_function(repo, targets.row_subset, swap_method_call("round", "floor"))  # rows i * 139 / 49, floored
    sh(repo, DVC, "repro", "-s", "fingerprint", repo=repo)  # the code deps first, as a full `dvc repro` would
    res = out(sh(repo, DVC, "repro", "-s", "teacher_cache@polarity", repo=repo))
    assert "rebuilding the teacher cache" in res and f"code.{rows.removeprefix('src/')}: cache has" in res, res
    floor_rows = np.floor(np.arange(50) * (139 / 49)).astype(np.int64)  # the edited rule, computed here
    after = open_store(store).read(["row_index", "logits"], 0, 50)
    assert np.array_equal(after["row_index"], floor_rows) and not np.array_equal(before["row_index"], floor_rows)
    assert _store_files(repo) == _clean_build(repo, "polarity")

    loader = edit_function(repo, driver.load_teacher, before_return(  # the loaded classifier's bias, plus 0.5
        lambda model: f'if hasattr({model}, "classifier"):\n    {model}.classifier.bias.data += 0.5'))
    sh(repo, DVC, "repro", "-s", "fingerprint", repo=repo)  # the code deps first, as a full `dvc repro` would
    res = out(sh(repo, DVC, "repro", "-s", "teacher_cache@polarity", repo=repo))
    assert "rebuilding the teacher cache" in res and f"code.{loader.removeprefix('src/')}: cache has" in res, res
    shifted = open_store(store).read(["row_index", "logits"], 0, 50)
    assert np.array_equal(shifted["row_index"], floor_rows)
    np.testing.assert_allclose(shifted["logits"].astype(np.float32), after["logits"].astype(np.float32) + 0.5,
                               atol=4e-3)  # float16 storage
    assert _store_files(repo) == _clean_build(repo, "polarity")
    assert "up to date" in out(sh(repo, DVC, "status", "teacher_cache@polarity", repo=repo))


@pytest.mark.slow  # ~75 s: five stages and three DVC commands; tests/test_dvc_local_files.py checks the same graph
# (the folder is a dep of exactly its dataset's chain) with DVC's own resolver, fast
def test_one_byte_in_a_local_file_reruns_exactly_that_datasets_chain(tmp_path, teacher):
    repo = working_tree_repo(tmp_path / "repo")
    raw = repo / "data" / "raw" / "tiny_sst2"
    raw.mkdir(parents=True)
    rows = ["a fine film", "a dull film", "great acting", "poor script", "loved it", "hated it"]
    (raw / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(rows)))
    (raw / "dev.tsv").write_text("sentence\tlabel\nfine work\t1\nbad work\t0\n")
    (raw / "test.tsv").write_text("sentence\tlabel\ngood film\t1\nweak film\t0\n")
    params = tiny_params(teacher)
    params["prepare"]["local"] = {"tiny_sst2": {"format": "glue", "task": "sst2", "path": "data/raw/tiny_sst2",
                                                "files": {"train": "train.tsv", "dev": "dev.tsv",
                                                          "test": "test.tsv"},
                                                "encoding": "utf-8", "on_bad_rows": "error", "carve": None}}
    params["tokenize"]["datasets"]["tiny_sst2"] = {"kind": "classification", "max_seq_len": None}
    write_params(repo, params)
    targets = ["tokenize@tiny_sst2", "tokenize@polarity"]
    sh(repo, DVC, "repro", *targets)
    assert "up to date" in out(sh(repo, DVC, "status", "--with-deps", *targets))

    dev = raw / "dev.tsv"
    dev.write_text(dev.read_text().replace("fine work\t1", "fine work\t0"))  # one label flipped: one byte
    status = out(sh(repo, DVC, "status", "--with-deps", *targets))
    assert "prepare_local@tiny_sst2" in status and "data/raw/tiny_sst2" in status, status
    res = out(sh(repo, DVC, "repro", *targets))
    ran = sorted(line.split("'")[1] for line in res.splitlines() if line.startswith("Running stage"))
    assert ran == ["prepare_local@tiny_sst2", "tokenize@tiny_sst2"], res


@pytest.mark.slow  # ~80 s: a DVC pipeline to teacher_finetune, then two stage processes; fast, the same refusal:
# tests/store/test_store_lock.py (another process holds the store: refused at once, naming its pid) and
# tests/teacher/test_teacher_cache.py (the stage is refused before it loads its teacher)
def test_a_second_teacher_cache_process_on_one_store_is_refused(tmp_path, teacher):
    repo = working_tree_repo(tmp_path / "repo")
    params = tiny_params(teacher)
    write_params(repo, params)
    sh(repo, DVC, "repro", "tokenize@polarity", "teacher_finetune@polarity")
    cmd = [sys.executable, "-m", "stages.teacher_cache", "--dataset", "polarity", "--tokens", "data/tokens/polarity",
           "--teacher", "models/teacher/polarity", "--out", "data/teacher/polarity.zarr"]
    # the first writer is held inside its first shard (the hook sleeps before the shard is written)
    slow = ("import sys, time, runpy; import distillpipe.store.writer as w; orig = w.write_shard\n"
            "def slow(*a, **k):\n    print('WRITING', flush=True); time.sleep(30); return orig(*a, **k)\n"
            "w.write_shard = slow; sys.argv = ['stage'] + sys.argv[1:]; runpy.run_module('stages.teacher_cache', "
            "run_name='__main__')\n")
    first = subprocess.Popen([sys.executable, "-c", slow, *cmd[3:]], cwd=repo, env=env(repo),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "WRITING", first.stderr.read()
        t = time.time()
        second = subprocess.run(cmd, cwd=repo, env=env(repo), capture_output=True, text=True)
        assert time.time() - t < 20  # refused at once, not after waiting
        assert second.returncode == 2, second.stderr
        assert f"is being written by another process (pid {first.pid} on" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.kill()
        first.wait()
