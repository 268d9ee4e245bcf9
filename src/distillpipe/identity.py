"""What decides an output's bytes, as digests: content hashes of files and folders, and the code.

Every output of the pipeline is a function of its inputs, its params and the project code that produced
it. This module turns each of those into digests that resumable work (the teacher store's manifest,
training checkpoints, augment's chunks) compares before reusing anything:

* :func:`sha256_file`, :func:`sha256_dir`, :func:`json_sha256`: content and params digests;
* :func:`import_closure`: the project files a module (or a stage script) imports, transitively, read
  from the source with :mod:`ast` (function-local imports included, and every parent package's
  ``__init__``, which Python runs first). ``dvc.yaml`` lists exactly this closure as each stage's code
  deps (``distillpipe dvc-deps`` writes them; ``tests/test_dvc_deps.py`` checks it), and
  :func:`code_digests` hashes it for the identities above;
* :func:`stage_code`: the code part of a stage's resumable work (the store manifest, checkpoints, chunks):
  the stage's WHOLE import closure, the very files ``dvc.yaml`` lists as its code deps, plus, for a run of
  one student architecture, that architecture's closure (``student=``). Whatever makes DVC re-run the stage
  also makes the stage refuse to resume, so an edit anywhere in that code (row selection, teacher loading, a
  command's argument handling) can never leave an output its current code would not produce. The cost: an
  edit that changes no byte (a comment) rebuilds too; this is the safe side.

Imports are read, not executed, so a closure may hold more than one run imports (an import inside an
``if``), never less. ``importlib.import_module`` with a computed name is not seen; the project uses it in
one place, on purpose: the students registry imports an architecture (``students/<key>.py``) by its key, so
that a stage's closure holds no architecture and a run's code is the stage's plus its own architecture's
(:data:`STUDENT_MODULES`; ``tests/test_dvc_deps.py`` checks no other module does it).
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PACKAGE = "distillpipe"
PACKAGE_DIR = Path(__file__).resolve().parent
"""The installed package's folder (``src/distillpipe`` in a checkout)."""


# --------------------------------------------------------------------------------------------
# content digests
# --------------------------------------------------------------------------------------------


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_files(paths: Iterable[str | Path], root: str | Path | None = None) -> str:
    """One digest over several files (names relative to ``root`` and contents), order-independent."""
    h = hashlib.sha256()
    for p in sorted(Path(p) for p in paths):
        name = p.relative_to(root).as_posix() if root is not None else p.name
        h.update(name.encode() + b"\0" + sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def sha256_dir(folder: str | Path, patterns: Iterable[str] = ("*",)) -> str:
    """Digest of the files under ``folder`` matching ``patterns`` (names and contents; ``__pycache__``
    skipped). Raises FileNotFoundError when nothing matches: an empty digest would hide a wrong path."""
    folder = Path(folder)
    files = {p for pat in patterns for p in folder.rglob(pat) if p.is_file() and "__pycache__" not in p.parts}
    if not files:
        raise FileNotFoundError(f"no files matching {list(patterns)} in {folder}")
    return sha256_files(files, root=folder)


def json_sha256(obj: Any) -> str:
    """Digest of a JSON-able value (keys sorted, so dict order does not matter)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# code: import closures
# --------------------------------------------------------------------------------------------


def module_file(name: str, package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The source file of project module ``name`` (``distillpipe.a.b``), or None if there is none."""
    parts = name.split(".")
    if parts[0] != package_dir.name:
        return None
    base = package_dir.joinpath(*parts[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every absolute module name an ``import`` anywhere in ``tree`` may load: ``import a.b`` -> a.b;
    ``from a import b`` -> a and a.b (b may be a submodule or a name; callers keep what exists);
    relative imports resolved against ``module``."""
    names: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_closure(modules: Iterable[str] = (), scripts: Iterable[str | Path] = (),
                   package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Source files of the project's modules that ``modules`` and the files ``scripts`` import,
    transitively, the starting modules included (not the scripts), sorted.

    Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first, so those and their own
    imports are part of the closure. Only modules of the package in ``package_dir`` are followed.
    """
    package = package_dir.name
    todo: list[str] = []
    for m in modules:
        if module_file(m, package_dir) is None:
            raise ValueError(f"{m} is not a module of {package_dir}")
        todo.append(m)
    for script in scripts:
        path = Path(script)
        todo.extend(_imported_names(ast.parse(path.read_text(encoding="utf-8"), str(path)), "__main__", False))
    found: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in found or name.split(".")[0] != package:
            continue
        path = module_file(name, package_dir)
        if path is None:  # `from pkg import some_function`: the name is not a module
            continue
        found[name] = path
        todo.extend(_parents(name))
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        todo.extend(_imported_names(tree, name, path.name == "__init__.py"))
    return sorted(set(found.values()))


def code_digests(modules: Iterable[str], package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """{file relative to the source root: sha256} over the import closure of ``modules``: the code
    part of an output's identity. Keyed by file, so a mismatch can name the files that changed."""
    root = package_dir.parent
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in import_closure(modules, package_dir=package_dir)}


COMMANDS = f"{PACKAGE}.commands"
"""The command modules: ``stages/<stage>.py`` imports only ``distillpipe.commands.<stage>`` and calls its
``main`` (``tests/test_identity.py`` checks every stage script is exactly that), so the closure of the
command module is the stage's code."""


STUDENT_MODULES = f"{PACKAGE}.students"
"""Where the student architectures live: architecture ``key`` is the module ``distillpipe.students.<key>``, which the
registry imports by name when it builds a student of that key (so no stage's static closure holds it)."""


def stage_code(*stages: str, student: str | None = None, package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """{file: sha256} over the import closure of the commands of ``stages`` (``teacher_cache``,
    ``train``...), and with ``student`` that of the architecture the run trains (``waldorf``...): the code
    part of their resumable outputs' identity, equal to the stages' code deps in ``dvc.yaml`` (there the
    architecture's file comes from the run's item, ``src/distillpipe/students/${item.model.student}.py``).
    Named by string, not imported, so a lower layer (the teacher cache's driver) can name the stage that
    runs it without importing the command line."""
    modules = [f"{COMMANDS}.{s}" for s in stages] + ([f"{STUDENT_MODULES}.{student}"] if student else [])
    return code_digests(modules, package_dir=package_dir)
