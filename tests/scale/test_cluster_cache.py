"""The teacher cache on dask.distributed, with real clusters: a LocalCluster of worker processes, and a
`dask scheduler` + `dask worker` started as subprocesses for the `address` kind. The store is
byte-identical to an in-process build whatever the workers, the order shards finish in, a worker SIGKILLed
mid-shard (dask moves its task to another worker) or a driver SIGKILLed mid-build (the next one resumes)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import _dask_hooks
import cloudpickle
import pytest
from _tiny import make_mlm_tokens, make_tiny_bert_dir, signals

from distillpipe.config.base import build
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.scale.machine import load_machine
from distillpipe.store.reader import open_store
from distillpipe.teacher.cache import build_teacher_cache

distributed = pytest.importorskip("distributed")
cloudpickle.register_pickle_by_value(_dask_hooks)
SHARD = 16
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("dask_cache")
    base = make_tiny_bert_dir(root / "base")
    tokens = make_mlm_tokens(root / "mlm", base, n_rows=100)
    cfg = build(TeacherCacheDatasetConfig, {"teacher": "t", "head": "base", "split": "train", "max_rows": None,
                                            "signals": signals(hidden_layers=[1, 2], attn_layers=[2], pool=2)},
                "teacher_cache.datasets.toy")
    reference = root / "reference.zarr"
    build_teacher_cache("toy", tokens, base, cfg, "cpu", 8, SHARD, reference, cpu_threads=1)  # in-process
    return {"base": base, "tokens": tokens, "cfg": cfg, "reference": reference}


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def cluster_settings(**env):
    """The cluster as the environment ``env`` alone sets it (no machine.yaml)."""
    empty = Path(__file__).parent / "_empty_machine.yaml"
    return load_machine({"DISTILLPIPE_MACHINE": str(empty), **env}).cluster


def build_on(tiny, out, settings):
    return build_teacher_cache("toy", tiny["tokens"], tiny["base"], tiny["cfg"], "cpu", 8, SHARD, out, cpu_threads=1,
                               cluster=settings)


@pytest.mark.parametrize("workers", [pytest.param(1, marks=pytest.mark.slow), 2])  # 2 workers cover 1 (suite budget)
def test_local_cluster_store_is_byte_identical_to_inprocess(tiny, tmp_path, workers):
    summary = build_on(tiny, tmp_path / "s.zarr", cluster_settings(DISTILLPIPE_CLUSTER="local",
                                                                   DISTILLPIPE_WORKERS=str(workers)))
    assert summary.computed_rows == 100
    assert tree(tmp_path / "s.zarr") == tree(tiny["reference"])


def test_worker_killed_mid_shard_is_replaced_and_the_store_is_identical(tiny, tmp_path):
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \
            distributed.Client(lc) as client:
        client.run(_dask_hooks.kill_mid_shard, 3, str(tmp_path / "killed"))
        pids = set(client.run(_dask_hooks.pid).values())
        build_on(tiny, tmp_path / "s.zarr", cluster_settings(DISTILLPIPE_SCHEDULER=lc.scheduler_address))
        assert (tmp_path / "killed").exists()  # a worker really died half-way through shard 3
        assert set(client.run(_dask_hooks.pid).values()) != pids  # ... and its nanny started a new one
    assert not list((tmp_path / "s.zarr").rglob("*.partial"))
    assert tree(tmp_path / "s.zarr") == tree(tiny["reference"])


@pytest.mark.slow  # ~30 s: a worker process loading the teacher (the in-process full disk: tests/teacher/)
def test_full_disk_on_a_worker_ends_in_one_error_line_and_exit_2(tiny, tmp_path):
    """The disk fills up under the dask workers half-way through a shard: the worker's ENOSPC reaches the driver,
    which ends with exit 2 and one `error:` line naming the space the unfinished shards need and the space free; no
    partly written shard is marked; once there is room the build resumes to the bytes of one that never stopped."""
    from typer.testing import CliRunner

    from distillpipe.cli import app
    from distillpipe.store.shards import read_marker

    out, params = tmp_path / "s.zarr", _params(tmp_path)
    shard_bytes = sum(rec["size"] for rec in read_marker(tiny["reference"], 0)["files"].values() if rec)
    args = ["teacher-cache", "--dataset", "toy", "--tokens", str(tiny["tokens"]), "--teacher", str(tiny["base"]),
            "--out", str(out), "--params", str(params)]
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            distributed.Client(lc) as client:
        # the worker can write one shard and half of the next one
        client.run(_dask_hooks.fill_disk, str(out), shard_bytes * 3 // 2, str(Path(__file__).parents[1]))
        env = {"DISTILLPIPE_MACHINE": str(Path(__file__).parent / "_empty_machine.yaml"),
               "DISTILLPIPE_SCHEDULER": lc.scheduler_address}
        res = CliRunner().invoke(app, args, env=env)
        failed = [f for files in client.run(_dask_hooks.disk_failed).values() for f in files]
    assert failed and all(Path(f).is_relative_to(out) for f in failed)  # the workers' disk did fill up
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: no space left on device writing "), res.stderr
    assert f"the teacher cache {out} needs ~" in errors[0] and "unfinished shard(s) of 7" in errors[0], errors[0]
    assert " is free on its disk" in errors[0] and "dvc repro teacher_cache@toy" in errors[0], errors[0]
    marked = {int(p.stem) for p in (out / "shards_done").glob("*.json")}
    assert len(marked) <= 1  # one whole shard fitted: the one cut half-way does not count as written
    st = open_store(out, allow_incomplete=True)
    assert set(st.manifest.completed_shards) <= marked and st.verify(checksum=True) == {}
    build_on(tiny, out, None)  # the space is back (in this process)
    assert not list(out.rglob("*.partial"))
    assert tree(out) == tree(tiny["reference"])


@pytest.fixture
def external_cluster(tmp_path):
    """`dask scheduler` and one `dask worker` as subprocesses on localhost, as a user starts them."""
    sched_file = tmp_path / "scheduler.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(sched_file)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for _ in range(300):
            if sched_file.exists() and sched_file.stat().st_size:
                break
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        procs.append(subprocess.Popen([str(BIN / "dask"), "worker", address, "--nworkers", "1", "--nthreads", "1",
                                       "--no-dashboard"], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        with distributed.Client(address) as client:
            client.wait_for_workers(1, timeout=120)
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=60)


def _stage(tiny, out, env, params):
    cmd = [sys.executable, "-m", "distillpipe.cli", "teacher-cache", "--dataset", "toy", "--tokens",
           str(tiny["tokens"]), "--teacher", str(tiny["base"]), "--out", str(out), "--params", str(params)]
    return subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _params(tmp_path):
    from _tiny import write_params

    return write_params(tmp_path / "params.yaml", {"teacher_cache": {
        "device": "cpu", "batch_size": 8, "cpu_threads": 1, "shard_rows": SHARD,
        "datasets": {"toy": {"teacher": "base", "head": "base", "split": "train", "max_rows": None,
                             "signals": signals(hidden_layers=[1, 2], attn_layers=[2], pool=2)}}}})


@pytest.mark.slow  # ~25 s: a separate scheduler process; the killed-worker test above covers resume on a cluster
def test_address_kind_joins_a_running_scheduler_and_a_killed_driver_resumes(tiny, tmp_path, external_cluster):
    env = {"DISTILLPIPE_SCHEDULER": external_cluster}
    params = _params(tmp_path)
    out = tmp_path / "s.zarr"
    first = _stage(tiny, out, env, params)
    deadline = time.time() + 240  # a loaded 2-core machine (CI) can take a minute to start the driver
    while not ((out / "shards_done").is_dir() and any((out / "shards_done").iterdir())):
        assert time.time() < deadline and first.poll() is None, "the first driver finished no shard in 240 s"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)  # once the workers have finished a shard or two
    first.wait(timeout=60)
    assert not open_store(out, allow_incomplete=True, check_files=False).manifest.complete
    second = _stage(tiny, out, env, params)
    stdout, stderr = second.communicate(timeout=300)
    assert second.returncode == 0, stderr
    assert "dask cluster address" in stderr and "teacher_cache toy: 100 rows in 7 shards" in stdout
    for _ in range(100):  # tasks of the killed driver may still be finishing: they write the same bytes
        if not list(out.rglob("*.partial")):
            break
        time.sleep(0.1)
    assert tree(out) == tree(tiny["reference"])
