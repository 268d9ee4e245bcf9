"""``distillpipe params-style``: write params.yaml the way DVC writes it, so ``dvc exp run -S`` changes one line.

``dvc exp run -S key=value`` rewrites params.yaml through DVC's own YAML round trip
(``dvc.utils.hydra.apply_overrides``, which edits the file inside ``dvc.utils.serialize.modify_yaml``:
ruamel.yaml, lines wrapped at 80 columns, a null in a block mapping written as nothing, every list outside a
flow map re-assigned and so written in block style). A file not already in that style comes back re-written as
a whole: one value set, hundreds of lines changed. This command passes the file through that same function
(setting nothing), after turning each flow collection (``{...}``, ``[...]``) that the writer would wrap over
several lines into block style (wrapped, a flow map splits keys from their values and ends lines with spaces;
the other rows of its table follow it), and each text too long for its line into a folded block (``>-``)
folded at words within the writer's width (else it wraps a plain text the same way, and re-wraps a folded one
on top of its folds). The result is a fixed point of DVC's writer: ``-S`` then changes the line of the value
it sets and nothing else (``tests/test_params_style.py``). Comments stay where they are; values keep their
meaning.

Run it after adding keys by hand (``make params-style``); ``--check`` writes nothing and exits 1 when the file
is not in DVC's style.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from distillpipe.commands.base import ParamsOpt, user_errors
from distillpipe.errors import UserError

PASSES = 8
"""Round trips at most: each pass turns the outermost wrapped collections into blocks (nested ones then fit)."""
WIDTH = 80
"""DVC's writer wraps at ruamel.yaml's default width (``dvc.utils.serialize._yaml._get_yaml`` sets none)."""


def _lines(node: Any) -> set[int]:
    """The lines a loaded collection's keys and values start on, its own included (ruamel's ``lc``)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    lines = {node.lc.line}
    if isinstance(node, CommentedMap):
        for key, value in node.items():
            k_line, _, v_line, _ = node.lc.data[key]
            lines |= {k_line, v_line} | (_lines(value) if isinstance(value, CommentedMap | CommentedSeq) else set())
    elif isinstance(node, CommentedSeq):
        for i, value in enumerate(node):
            lines.add(node.lc.data[i][0])
            if isinstance(value, CommentedMap | CommentedSeq):
                lines |= _lines(value)
    return lines


def _wrapped(node: Any) -> list[Any]:
    """The outermost flow collections under ``node`` that span more than one line."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if not isinstance(node, CommentedMap | CommentedSeq):
        return []
    if node.fa.flow_style() and len(_lines(node)) > 1:
        return [node]
    values = node.values() if isinstance(node, CommentedMap) else node
    return [w for v in values for w in _wrapped(v)]


def _table_rows(node: Any) -> list[Any]:
    """Flow-style rows of each table (a mapping of mappings with the same keys: ``evaluate.runs``...) where another
    row is in block style: a table is written one way (the writer wraps only the longer rows)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    found = []
    rows = list(node.values()) if isinstance(node, CommentedMap) else []
    if rows and all(isinstance(v, CommentedMap) and set(v) == set(rows[0]) for v in rows):
        flow = [v for v in node.values() if v.fa.flow_style()]
        if len(flow) < len(node):
            found += flow
    if isinstance(node, CommentedMap | CommentedSeq):
        for value in node.values() if isinstance(node, CommentedMap) else node:
            found += _table_rows(value)
    return found


def _folds(text: str, indent: int) -> list[int] | None:
    """Positions of the spaces where ``text``, written from column ``indent``, folds into lines of at most
    :data:`WIDTH` columns (greedy, at words); None for a text folding cannot keep as it is."""
    if "\n" in text or "  " in text or text != text.strip() or not text:
        return None
    folds, start, column = [], 0, indent  # start: index of the word; column: where the line has got to
    for j, word in enumerate(text.split(" ")):
        if j and column + 1 + len(word) > WIDTH:
            folds.append(start - 1)  # the space before this word
            column = indent + len(word)
        else:
            column += (1 if j else 0) + len(word)
        start += len(word) + 1
    return folds


def _long_texts(node: Any) -> list[tuple[Any, Any, list[int]]]:
    """(mapping, key, folds) of each text value of a block mapping under ``node`` that does not fit its line,
    with the folds it should have; texts already folded so are left out."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import FoldedScalarString

    found = []
    if isinstance(node, CommentedMap):
        for key, value in node.items():
            if isinstance(value, str) and not node.fa.flow_style():  # (a flow mapping holds no folded text)
                col = node.lc.data[key][1]
                fits = col + len(str(key)) + 2 + len(value) + 2 <= WIDTH  # (+ 2: quotes the writer may add)
                folds = None if fits else _folds(value, col + 2)
                done = isinstance(value, FoldedScalarString) and getattr(value, "fold_pos", []) == folds
                if folds is not None and not done:
                    found.append((node, key, folds))
            else:
                found += _long_texts(value)
    elif isinstance(node, CommentedSeq):
        for value in node:
            found += _long_texts(value)
    return found


class StyleError(UserError):
    """params.yaml holds something DVC's writer would lose (what and how to fix it is in the message)."""


def _comments(text: str) -> Counter:
    """The comments of a YAML text (what follows `` #`` or a line's leading ``#``), as a multiset."""
    return Counter(m.group(1).strip() for m in re.finditer(r"(?:^|\s)#(.*)$", text, flags=re.MULTILINE))


def dvc_style(text: str, path: str | Path = "params.yaml") -> str:
    """``text`` as ``dvc exp run -S`` writes it (DVC's own ``apply_overrides``, setting nothing: a list outside a
    flow collection comes back in block style, nulls empty), with every flow collection that writer would wrap in
    block style and every text it would wrap folded at words: a fixed point of that writer."""
    from dvc.utils.hydra import apply_overrides
    from dvc.utils.serialize import dumps_yaml, parse_yaml_for_update
    from ruamel.yaml.scalarstring import FoldedScalarString

    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder) / "params.yaml"
        tmp.write_text(text, encoding="utf-8")
        for _ in range(PASSES):
            apply_overrides(tmp, [])
            out = tmp.read_text(encoding="utf-8")
            lost = _comments(text) - _comments(out)
            if lost:
                raise StyleError(f"{path}: DVC's writer drops the comment {next(iter(lost))!r}: a comment between a "
                                 "list and the next key goes with the list, which `dvc exp run -S` re-writes; move "
                                 "it (to the end of the next key's line, or above a key that follows no list)")
            data = parse_yaml_for_update(out, path)
            wrapped, long = _wrapped(data) + _table_rows(data), _long_texts(data)
            if not wrapped and not long:
                return out
            for node in wrapped:
                node.fa.set_block_style()
            for mapping, key, folds in long:
                folded = FoldedScalarString(str(mapping[key]))
                folded.fold_pos = folds
                mapping[key] = folded
            tmp.write_text(dumps_yaml(data), encoding="utf-8")
    raise RuntimeError(f"{path}: not a fixed point of DVC's writer after {PASSES} passes")  # a bug, not a user error


@user_errors
def params_style(params: ParamsOpt = Path("params.yaml"),
                 check: Annotated[bool, typer.Option("--check", help="write nothing; exit 1 if the file is not in "
                                                                      "DVC's style")] = False) -> None:
    """Write params.yaml in the style `dvc exp run -S` writes it (run after adding keys; `make params-style`), so
    that setting one value changes one line. Values and comments are kept."""
    if not params.is_file():
        raise FileNotFoundError(f"{params} not found (run from the repository root or pass --params)")
    text = params.read_text(encoding="utf-8")
    styled = dvc_style(text, params)
    if styled == text:
        typer.echo(f"{params}: in DVC's style")
        return
    if check:
        typer.echo(f"{params}: not in DVC's style (run `distillpipe params-style`)", err=True)
        raise typer.Exit(1)
    tmp = params.with_name(f".{params.name}.partial")
    tmp.write_text(styled, encoding="utf-8")
    tmp.replace(params)
    typer.echo(f"{params}: rewritten in DVC's style")
