"""The command line: user errors exit 2 with one actionable message; inspect shows a store."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from _tiny import make_mlm_tokens, make_tiny_bert_dir, signals, write_params
from typer.testing import CliRunner

from distillpipe.cli import app

runner = CliRunner()
PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"
ROOT_PARAMS = yaml.safe_load(PARAMS.read_text())
WIKI_ARTICLES = ROOT_PARAMS["prepare"]["wiki_articles"]


def test_unknown_dataset_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["prepare", "--dataset", "nope", "--out", str(tmp_path / "o"),
                              "--params", str(PARAMS)])
    assert res.exit_code == 2
    assert "prepare has no dataset 'nope'" in res.output and "polarity" in res.output


def test_wrong_encoding_names_file_line_and_fix(tmp_path):
    polarity = {**ROOT_PARAMS["prepare"]["datasets"]["polarity"], "encoding": "utf-8"}
    params = {"prepare": {"wiki_articles": WIKI_ARTICLES, "datasets": {"polarity": polarity}, "local": {}}}
    res = runner.invoke(app, ["prepare", "--dataset", "polarity", "--out", str(tmp_path / "o"),
                              "--params", str(write_params(tmp_path / "p.yaml", params))])
    assert res.exit_code == 2
    assert "pang_lee_polarity.cor" in res.output and ":27" in res.output and "encoding" in res.output
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_hub_offline_fails_fast(tmp_path):
    sq = {"source": "hub", "name": "squad_v2", "subset": None, "revision": None, "splits": {"train": "train"},
          "text_field": "text", "carve": None}
    params = {"prepare": {"wiki_articles": WIKI_ARTICLES, "datasets": {"sq": sq}, "local": {}}}
    t = time.time()
    res = runner.invoke(app, ["prepare", "--dataset", "sq", "--out", str(tmp_path / "o"),
                              "--params", str(write_params(tmp_path / "p.yaml", params))])
    assert res.exit_code == 2 and time.time() - t < 10
    assert "prepare.local" in res.output and "format: squad" in res.output


def test_bad_params_file_is_a_clear_error(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("tokenize: {tokenizer: x, max_seq_len: big, datasets: {}}\n")
    res = runner.invoke(app, ["tokenize", "--dataset", "x", "--prepared", "a", "--out", "b", "--params", str(p)])
    assert res.exit_code == 2 and "tokenize.max_seq_len: expected an integer" in res.output


def test_inspect_and_verify(tmp_path):
    base = make_tiny_bert_dir(tmp_path / "base")
    tokens = make_mlm_tokens(tmp_path / "mlm", base, n_rows=40)
    params = write_params(tmp_path / "p.yaml", {"teacher_cache": {
        "device": "cpu", "batch_size": 8, "cpu_threads": 1, "shard_rows": 16,
        "datasets": {"toy": {"teacher": "base", "head": "base", "split": "train",
                             "max_rows": None, "signals": signals()}}}})
    res = runner.invoke(app, ["teacher-cache", "--dataset", "toy", "--tokens", str(tokens), "--teacher", str(base),
                              "--out", str(tmp_path / "s.zarr"), "--params", str(params)])
    assert res.exit_code == 0, res.output
    assert "teacher_cache toy: 40 rows in 3 shards" in res.output
    res = runner.invoke(app, ["inspect", str(tmp_path / "s.zarr"), "--verify"])
    assert res.exit_code == 0, res.output
    for expected in ("hidden/L1", "attn_scores/L2", "3 shards complete", "compression", "bytes/row", "verify: every"):
        assert expected in res.output, expected
    (tmp_path / "s.zarr" / "hidden" / "L2" / "c" / "1" / "0" / "0").write_bytes(b"garbage")
    res = runner.invoke(app, ["inspect", str(tmp_path / "s.zarr"), "--verify"])
    assert res.exit_code == 2 and "shard 1: hidden/L2/c/1/0/0" in res.stderr  # as training exits for the damage
    assert f"dvc checkout --force {tmp_path / 's.zarr'}" in res.stderr
    assert [line for line in res.stderr.splitlines() if line.startswith("error:")] == [
        f"error: teacher cache {tmp_path / 's.zarr'} is damaged (1 shard(s)):"]


def test_a_full_disk_nobody_described_is_one_error_line_exit_2(tmp_path, capsys):
    """Any command: an OSError saying the disk or the quota is full, even wrapped (torch.save raises a RuntimeError
    while handling it), exits 2 with one line naming the file and the space free; any other error keeps its
    traceback."""
    import errno

    import pytest
    import typer

    from distillpipe.commands.base import user_errors

    target = tmp_path / "out" / "model.pt"

    @user_errors
    def full(code):
        try:
            raise OSError(code, "No space left on device", str(target))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534") from None

    for code in (errno.ENOSPC, errno.EDQUOT):
        with pytest.raises(typer.Exit) as e:
            full(code)
        assert e.value.exit_code == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: No space left on device writing {target} (")
        assert f"MB free on {tmp_path})" in err[0] and "then run the command again" in err[0]
    with pytest.raises(RuntimeError):
        user_errors(lambda: (_ for _ in ()).throw(RuntimeError("a bug")))()  # not a full disk: a traceback


_FAULTS = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from distillpipe.commands.base import keep_freed_memory
    keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = np.ones(64 << 20, np.uint8)  # touched, then freed
del block
before = faults()
block = np.ones(64 << 20, np.uint8)
print(faults() - before)
"""


def test_stage_processes_reuse_freed_memory():
    """keep_freed_memory (every stage script's and the CLI's process): a freed 64 MB block is reused without a page
    fault, where glibc's default unmaps it and the next one faults in (and zeroes) every page again (~4 CPU-ms a MB
    on these VMs)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's malloc")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    faults = {mode: int(subprocess.run([sys.executable, "-c", _FAULTS, mode], env=env, capture_output=True, text=True,
                                       check=True).stdout) for mode in ("default", "keep")}
    # 64 MB is 16,384 pages of 4 KB, or 32 huge pages of 2 MB (numpy asks for huge pages on large arrays)
    assert faults["default"] >= 32 and faults["keep"] * 10 < faults["default"], faults
