"""The stages' code fingerprints: one small JSON file per stage script, which is all of the code DVC sees.

DVC re-runs a stage when a dep's bytes change. Were a stage's code deps its source files, a comment would re-run
it (and a comment in ``errors.py`` every stage: a teacher fine-tuning and a teacher cache of a TB). So the one
stage that reads the source, ``fingerprint`` (seconds, no model, no data), writes for each stage script
``fingerprints/<script>.json``: the fingerprint by meaning of every file of the script's import closure
(:func:`distillpipe.identity.fingerprint_file`: comments, docstrings and layout left out), and every other stage
depends on its script's file instead of the source. A comment edit re-runs ``fingerprint``, which writes the same
bytes, and DVC runs nothing else; an edit that changes what the code does changes exactly the files of the
scripts whose closure holds it, and DVC re-runs exactly their stages.

What a file covers:

* ``fingerprints/<script>.json``: the script ``stages/<script>.py`` and its import closure
  (:func:`distillpipe.identity.import_closure`), and the package data next to those modules (any non-Python
  file in their folders, by its bytes: a module may read one). For a script that builds students through the
  registry (``students/__init__.py`` in its closure), which imports an architecture only by its key, also what
  every architecture imports beyond that closure (``students/base.py``, ``students/heads.py``...).
* ``fingerprints/students/<key>.json``: architecture ``key``'s own module, ``students/<key>.py``, which a stage
  item depends on through its params (``fingerprints/students/${item.model.student}.json``), so an edit to
  WaLDORf re-runs WaLDORf's runs only. An architecture that imports a file of its own beyond its module
  is refused: no item could name that file (keep an architecture in one module).

The same per-file fingerprints are the code in every resumable output's identity (the teacher store's manifest,
checkpoints, augment's chunks: :func:`distillpipe.identity.stage_code`), so DVC, a store and a checkpoint never
disagree about what code made an output. The files are small and git-tracked: a commit's diff of
``fingerprints/`` says which stages it changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path

from distillpipe.config.students import ARCHITECTURES
from distillpipe.errors import UserError
from distillpipe.identity import (
    PACKAGE,
    STUDENT_MODULES,
    code_identity,
    fingerprint_file,
    import_closure,
    package_data,
)

FOLDER = "fingerprints"
"""Where the fingerprint files are, relative to the repository root (the ``fingerprint`` stage's output)."""
STAGES = "stages"
"""The stage scripts' folder, relative to the repository root."""
SELF = "fingerprint"
"""The stage (and script) that writes the fingerprint files: it depends on the source itself."""
SRC = f"src/{PACKAGE}"
REGISTRY = f"{SRC}/students/__init__.py"


class CodeLayoutError(UserError):
    """The code is laid out so that no fingerprint file could cover a stage's code exactly (what and how to fix
    it is in the message)."""


def stage_file(script: str) -> str:
    """The fingerprint file of stage script ``stages/<name>.py``: ``fingerprints/<name>.json``."""
    return f"{FOLDER}/{Path(script).stem}.json"


def architecture_file(key: str) -> str:
    return f"{FOLDER}/students/{key}.json"


@dataclass(frozen=True, eq=False)
class Closures:
    """Import closures of the package under ``root``, as repository-relative paths, each computed once by this
    object (make a new one after the source changes)."""

    root: Path
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def package_dir(self) -> Path:
        return self.root / SRC

    def _rel(self, paths) -> set[str]:
        return {p.relative_to(self.root).as_posix() for p in paths}

    def of_script(self, script: str) -> frozenset[str]:
        if ("script", script) not in self._memo:
            self._memo["script", script] = frozenset(self._rel(import_closure(scripts=[self.root / script],
                                                                              package_dir=self.package_dir)))
        return self._memo["script", script]

    def of_architecture(self, key: str) -> frozenset[str]:
        if ("architecture", key) not in self._memo:
            self._memo["architecture", key] = frozenset(self._rel(import_closure([f"{STUDENT_MODULES}.{key}"],
                                                                                 package_dir=self.package_dir)))
        return self._memo["architecture", key]

    def builds_students(self, script: str) -> bool:
        """Whether the script imports the students registry (which imports an architecture by its key)."""
        return REGISTRY in self.of_script(script)

    def shared_by_architectures(self, script: str) -> set[str]:
        """What every architecture imports beyond ``script``'s closure; refuses an architecture that imports a
        file of its own beyond its module (no stage item could name it)."""
        files = self.of_script(script)
        extra = {key: set(self.of_architecture(key)) - files for key in ARCHITECTURES}
        shared = reduce(set.intersection, extra.values())
        for key, own in extra.items():
            module = f"{SRC}/students/{key}.py"
            beyond = own - shared - {module}
            if module not in own or beyond:
                raise CodeLayoutError(
                    f"architecture {key!r} imports {sorted(beyond)} besides its module, what {script} imports and "
                    f"what every architecture imports; a stage item can name one file of its architecture only: "
                    f"keep {key!r} in {module} (or share the rest)")
        return shared

    def stage_files(self, script: str) -> set[str]:
        """The files ``fingerprints/<script>.json`` covers (the script, its closure, the architectures' shared
        code when it builds students, the package data beside them), repository-relative."""
        files = set(self.of_script(script))
        if REGISTRY in files:
            files |= self.shared_by_architectures(script)
        files |= self._rel(package_data(self.root / f for f in files))
        return files | {script}


def _document(name: str, root: Path, files: set[str]) -> str:
    prints = {f: fingerprint_file(root / f) for f in sorted(files)}
    doc = {"stage": name, "fingerprint": code_identity(prints), "files": prints}
    return json.dumps(doc, indent=1) + "\n"


def stage_scripts(root: Path) -> list[str]:
    """Every stage script but the fingerprint stage's own, repository-relative, sorted."""
    if not (root / STAGES).is_dir():
        return []
    return sorted(p.relative_to(root).as_posix() for p in (root / STAGES).glob("*.py")
                  if p.stem not in (SELF, "__init__"))


def documents(root: Path) -> dict[str, str]:
    """{fingerprint file (repository-relative): its text} for every stage script and architecture under
    ``root``."""
    closures = Closures(root)
    docs = {stage_file(s): _document(Path(s).stem, root, closures.stage_files(s)) for s in stage_scripts(root)}
    if any(closures.builds_students(s) for s in stage_scripts(root)):
        for key in ARCHITECTURES:
            docs[architecture_file(key)] = _document(f"students/{key}", root, {f"{SRC}/students/{key}.py"})
    return docs


def write(root: Path, out: Path) -> tuple[list[str], list[str]]:
    """Write the fingerprint files into ``out`` (``fingerprints/`` under ``root``), each only if its text
    changed (an unchanged file keeps its bytes and its time), and remove the files of scripts that are gone.
    Returns (changed, removed), repository-relative."""
    docs = documents(root)
    changed, removed = [], []
    for rel, text in docs.items():
        path = out / Path(rel).relative_to(FOLDER)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.partial")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
            changed.append(rel)
    if out.is_dir():
        for path in sorted(out.rglob("*.json")):
            rel = f"{FOLDER}/{path.relative_to(out).as_posix()}"
            if rel not in docs:
                path.unlink()
                removed.append(rel)
    return changed, removed


def stale(root: Path, out: Path) -> list[str]:
    """The fingerprint files under ``out`` that differ from what :func:`write` would write (missing, changed or
    left over), repository-relative."""
    docs = documents(root)
    have = {f"{FOLDER}/{p.relative_to(out).as_posix()}": p.read_text(encoding="utf-8")
            for p in out.rglob("*.json")} if out.is_dir() else {}
    return sorted(k for k in docs.keys() | have.keys() if docs.get(k) != have.get(k))
