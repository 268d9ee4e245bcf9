"""Hostile local files through the real command: whatever bytes a GLUE TSV, a SQuAD JSON, a text or a JSONL file
holds (random bytes, CR/LF mixes, BOMs, NULs, very long lines, wrong column counts, wrong JSON types), `distillpipe
prepare` either prepares it (exit 0) or stops with exit 2 and one `error:` line: never a traceback."""

import json
import random

import pytest
import yaml
from typer.testing import CliRunner

from distillpipe.cli import app

runner = CliRunner()
WIKI_ARTICLES = {"splits": {"dev": 0.15, "test": 0.15}, "seed": 0}
WORDS = "the a movie good bad plot was is not very and of to it film actor scene".split()


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))


def _glue_sst2(rng):
    return "sentence\tlabel\n" + "".join(f"{_sentence(rng)}\t{rng.randint(0, 1)}\n" for _ in range(12))


def _glue_cola(rng):  # no header: source, label, original label, sentence
    return "".join(f"gj04\t{rng.randint(0, 1)}\t\t{_sentence(rng)}\n" for _ in range(12))


def _glue_mrpc(rng):
    rows = [f"{rng.randint(0, 1)}\t{i}\t{i + 100}\t{_sentence(rng)}\t{_sentence(rng)}" for i in range(12)]
    return "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "\n".join(rows) + "\n"


def _squad(rng):
    context = _sentence(rng) + " Warsaw " + _sentence(rng)
    start = context.index("Warsaw")
    qas = [{"id": f"q{i}", "question": _sentence(rng) + "?", "answers": [{"text": "Warsaw", "answer_start": start}]}
           for i in range(6)]
    doc = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}
    if rng.random() < 0.5:  # a value of the wrong JSON type somewhere
        qa = rng.choice(qas)
        field, value = rng.choice([("question", 5), ("answer_start", "x"), ("answer_start", 3.5),
                                   ("answer_start", None), ("text", ["Warsaw"]), ("id", {"a": 1})])
        (qa["answers"][0] if field in ("answer_start", "text") else qa)[field] = value
    return json.dumps(doc, indent=rng.choice([None, 1]))


def _text(rng):
    return "".join(f"{_sentence(rng)}\n{_sentence(rng)}\n\n" for _ in range(6))


def _jsonl(rng):
    return "".join(json.dumps({"text": _sentence(rng), "n": i}) + "\n" for i in range(8))


SOURCES = {  # name: (make content, the prepare.local entry without path/files/encoding)
    "sst2": (_glue_sst2, {"format": "glue", "task": "sst2"}),
    "cola": (_glue_cola, {"format": "glue", "task": "cola"}),
    "mrpc": (_glue_mrpc, {"format": "glue", "task": "mrpc"}),
    "squad": (_squad, {"format": "squad"}),
    "text": (_text, {"format": "text", "text_field": "text"}),
    "jsonl": (_jsonl, {"format": "jsonl", "text_field": "text"}),
}


def _mutate(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """One seeded hostile change of ``data``, and its name."""
    kind = rng.choice(["random", "insert", "cr", "lone_cr", "crlf", "bom", "nul", "long", "columns", "truncate",
                       "utf16"])
    at = rng.randrange(len(data) + 1)
    if kind == "random":
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 3000))), kind
    if kind == "insert":
        return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))) + data[at:], kind
    if kind == "cr":
        return data[:at] + b"\r" + data[at:], kind
    if kind == "lone_cr":  # old Mac line ends, for the whole file or one line
        return (data.replace(b"\n", b"\r") if rng.random() < 0.5 else data.replace(b"\n", b"\r", 1)), kind
    if kind == "crlf":
        return data.replace(b"\n", rng.choice([b"\r\n", b"\r\r\n", b"\n\r"])), kind
    if kind == "bom":
        return rng.choice([b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff"]) + data, kind
    if kind == "nul":
        return data[:at] + b"\0" * rng.randint(1, 3) + data[at:], kind
    if kind == "long":
        return data[:at] + rng.choice([b"x", b"\t", b"{"]) * rng.choice([140_000, 300_000]) + data[at:], kind
    if kind == "columns":
        lines = data.split(b"\n")
        k = rng.randrange(len(lines))
        lines[k] = lines[k] + b"\textra" if rng.random() < 0.5 else lines[k].replace(b"\t", b" ")
        return b"\n".join(lines), kind
    if kind == "truncate":
        return data[:at], kind
    return data.decode("latin-1").encode("utf-16"), kind


def _cases(n: int, seed: int = 0):
    rng = random.Random(seed)
    names = sorted(SOURCES)
    for i in range(n):
        source = names[i % len(names)]
        data = SOURCES[source][0](rng).encode("utf-8")
        changes = []
        for _ in range(rng.choice([1, 1, 2])):
            data, kind = _mutate(rng, data)
            changes.append(kind)
        yield i, source, data, changes, rng.choice(["utf-8", "utf-8", "latin-1", "cp1252", "utf-16"]), \
            rng.choice(["error", "skip"])


def _prepare(tmp_path, i, source, data, encoding, on_bad_rows):
    folder = tmp_path / f"case{i}"
    folder.mkdir()
    (folder / "train.dat").write_bytes(data)
    entry = {**SOURCES[source][1], "path": str(folder), "files": {"train": "train.dat"}, "encoding": encoding,
             "carve": None}
    if source != "squad":
        entry["on_bad_rows"] = on_bad_rows
    params = tmp_path / f"params{i}.yaml"
    params.write_text(yaml.safe_dump({"prepare": {"wiki_articles": WIKI_ARTICLES, "datasets": {},
                                                  "local": {"d": entry}}}))
    return runner.invoke(app, ["prepare", "--dataset", "d", "--out", str(folder / "out"), "--params", str(params)])


def _check(res, what):
    assert res.exception is None or isinstance(res.exception, SystemExit), (what, res.exception)
    assert res.exit_code in (0, 2), (what, res.exit_code, res.output[-2000:])
    assert "Traceback" not in res.output, what
    if res.exit_code == 2:
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, (what, res.stderr[-2000:])


def test_hostile_local_files_exit_2_with_one_error_line_never_a_traceback(tmp_path):
    codes = []
    for i, source, data, changes, encoding, on_bad_rows in _cases(36):
        res = _prepare(tmp_path, i, source, data, encoding, on_bad_rows)
        _check(res, (i, source, changes, encoding, on_bad_rows))
        codes.append(res.exit_code)
    assert codes.count(2) >= len(codes) // 2, codes  # the generator does produce broken files


@pytest.mark.parametrize("source, data, encoding, needle", [
    # the hostile pass's two tracebacks (csv.Error from the TSV reader)
    ("sst2", b"sentence\tlabel\ngood\rmovie\t1\nbad movie\t0\n", "utf-8", "train.dat:2: the line holds a carriage"),
    ("sst2", b"sentence\tlabel\nfine\t1\n" + bytes(range(256)) * 4 + b"\n", "latin-1", "train.dat:3: the line holds"),
    ("sst2", b"sentence\tlabel\n" + b"x" * 200_000 + b"\t1\n", "utf-8", None),  # over csv's field size limit: fine
    ("squad", json.dumps({"data": [{"title": "T", "paragraphs": [{"context": "abc", "qas": [
        {"id": "q", "question": "?", "answers": [{"text": "b", "answer_start": 1.5}]}]}]}]}).encode(), "utf-8",
     "question 'q': answer_start is 1.5, not a whole number"),
])
def test_named_cases(tmp_path, source, data, encoding, needle):
    res = _prepare(tmp_path, 0, source, data, encoding, "error")
    _check(res, source)
    if needle is None:
        assert res.exit_code == 0, res.output
    else:
        assert res.exit_code == 2 and needle in res.stderr, res.stderr
