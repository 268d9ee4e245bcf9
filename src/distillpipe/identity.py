"""What decides an output's bytes, as digests: content hashes of files and folders, and the code.

Every output of the pipeline is a function of its inputs, its params and the project code that produced
it. This module turns each of those into digests that resumable work (the teacher store's manifest,
training checkpoints, augment's chunks) compares before reusing anything:

* :func:`sha256_file`, :func:`sha256_dir`, :func:`json_sha256`: content and params digests;
* :func:`import_closure`: the project files a module (or a stage script) imports, transitively, read
  from the source with :mod:`ast` (function-local imports included, and every parent package's
  ``__init__``, which Python runs first). Each stage's fingerprint file covers exactly this closure
  (``distillpipe fingerprint`` writes them, ``distillpipe dvc-deps`` wires them into ``dvc.yaml``;
  ``tests/test_dvc_deps.py`` checks both against Python's own imports), and :func:`code_fingerprints` gives
  it for the identities above;
* :func:`fingerprint_file`: a source file's fingerprint by meaning: for Python, a digest of its syntax tree with
  comments, docstrings and layout left out (what is kept and dropped, and why, is in the function's docstring);
  for any other file, its bytes;
* :func:`stage_code`: the code part of a stage's resumable work (the store manifest, checkpoints, chunks):
  the fingerprints of the stage's WHOLE import closure, the very files its fingerprint file in ``fingerprints/``
  covers (``distillpipe fingerprint`` writes those; every stage of ``dvc.yaml`` depends on its own), plus, for
  a run of one student architecture, that architecture's closure (``student=``). Whatever makes DVC re-run the
  stage also makes the stage refuse to resume, so an edit anywhere in that code (row selection, teacher loading,
  a command's argument handling) can never leave an output its current code would not produce; and an edit that
  changes no meaning (a comment, a docstring, a reformat) changes no fingerprint, so neither DVC nor a store
  nor a checkpoint redoes any work for it.

Imports are read, not executed, so a closure may hold more than one run imports (an import inside an
``if``), never less. ``importlib.import_module`` with a computed name is not seen; the project uses it in
one place, on purpose: the students registry imports an architecture (``students/<key>.py``) by its key, so
that a stage's closure holds no architecture and a run's code is the stage's plus its own architecture's
(:data:`STUDENT_MODULES`; ``tests/test_dvc_deps.py`` checks no other module does it).
"""

from __future__ import annotations

import ast
import functools
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


@functools.lru_cache(maxsize=2048)
def _parse(source: str, filename: str) -> ast.Module:
    """``ast.parse``, once per text: a command computes the closures of many scripts over the same files. Keyed by
    the text itself (not a file's time), so an edited file is parsed again however soon. Callers do not modify
    the tree."""
    return ast.parse(source, filename)


@functools.lru_cache(maxsize=2048)
def _module_imports(source: str, filename: str, module: str, is_package: bool) -> frozenset[str]:
    return frozenset(_imported_names(_parse(source, filename), module, is_package))


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
        todo.extend(_imported_names(_parse(path.read_text(encoding="utf-8"), str(path)), "__main__", False))
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
        todo.extend(_module_imports(path.read_text(encoding="utf-8"), str(path), name, path.name == "__init__.py"))
    return sorted(set(found.values()))


# --------------------------------------------------------------------------------------------
# code: fingerprints by meaning
# --------------------------------------------------------------------------------------------

CODE_SCHEME = "ast-v1"
"""How code is identified: the prefix of every Python file's fingerprint (``ast-v1:<sha256>``; other files are
``sha256:<sha256>`` of their bytes) and of one-digest code identities. An identity without it was taken before
code was fingerprinted by meaning (each file's bytes, bare sha256): :func:`old_code_identity` tells such an output
apart, so that it is rebuilt once, saying why. A change to the normalisation below must change this name."""

_DROPPED_FIELDS = frozenset({"type_comment", "kind"})
"""AST fields that record how the source was written, not what it does: ``# type:`` comments, and the ``u``
prefix of a string (``u"a"`` is ``"a"``)."""


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _canonical(node: Any, out: list[str]) -> None:
    """Append a serialisation of ``node`` that depends only on what it means (see :func:`python_fingerprint`)."""
    if isinstance(node, ast.AST):
        out.append(f"({type(node).__name__}")
        for name in node._fields:
            if name in _DROPPED_FIELDS:
                continue
            value = getattr(node, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                value = [v for v in value if not _is_docstring(v)] or [ast.Pass()]
            if value is None or (isinstance(value, list) and not value):
                continue  # an absent optional field: the same tree whichever Python added the field
            out.append(f" {name}=")
            _canonical(value, out)
        out.append(")")
    elif isinstance(node, list):
        out.append("[")
        for v in node:
            _canonical(v, out)
            out.append(",")
        out.append("]")
    else:
        out.append(repr(node))  # a constant with its type (1, 1.0, True, -0.0, 'a', b'a' all differ) or a name


@functools.lru_cache(maxsize=2048)
def python_fingerprint(source: str, filename: str = "<source>") -> str:
    """The fingerprint by meaning of Python ``source``: ``ast-v1:`` and the sha256 of its syntax tree, written
    out without what cannot change what the code computes.

    Dropped, and why each cannot change an output:

    * **comments** (``# type:`` comments included): the parser discards them; no code can see them at run time.
    * **docstrings and other string statements**: a statement that is only a string constant does nothing when
      it runs (CPython emits no code for one, bar storing the first of a module, class or function as its
      ``__doc__``; ``python -OO`` drops even that). The one reader of a ``__doc__`` in this project is the
      command line's help text (``cli.py``), which is no stage output (``tests/test_identity.py`` checks no other
      module reads one). A body left empty counts as ``pass``.
    * **layout**: blank lines, indentation width, line breaks, parentheses that group nothing, quote style,
      implicitly joined strings (``"a" "b"`` is ``"ab"``), trailing commas. The tree has none of these.
    * **positions**: line and column numbers are attributes the serialisation leaves out. They reach only
      tracebacks, warnings and logs, never a stage's outputs.
    * **absent optional fields**: newer Pythons add fields that are empty in code that does not use their
      syntax (3.12's ``type_params``); leaving out every empty field gives the same fingerprint on 3.11-3.13.

    Kept: everything else, which is everything the compiler turns into code. Every name (a renamed local
    variable counts: conservative, although it rarely changes behaviour), constant with its type, operator,
    decorator, default value, annotation (dataclasses and pydantic read them), import and the order of
    statements."""
    out: list[str] = []
    _canonical(_parse(source, filename), out)
    return f"{CODE_SCHEME}:" + hashlib.sha256("".join(out).encode()).hexdigest()


def fingerprint_file(path: str | Path) -> str:
    """A source file's fingerprint: :func:`python_fingerprint` of a ``.py`` file, ``sha256:`` and the digest of
    the bytes of any other file (a stage reads such a file's every byte)."""
    path = Path(path)
    if path.suffix == ".py":
        return python_fingerprint(path.read_text(encoding="utf-8"), str(path))
    return "sha256:" + sha256_file(path)


def package_data(modules: Iterable[Path]) -> list[Path]:
    """The files other than Python source beside ``modules`` (in their folders, not below): what a module may
    read with ``importlib.resources``, so part of its code. Sorted; none in the project today."""
    folders = {Path(m).parent for m in modules}
    return sorted(p for d in folders for p in d.iterdir()
                  if p.is_file() and p.suffix not in (".py", ".pyc") and not p.name.startswith("."))


def code_fingerprints(modules: Iterable[str], package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """{file relative to the source root: fingerprint} over the import closure of ``modules`` and the package
    data beside it: the code part of an output's identity. Keyed by file, so a mismatch can name the files that
    changed."""
    root = package_dir.parent
    files = import_closure(modules, package_dir=package_dir)
    return {p.relative_to(root).as_posix(): fingerprint_file(p) for p in [*files, *package_data(files)]}


def code_identity(code: dict[str, str]) -> str:
    """One digest for a {file: fingerprint} code identity (a checkpoint's ``code``), its scheme named."""
    return f"{CODE_SCHEME}:{json_sha256(code)}"


def old_code_identity(value: Any) -> bool:
    """Whether ``value`` (a {file: digest} or one digest) identifies code by its bytes, as outputs made before
    fingerprints by meaning did: such an output is rebuilt once."""
    if isinstance(value, dict):
        return any(isinstance(v, str) and ":" not in v for v in value.values())
    return isinstance(value, str) and not value.startswith(f"{CODE_SCHEME}:")


OLD_CODE = ("its code was identified by each file's bytes (made before code fingerprints by meaning, "
            "docs/up-to-date.md); this once, it is redone")
"""Why an output with an :func:`old_code_identity` is rebuilt, for the message that says so."""


COMMANDS = f"{PACKAGE}.commands"
"""The command modules: ``stages/<stage>.py`` imports only ``distillpipe.commands.<stage>`` and calls its
``main`` (``tests/test_identity.py`` checks every stage script is exactly that), so the closure of the
command module is the stage's code."""


STUDENT_MODULES = f"{PACKAGE}.students"
"""Where the student architectures live: architecture ``key`` is the module ``distillpipe.students.<key>``, which the
registry imports by name when it builds a student of that key (so no stage's static closure holds it)."""


def stage_code(*stages: str, student: str | None = None, package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """{file: fingerprint} over the import closure of the commands of ``stages`` (``teacher_cache``,
    ``train``...), and with ``student`` that of the architecture the run trains (``waldorf``...): the code
    part of their resumable outputs' identity, equal to what the stages' fingerprint files hold (there the
    architecture's file comes from the run's item, ``fingerprints/students/${item.model.student}.json``).
    Named by string, not imported, so a lower layer (the teacher cache's driver) can name the stage that
    runs it without importing the command line."""
    modules = [f"{COMMANDS}.{s}" for s in stages] + ([f"{STUDENT_MODULES}.{student}"] if student else [])
    return code_fingerprints(modules, package_dir=package_dir)
