"""The ``teacher_import`` stage: save a teacher (embedded, local or hub) into a DVC-tracked folder, so every
machine of a team distils from byte-identical weights (the teacher cache's manifest records their sha256)."""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

from distillpipe.assets import AssetError, hub_allow_patterns, hub_revision, resolve_model, weights_sha256
from distillpipe.teacher.arch import check_teacher_signals


def import_teacher(spec: str, out_dir: str | Path, asked: dict[str, list[str]] | None = None) -> str:
    """Copy the model files of ``spec`` into ``out_dir``; return a one-line summary. ``asked``: the signal kinds each
    teacher_cache dataset of this teacher asks for (:func:`~distillpipe.teacher.arch.teacher_signals`), refused
    from the model's config before anything is copied, so no fine-tuning runs for a cache that cannot be built."""
    src = resolve_model(spec)
    if asked:
        if not (src / "config.json").is_file():
            raise AssetError(f"{spec} ({src}) has no config.json: its architecture, hence the signals it can give, "
                             "is unknown")
        check_teacher_signals(json.loads((src / "config.json").read_text(encoding="utf-8")), asked)
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", ".gitattributes", "*.md")
    if hub_revision(src):  # a hub snapshot may hold files an earlier unfiltered download left (TF, Flax, ONNX)
        ignore = _hub_ignore(src)
    shutil.copytree(src, tmp, ignore=ignore)
    # the hub commit (None for embedded and local models) travels with the weights, in the DVC output
    source = {"spec": spec, **({"hub_revision": hub_revision(src)} if hub_revision(src) else {})}
    (tmp / "distillpipe_source.json").write_text(json.dumps(source) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    size = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    return (f"teacher_import: {spec} -> {out_dir} "
            f"({size / 2**20:.1f} MiB, weights sha256 {weights_sha256(out_dir)[:12]})")


def _hub_ignore(root: Path):
    """A copytree ``ignore`` keeping of a hub snapshot only what loading needs (:func:`hub_allow_patterns`)."""
    allow = hub_allow_patterns()

    def ignore(folder: str, names: list[str]) -> list[str]:
        rel = Path(folder).relative_to(root)
        return [n for n in names if (Path(folder) / n).is_dir() or str(rel) != "." or
                not any(fnmatch.fnmatch(n, pattern) for pattern in allow)]
    return ignore
