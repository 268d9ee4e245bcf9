"""The machine benchmark JSON (``benchmarks/at_scale.py`` writes it) and the rows/s it implies for a teacher cache
(for ``distillpipe plan``, :mod:`distillpipe.teacher.plan`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distillpipe.errors import UserError

BENCH_HINT = "python benchmarks/at_scale.py writes it"


class BenchError(UserError, ValueError):
    """The benchmark JSON cannot be read."""


@dataclass(frozen=True)
class Bench:
    """What ``benchmarks/at_scale.py`` measured on a machine (and assumed for a GPU)."""

    path: str
    date: str
    device: str
    device_name: str
    cores: int
    forward_flops_per_s: float
    forward_measured_on: str
    gpu_name: str
    gpu_flops_per_s: float
    projection_cores: int
    disk_write_bytes_per_s: float
    host_cpu_s_per_byte: float
    disk_read_bytes_per_s: float | None = None
    """The disk's sequential read (pages dropped), for a student's epoch from the cache (None: an older JSON)."""
    loader_cpu_s_per_byte: float | None = None
    """The block loader's CPU seconds per stored byte read (None: an older JSON)."""


_BENCH_KEYS = {"date": ("date",), "device": ("device",), "device_name": ("device_name",), "cores": ("cores",),
               "forward_flops_per_s": ("forward", "flops_per_s"), "forward_measured_on": ("forward", "measured_on"),
               "gpu_name": ("gpu", "name"), "gpu_flops_per_s": ("gpu", "flops_per_s"),
               "projection_cores": ("gpu", "projection_cores"),
               "disk_write_bytes_per_s": ("disk", "write_bytes_per_s"),
               "host_cpu_s_per_byte": ("host", "cpu_s_per_byte")}


def load_bench(path: Path) -> Bench | None:
    """The benchmark JSON at ``path``; None when there is none; BenchError when it is malformed."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BenchError(f"{path}: not readable JSON ({e}); {BENCH_HINT} again") from None
    values: dict[str, Any] = {"path": str(path)}
    for key, where in _BENCH_KEYS.items():
        value = data
        for part in where:
            if not isinstance(value, dict) or part not in value:
                raise BenchError(f"{path}: no {'.'.join(where)}; {BENCH_HINT} again")
            value = value[part]
        text = key in ("date", "device", "device_name", "forward_measured_on", "gpu_name")
        number = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        if not (isinstance(value, str) if text else number):
            raise BenchError(f"{path}: {'.'.join(where)} = {value!r} is not "
                             f"{'a string' if text else 'a positive number'}; {BENCH_HINT} again")
        values[key] = value
    for key, where in (("disk_read_bytes_per_s", ("disk", "read_bytes_per_s")),
                       ("loader_cpu_s_per_byte", ("loader", "cpu_s_per_byte"))):
        value = data.get(where[0], {}).get(where[1]) if isinstance(data.get(where[0]), dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            values[key] = value
    return Bench(**values)


def throughput(flops_per_row: float, row_bytes: float, disk_row_bytes: float, flops_per_s: float, cores: float,
               bench: Bench, n_rows: int | None) -> dict[str, Any]:
    """rows/s = the least of what compute, the host side and the disk allow; names the bound and the seconds."""
    limits = {"compute": flops_per_s / max(flops_per_row, 1.0),
              "host CPU": cores / (bench.host_cpu_s_per_byte * row_bytes),
              "disk": bench.disk_write_bytes_per_s / max(disk_row_bytes, 1.0)}
    bound = min(limits, key=limits.get)
    rate = limits[bound]
    return {"rows_per_s": rate, "bound": bound, "limits": limits,
            "seconds": None if n_rows is None else n_rows / rate}


NVME_BYTES_PER_S = 3e9
"""The sequential read of the NVMe a plan also projects a student's epoch to (one PCIe 4 drive, as benchmarks/
at_scale.py's ``--nvme-gb-s``)."""


def cached_vs_live(flops_per_row: float, disk_row_bytes: float, bench: Bench) -> dict[str, Any] | None:
    """On the projected GPU box: a student's epoch reading the cache (rows/s: the disk's read, or the loader's CPU
    on the cores left) against the teacher run live on every batch (its forward on the GPU), with the benchmark's
    disk and with a :data:`NVME_BYTES_PER_S` NVMe; None without the figures (an older benchmark JSON)."""
    return reading_rates(flops_per_row, disk_row_bytes, bench.gpu_flops_per_s, bench.projection_cores, bench)


def reading_rates(flops_per_row: float, disk_row_bytes: float, flops_per_s: float, cores: int,
                  bench: Bench) -> dict[str, Any] | None:
    """A student's epoch on a machine of ``flops_per_s`` and ``cores`` with the benchmark's disk: rows/s reading the
    cache (the disk's read, or the loader's CPU on the cores left: one drives the accelerator, one is the OS's)
    against the teacher run live (its forward at ``flops_per_s``); also from a :data:`NVME_BYTES_PER_S` NVMe. None
    without the figures (an older benchmark JSON)."""
    if bench.disk_read_bytes_per_s is None or bench.loader_cpu_s_per_byte is None:
        return None
    spare = max(1, cores - 2)
    live = flops_per_s / max(flops_per_row, 1.0)
    out: dict[str, Any] = {"live_rows_per_s": live}
    for disk, read in (("disk", bench.disk_read_bytes_per_s), ("nvme", NVME_BYTES_PER_S)):
        limits = {"disk": read / max(disk_row_bytes, 1.0),
                  "loader CPU": spare / (bench.loader_cpu_s_per_byte * max(disk_row_bytes, 1.0))}
        bound = min(limits, key=limits.get)
        prefix = "cached" if disk == "disk" else "nvme"
        out[f"{prefix}_rows_per_s"], out[f"{prefix}_bound"] = limits[bound], bound
        out[f"{prefix}_vs_live"] = limits[bound] / live
    return out
