"""Machine settings: defaults < machine file < environment, checked as strictly as params; the SLURM
settings reach dask-jobqueue's job script."""

import pytest

from distillpipe.config.base import ConfigError
from distillpipe.scale.machine import load_machine


def test_defaults_run_in_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no machine.yaml here
    m = load_machine({})
    assert m.cluster.kind == "inprocess" and m.students.nproc_per_node == 1


def test_file_then_environment_take_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "machine.yaml").write_text("cluster: {kind: local, n_workers: 4, memory_limit: 8GiB}\n"
                                           "students: {nproc_per_node: 2}\n")
    m = load_machine({})
    assert (m.cluster.kind, m.cluster.n_workers, m.cluster.memory_limit, m.students.nproc_per_node) == \
        ("local", 4, "8GiB", 2)
    m = load_machine({"DISTILLPIPE_WORKERS": "3", "DISTILLPIPE_NPROC": "1"})
    assert (m.cluster.kind, m.cluster.n_workers, m.students.nproc_per_node) == ("local", 3, 1)
    m = load_machine({"DISTILLPIPE_SCHEDULER": "tcp://10.0.0.5:8786"})  # an address alone means: join it
    assert (m.cluster.kind, m.cluster.address) == ("address", "tcp://10.0.0.5:8786")
    other = tmp_path / "gpu-box.yaml"
    other.write_text("cluster: {kind: local_cuda, n_workers: null}\n")
    assert load_machine({"DISTILLPIPE_MACHINE": str(other)}).cluster.kind == "local_cuda"


@pytest.mark.parametrize("text, env, match", [
    ("cluster: {kind: lokal}\n", {}, r"machine\.cluster\.kind: 'lokal' is not one of"),
    ("cluster: {workers: 2}\n", {}, r"machine\.cluster: unknown key\(s\) \['workers'\]"),
    ("clusters: {}\n", {}, r"unknown section\(s\) \['clusters'\]"),
    ("", {"DISTILLPIPE_WORKERS": "two"}, r"DISTILLPIPE_WORKERS='two': expected int"),
    ("", {"DISTILLPIPE_CLUSTER": "address"}, r"kind is address but no address is set"),
    ("students: {nproc_per_node: 0}\n", {}, r"need nproc_per_node >= 1 and loader_workers >= 0, got 0, 0"),
])
def test_bad_settings_name_the_source(tmp_path, monkeypatch, text, env, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "machine.yaml").write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_machine(env)


def test_slurm_settings_reach_the_job_script(tmp_path, monkeypatch):
    jobqueue = pytest.importorskip("dask_jobqueue")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "machine.yaml").write_text(
        "cluster:\n  kind: slurm\n  jobs: 3\n  slurm: {queue: gpu, cores: 8, memory: 64GB, processes: 1,\n"
        "    walltime: '04:00:00', job_extra_directives: ['--gres=gpu:1']}\n")
    settings = load_machine({}).cluster
    assert settings.jobs == 3
    script = jobqueue.SLURMCluster(**settings.slurm).job_script()  # what `sbatch` would get
    for line in ("#SBATCH -p gpu", "#SBATCH -n 1", "#SBATCH --cpus-per-task=8", "#SBATCH -t 04:00:00",
                 "#SBATCH --gres=gpu:1"):
        assert line in script, script
