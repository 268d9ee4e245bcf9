"""``distillpipe predict`` never loses or splits a row: a row is a line as ``wc -l`` counts it (a ``\\r\\n`` ending
accepted), in a lines file, a TSV and stdin alike, whatever bytes it holds (other line separators, CRs inside fields,
NULs, bytes that are not UTF-8). Hostile files, seeded as the readers' fuzz test makes them
(tests/data/test_sources_fuzz.py), go through the real command; the references are independent of the code: the
rows the generator wrote, ``wc -l`` itself, and a regular expression of UTF-8 (RFC 3629) for the byte offsets."""

import json
import random
import re
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from distillpipe.cli import app
from distillpipe.ship.rows import UTF8_BOM, split_lines

runner = CliRunner()
WORDS = [f"w{i}" for i in range(10, 60)]
INSIDE = {  # what must stay inside its row (none holds b"\n")
    "U+2028": "\u2028".encode(), "U+2029": "\u2029".encode(), "NEL": "\x85".encode(), "lone CR": b"\r",
    "CR CR": b"\r\r", "VT": b"\x0b", "FF": b"\x0c", "FS": b"\x1c", "GS": b"\x1d", "RS": b"\x1e", "NUL": b"\0",
    "0xff": b"\xff", "cut UTF-8": "é".encode()[:1], "overlong": b"\xc0\x80", "surrogate": b"\xed\xa0\x80",
    "latin-1": "café".encode("latin-1"), "cp1252 quote": b"\x93quoted\x94", "quote": b'"', "BOM": UTF8_BOM,
    "U+FFFD": "\ufffd".encode(), "emoji": "🙂".encode(),
}
UTF8 = re.compile(rb"""(?: [\x00-\x7f] | [\xc2-\xdf][\x80-\xbf] | \xe0[\xa0-\xbf][\x80-\xbf]
    | [\xe1-\xec\xee\xef][\x80-\xbf]{2} | \xed[\x80-\x9f][\x80-\xbf] | \xf0[\x90-\xbf][\x80-\xbf]{2}
    | [\xf1-\xf3][\x80-\xbf]{3} | \xf4[\x80-\x8f][\x80-\xbf]{2} )*""", re.X)
"""Well-formed UTF-8 (RFC 3629, section 4): its match's end is a row's first byte that is not UTF-8."""
SHAPES = {  # exported fixture: (a TSV header, the fields of a row)
    "classification": ("id\ttext", 1),
    "regression": ("id\tsentence1\tsentence2", 2),
    "qa": ("id\tquestion\tcontext", 2),
}


def _hostile(rng: random.Random) -> bytes:
    if rng.random() < 0.15:  # random bytes, any but the row's end
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 30))).replace(b"\n", b"")
    return INSIDE[rng.choice(sorted(INSIDE))]


def _cell(rng: random.Random) -> bytes:
    words = [w.encode() for w in rng.choices(WORDS, k=rng.randint(1, 12))]
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        words.insert(rng.randrange(len(words) + 1), _hostile(rng))
    return b" ".join(words)


def _file(rng: random.Random, kind: str, tsv: bool) -> tuple[bytes, list[tuple[int, bytes]], list[str]]:
    """A hostile file: its bytes, each row's (start offset, bytes without its ending) and the ids it gave."""
    header, n_fields = SHAPES[kind]
    data = UTF8_BOM if rng.random() < 0.2 else b""
    if tsv:
        data += header.encode() + rng.choice([b"\n", b"\r\n"])
    rows, ids = [], []
    n = rng.randint(1, 9)
    for k in range(n):
        ident = f"r{k}" + rng.choice(["", "", "\u2028x", "\x85"])  # records escape line breaks in strings
        cells = [b""] * n_fields if rng.random() < 0.1 else [_cell(rng) for _ in range(n_fields)]  # empty: an error
        raw = b"\t".join(([ident.encode()] if tsv else []) + cells)
        rows.append((len(data), raw))
        ids.append(ident)
        last = k == n - 1 and rng.random() < 0.25  # a last row without its ending
        data += raw + (b"" if last else rng.choice([b"\n", b"\n", b"\r\n"]))
    return data, rows, ids


def _predict(folder, data: bytes, tmp_path, *args: str, tsv: bool, stdin: bool):
    if stdin:
        res = runner.invoke(app, ["predict", str(folder), "--format", "tsv" if tsv else "lines", *args], input=data)
    else:
        path = tmp_path / ("in.tsv" if tsv else "in.txt")
        path.write_bytes(data)
        res = runner.invoke(app, ["predict", str(folder), "--input", str(path), *args])
    assert res.exception is None, res.exception
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output[-2000:]
    out = res.stdout_bytes
    lines = out.decode("utf-8").splitlines()  # the strictest reader: it splits on every line separator too
    assert out.count(b"\n") == len(lines) and out.endswith(b"\n") or not out
    return [json.loads(line) for line in lines]


def _first_bad(row: bytes, start: int) -> int | None:
    end = UTF8.match(row).end()
    return None if end == len(row) else start + end


def test_hostile_files_give_one_record_per_row_in_order(exported, tmp_path):
    rng = random.Random(0)
    seen = set()
    for case in range(36):
        kind = ("classification", "regression", "qa")[case % 3]
        tsv = kind != "classification" or rng.random() < 0.5
        data, rows, ids = _file(rng, kind, tsv)
        error = rng.random() < 0.3
        args = ["--invalid-utf8", "error"] if error else []
        records = _predict(exported[kind], data, tmp_path, *args, tsv=tsv, stdin=rng.random() < 0.3)
        what = (case, kind, tsv, data[:300])
        first = 2 if tsv else 1
        assert [r["line"] for r in records] == list(range(first, first + len(rows))), what
        if tsv:
            assert [r["id"] for r in records] == ids, what
        for rec, (start, raw) in zip(records, rows):
            bad = _first_bad(raw, start)
            if bad is not None and error:
                assert rec["error"].startswith(f"bytes that are not UTF-8, the first at byte offset {bad:,} "), what
            elif bad is not None:
                assert rec.get("invalid_utf8_offset") == bad, (what, rec)
            else:
                assert "invalid_utf8_offset" not in rec and "not UTF-8" not in rec.get("error", ""), (what, rec)
            seen.add("error" if "error" in rec else "flagged" if bad is not None else "predicted")
    assert seen == {"error", "flagged", "predicted"}, seen  # the generator does make each kind of row


@pytest.mark.skipif(shutil.which("wc") is None, reason="needs wc")
def test_random_bytes_give_as_many_records_as_wc_counts_lines(exported, tmp_path):
    rng = random.Random(1)
    pool = [b"\n", b"\r", b"\r\n", b"\t", b"\0", b"\xff", "\u2028".encode(), b"w11 ", b"w12 ", b"\x85", b"\x1c"]
    for case in range(12):
        if case % 2:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 400)))
        else:
            data = b"".join(rng.choices(pool, k=rng.randint(0, 60)))
        path = tmp_path / f"case{case}.txt"
        path.write_bytes(data)
        wc = int(subprocess.run(["wc", "-l", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])
        rows = wc + (1 if data and not data.endswith(b"\n") else 0)  # a last line without its \n is a row too
        records = _predict(exported["classification"], data, tmp_path, tsv=False, stdin=False)
        assert [r["line"] for r in records] == list(range(1, rows + 1)), (case, data)
        assert len(split_lines(data)) == rows


def test_the_issues_three_files(exported, tmp_path):
    """Issue 34: a byte that is not UTF-8 ended in a traceback with no row predicted; a line holding U+2028 and a TSV
    field holding a stray CR were split in two."""
    folder = exported["classification"]
    records = _predict(folder, b"w11 w12\nw13 \xff w14\nw15\n", tmp_path, tsv=False, stdin=False)
    assert [r["line"] for r in records] == [1, 2, 3] and all("label" in r for r in records)
    assert records[1]["invalid_utf8_offset"] == 12 and "invalid_utf8_offset" not in records[0]
    records = _predict(folder, "w11 w12\u2028w13\nw15\n".encode(), tmp_path, tsv=False, stdin=False)
    assert [r["line"] for r in records] == [1, 2]
    records = _predict(folder, b"text\nw11\rw12\nw15\n", tmp_path, tsv=True, stdin=False)
    assert [r["line"] for r in records] == [2, 3] and all("label" in r for r in records)


def test_a_row_keeps_what_is_inside_it():
    """The decoded rows themselves, against what was written: separators stay, a \\r\\n ending goes."""
    data = UTF8_BOM + "a\u2028b\x85c\rd\x0be\x0cf\x1cg\x1dh\x1ei\0j\r\n\r\nk\r\r\nl\xff".encode("utf-8") + b"\xff"
    lines = split_lines(data)
    assert [ln.text for ln in lines] == ["a\u2028b\x85c\rd\x0be\x0cf\x1cg\x1dh\x1ei\0j", "", "k\r", "l\xff\ufffd"]
    assert [ln.invalid_utf8_offset for ln in lines] == [None, None, None, len(data) - 1]


def test_text_values_with_bytes_that_are_not_utf8(exported):
    """A --text value holding bytes that are not UTF-8 (Python keeps them as lone surrogates) is one row too."""
    res = runner.invoke(app, ["predict", str(exported["classification"]), "--text", "w11 \udcff w12\u2028w13",
                              "--text", "w14"])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["line"] for r in records] == [1, 2] and records[0]["invalid_utf8_offset"] == 4
    assert "line 1: bytes that are not UTF-8, the first at byte offset 4" in res.stderr
