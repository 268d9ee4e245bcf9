"""``distillpipe predict``'s input rows: bytes in (a file of lines, a TSV file, stdin, ``--text`` values), one
:class:`Row` per row out, never more and never fewer.

A row is a line as ``wc -l`` counts it: the bytes up to a ``\\n``, without it (and without a ``\\r`` right before it:
a ``\\r\\n`` ending is accepted); a last line without its ``\\n`` is a row too. Nothing else ends a row: a lone
``\\r``, U+2028/U+2029, U+0085 (NEL), ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e`` (all of which Python's
``str.splitlines`` splits on), a NUL, a byte that is not UTF-8 stay inside their row, in a lines file and in a TSV
alike (a TSV is split on TABs only, never quoted: ``csv``'s reader would end a row at a stray ``\\r``). Rows are split
as bytes, before decoding (no UTF-8 character holds the byte ``\\n``), so a bad byte cannot move a row boundary.

Each row is decoded as UTF-8 with ``errors="replace"`` (a byte that is not UTF-8 becomes U+FFFD), and the row
remembers the byte offset of its first such byte in the input; the predictor then either predicts it flagged, or
gives the row an error record naming the offset (``--invalid-utf8 replace|error``). A UTF-8 byte order mark at
the start of the input is dropped from the first row (a file of a BOM alone is one empty row).
"""

from __future__ import annotations

from dataclasses import dataclass

from distillpipe.errors import UserError

COLUMNS = {
    "single": (("text", "sentence", "text_a", "sentence1"),),
    "pair": (("text_a", "sentence1", "question1", "text"), ("text_b", "sentence2", "question2")),
    "qa": (("question",), ("context",)),
}
"""TSV header names accepted for each field of a row, in order of preference (GLUE's names included)."""
ID_COLUMNS = ("id", "idx")
UTF8_BOM = b"\xef\xbb\xbf"


class PredictInputError(UserError, ValueError):
    """Input that cannot be read at all (a missing file, a TSV without the columns the model needs)."""


@dataclass
class Row:
    """One input row: its position in the input (1-based: the line number, header included for a TSV), its fields,
    the id a TSV gave it, and the byte offset in the input of its first byte that is not UTF-8 (None: all valid)."""

    line: int
    fields: tuple[str, ...]
    id: str | None = None
    invalid_utf8_offset: int | None = None


@dataclass(frozen=True)
class Line:
    number: int
    """1-based, as ``wc -l`` and an editor count."""
    text: str
    """Decoded with errors="replace", without its ``\\n`` or ``\\r\\n`` ending."""
    invalid_utf8_offset: int | None
    """Byte offset in the input of the line's first byte that is not UTF-8, or None."""


def decode(raw: bytes, start: int = 0) -> tuple[str, int | None]:
    """``raw`` as UTF-8 with errors="replace", and the offset (``start`` + the index in ``raw``) of its first byte
    that is not UTF-8, or None."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return raw.decode("utf-8", errors="replace"), start + e.start


def split_lines(data: bytes) -> list[Line]:
    """The input's lines: split on ``\\n`` only, a ``\\r`` before it dropped, a last unended line kept."""
    offset, lines = 0, []
    while offset < len(data):
        end = data.find(b"\n", offset)
        stop = len(data) if end < 0 else end
        start = offset + len(UTF8_BOM) if offset == 0 and data.startswith(UTF8_BOM) else offset
        raw = data[start:stop]
        if end >= 0 and raw.endswith(b"\r"):
            raw = raw[:-1]
        text, bad = decode(raw, start)
        lines.append(Line(len(lines) + 1, text, bad))
        offset = stop + 1
    return lines


def _split(text: str, shape: str) -> tuple[str, ...]:
    return (text,) if shape == "single" else tuple(text.split("\t", 1))


def what(shape: str) -> str:
    """What a row of a model of this shape holds, in words."""
    return {"single": "one text per row", "pair": "two sentences per row (a pair)",
            "qa": "a question and its context per row"}[shape]


def rows_from_texts(texts: list[str], shape: str) -> list[Row]:
    """``--text`` values: one row each, whatever it holds (a pair or QA row: its two fields separated by the first
    TAB). Bytes of the command line that are not UTF-8 (which Python keeps as lone surrogates) are decoded as a
    file's are; their offset counts from the start of the value."""
    rows = []
    for i, t in enumerate(texts):
        text, bad = decode(t.encode("utf-8", errors="surrogateescape"))
        rows.append(Row(i + 1, _split(text, shape), invalid_utf8_offset=bad))
    return rows


def rows_from_lines(data: bytes, shape: str) -> list[Row]:
    """A file of lines: one row per line, blank lines included (they get an error record, so the output lines up
    with the input)."""
    return [Row(ln.number, _split(ln.text, shape), invalid_utf8_offset=ln.invalid_utf8_offset)
            for ln in split_lines(data)]


def rows_from_tsv(data: bytes, shape: str, where: str) -> list[Row]:
    """A TSV file with a header row; the columns are picked by name (:data:`COLUMNS`). Cells are split on TABs
    only; quotes are kept as they are."""
    lines = split_lines(data)
    if not lines or not lines[0].text.strip():
        raise PredictInputError(f"{where}: empty TSV file (a header row naming the columns comes first)")
    header = lines[0].text.split("\t")
    index = {name.strip().lower(): i for i, name in reversed(list(enumerate(header)))}  # the first of a name wins
    picks = []
    for choices in COLUMNS[shape]:
        found = next((index[c] for c in choices if c in index), None)
        if found is None:
            raise PredictInputError(f"{where}: no column named {' or '.join(choices)} in the header {header}: this "
                                    f"model reads {what(shape)}")
        picks.append(found)
    id_col = next((index[c] for c in ID_COLUMNS if c in index), None)
    rows = []
    for ln in lines[1:]:
        cells = ln.text.split("\t")
        fields = tuple(cells[i] if i < len(cells) else "" for i in picks)
        rows.append(Row(ln.number, fields, cells[id_col] if id_col is not None and id_col < len(cells) else None,
                        ln.invalid_utf8_offset))
    return rows
