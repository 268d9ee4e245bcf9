"""The ``teacher_import`` stage: save a teacher (embedded, local or hub) into a DVC-tracked folder, so every
machine of a team distils from byte-identical weights (the teacher cache's manifest records their sha256)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from distillpipe.assets import hub_revision, resolve_model, weights_sha256


def import_teacher(spec: str, out_dir: str | Path) -> str:
    """Copy the model files of ``spec`` into ``out_dir``; return a one-line summary."""
    src = resolve_model(spec)
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("__pycache__", ".gitattributes", "*.md"))
    # the hub commit (None for embedded and local models) travels with the weights, in the DVC output
    source = {"spec": spec, **({"hub_revision": hub_revision(src)} if hub_revision(src) else {})}
    (tmp / "distillpipe_source.json").write_text(json.dumps(source) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    size = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    return (f"teacher_import: {spec} -> {out_dir} "
            f"({size / 2**20:.1f} MiB, weights sha256 {weights_sha256(out_dir)[:12]})")
