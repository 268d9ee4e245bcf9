"""``distillpipe embedded-results``: keep the report of a ``make repro`` run as ``docs/embedded-results.md``.

The report of the embedded default (``reports/results.md`` and its plot) is what a newcomer judges the tool by,
and it is an output, not in git. This command copies it, verbatim below a short header, to
``docs/embedded-results.md`` (the plot beside it), so that a reader sees it before running anything. The header
says when, where and from what it was made: the date, the machine (CPU model, cores, memory, OS), the commit, the
measured ``make repro`` time when given, and the digest of params.yaml's values (:func:`params_digest`: comments
and layout do not count). ``tests/test_embedded_results.py`` fails when params.yaml's digest is not the page's, so a
change to the embedded params cannot land without the page regenerated (``make repro && make embedded-results``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Annotated

import typer
import yaml

from distillpipe.commands.base import ParamsOpt, user_errors

DIGEST_LINE = re.compile(r"^- params\.yaml digest: `([0-9a-f]{16})`", re.MULTILINE)
"""How the page records the params it was made from (:func:`recorded_digest` reads it back)."""


def params_digest(params: Path) -> str:
    """sha256 (16 hex digits) of params.yaml's values in canonical JSON: a comment or a re-flow changes nothing,
    any value does."""
    values = yaml.safe_load(params.read_text(encoding="utf-8"))
    canonical = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def recorded_digest(page: Path) -> str | None:
    """The params digest a page written by this command records; None when it records none."""
    m = DIGEST_LINE.search(page.read_text(encoding="utf-8"))
    return m.group(1) if m else None


def machine() -> str:
    """``<CPU model>, <n> cores, <GiB> GiB, <OS>``: the machine the numbers were measured on."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(errors="replace"), re.MULTILINE)
        model = found.group(1).strip() if found else model
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        memory = ""
    return f"{model}, {cores} cores{memory}, {platform.system()} {platform.release()}"


def _commit(page: Path) -> str:
    """HEAD's short hash, "with uncommitted changes" when a tracked file differs from it; the page and its plot
    (``<page stem>.*``, which this command itself rewrites) do not count."""
    own = f":(exclude,glob){(page.parent / page.stem).as_posix()}.*"
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", own],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return rev.stdout.strip() + (" with uncommitted changes" if dirty else "")


@user_errors
def embedded_results(
    params: ParamsOpt = Path("params.yaml"),
    report: Annotated[Path, typer.Option(help="the report stage's Markdown")] = Path("reports/results.md"),
    out: Annotated[Path, typer.Option(help="where the page goes (its plot beside it, same stem)")] = Path(
        "docs/embedded-results.md"),
    repro_time: Annotated[str, typer.Option(help="the measured `make repro` time, as text (\"14 min 2 s\")")] = "",
) -> None:
    """Copy reports/results.md (and its plot) to docs/embedded-results.md under a header naming the date, the
    machine, the commit and the params it was made from (run after `make repro`; `make embedded-results`)."""
    if not report.is_file():
        raise FileNotFoundError(f"{report} not found: run `make repro` first (its report stage writes it)")
    text = report.read_text(encoding="utf-8")
    commit = _commit(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    for link in links:
        src = report.parent / link
        if not src.is_file():
            raise FileNotFoundError(f"{report} links {link}, which is not there: re-run the report stage")
        dst = out.with_name(f"{out.stem}{src.suffix}")
        shutil.copyfile(src, dst)
        text = text.replace(f"]({link})", f"]({dst.name})")
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    header = [
        "# Results of the embedded default",
        "",
        "What `make repro` reports on a fresh clone: `reports/results.md`, copied below the line as the report stage",
        "wrote it (only the plot's link changed, to the copy beside this page). Regenerate it after any change to",
        "params.yaml's values: `make repro && make embedded-results` (a test fails while the digest below is not",
        "params.yaml's). What these numbers can and cannot show: the README, \"What `make repro` does, and what",
        "it shows\".",
        "",
        f"- date: {today} (UTC)",
        f"- machine: {machine()}",
        f"- commit: {commit}",
        *([f"- `make repro`: {repro_time}, setup included"] if repro_time else []),
        f"- params.yaml digest: `{params_digest(params)}`",
        "",
        "---",
        "",
        "",
    ]
    out.write_text("\n".join(header) + text.lstrip("\n"), encoding="utf-8")
    typer.echo(f"{report} -> {out}")
