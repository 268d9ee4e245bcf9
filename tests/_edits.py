"""Edits that tests make to a copy of the project's code, found by meaning rather than by a string.

A test that edits code to prove that the edit re-runs a stage, rebuilds a store or changes a fingerprint must edit
the code the stage really runs. A string search (``"return np.round(np.arange(max_rows)"`` in
``teacher/cache.py``) stops matching the day a refactor moves the code, and the test fails for the wrong reason.
Here a function is the live object that a module calls (``distillpipe.teacher.cache.row_subset``: wherever that
function now lives), its file is where Python found it, and the place of an edit is a node of the function's syntax
tree (a call, a ``return``, a local variable), whatever the layout. Each edit rewrites only the characters of that
node, so the rest of the file keeps its bytes, and returns the edited file's path relative to the copy's root.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def source_file(obj) -> str:
    """The file that defines ``obj`` (a function or a module), relative to the repository root."""
    return Path(inspect.getsourcefile(inspect.unwrap(obj))).resolve().relative_to(ROOT).as_posix()


def _function(tree: ast.Module, name: str, rel: str) -> ast.FunctionDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"{rel} defines {len(found)} functions named {name!r}: update this test's edit"
    return found[0]


def _offset(lines: list[str], line: int, col: int) -> int:
    """The character offset of (1-based ``line``, byte column ``col``) in the text made of ``lines``."""
    head = lines[line - 1].encode()[:col].decode()
    return sum(len(s) for s in lines[: line - 1]) + len(head)


def _span(lines: list[str], node: ast.AST) -> tuple[int, int]:
    return _offset(lines, node.lineno, node.col_offset), _offset(lines, node.end_lineno, node.end_col_offset)


def edit_function(repo: Path, func, edit: Callable[[ast.FunctionDef, str], list[tuple[ast.AST, str]]]) -> str:
    """Edit ``func`` (a live function of this working tree) in the copy of its file under ``repo``: ``edit`` gets
    the function's syntax tree and its source text and returns (node, new text) replacements. Returns the file,
    relative to ``repo``. The result must parse, and must differ."""
    rel = source_file(func)
    path = repo / rel
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    node = _function(ast.parse(text), func.__name__, rel)
    changes = sorted(((_span(lines, n), new) for n, new in edit(node, text)), reverse=True)
    assert changes, f"{rel}: nothing to edit in {func.__name__}: update this test's edit"
    for (start, end), new in changes:
        text = text[:start] + new + text[end:]
    ast.parse(text)
    path.write_text(text)
    return rel


def one(nodes: list, what: str, func: ast.FunctionDef):
    assert len(nodes) == 1, f"{func.name} has {len(nodes)} {what}, not one: update this test's edit"
    return nodes[0]


def swap_method_call(old: str, new: str):
    """The one call of ``<x>.<old>(...)`` in the function calls ``<x>.<new>(...)`` instead
    (``np.round`` -> ``np.floor``)."""

    def edit(func: ast.FunctionDef, text: str):
        call = one([n for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr == old], f"calls of .{old}(...)", func)
        return [(call.func, f"{ast.get_source_segment(text, call.func.value)}.{new}")]

    return edit


def scale_first_returned(factor: str):
    """The function's ``return a, b`` becomes ``return (a) * factor, b``: the first value it returns changes."""

    def edit(func: ast.FunctionDef, text: str):
        ret = one([n for n in ast.walk(func) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)],
                  "returns of a tuple", func)
        first = ret.value.elts[0]
        return [(first, f"({ast.get_source_segment(text, first)}) * {factor}")]

    return edit


def before_return(statement: Callable[[str], str]):
    """``statement(returned)`` runs before the function's last ``return``, where ``returned`` is the source of the
    (first) value it returns; ``statement`` gives lines without indentation."""

    def edit(func: ast.FunctionDef, text: str):
        ret = func.body[-1]
        assert isinstance(ret, ast.Return), f"{func.name} does not end in a return: update this test's edit"
        value = ret.value.elts[0] if isinstance(ret.value, ast.Tuple) else ret.value
        indent = " " * ret.col_offset
        lines = statement(ast.get_source_segment(text, value)).splitlines()
        code = "".join(f"{line}\n{indent}" for line in lines)
        return [(ret, code + ast.get_source_segment(text, ret))]

    return edit


def rename_first_local():
    """The first local variable the function assigns (a plain name, not a parameter) gets another name everywhere in
    the function: what the code does is unchanged, its syntax tree is not."""

    def edit(func: ast.FunctionDef, text: str):
        params = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)}
        used = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)}
        assigned = [t.id for n in ast.walk(func) if isinstance(n, ast.Assign) for t in n.targets
                    if isinstance(t, ast.Name) and t.id not in params]
        assert assigned, f"{func.name} assigns no local variable: update this test's edit"
        name = min(assigned, key=lambda v: min(n.lineno for n in ast.walk(func) if isinstance(n, ast.Name)
                                               and n.id == v))
        new = f"{name}_renamed"
        assert new not in used
        return [(n, new) for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == name]

    return edit
