"""Bad input to ``distillpipe predict``: each bad row gets an error record in its place and a message naming its
line and the fix, and every other row is still predicted; input that cannot be read at all exits 2."""

import json

from typer.testing import CliRunner

from distillpipe.cli import app
from distillpipe.ship.predict import Predictor, Row

runner = CliRunner()


def _run(folder, *args, input=None):
    res = runner.invoke(app, ["predict", str(folder), *args], input=input)
    records = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return res, records


def test_bad_rows_get_an_error_and_the_rest_is_predicted(exported, tmp_path):
    lines = ["w11 w12 w13", "", "   ", "w14 " * 60, "w15 w16", "w20 " * 40]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    res, records = _run(exported["classification"], "--input", str(tmp_path / "in.txt"), "--max-chars", "200")
    assert res.exit_code == 0, res.output
    assert [r["line"] for r in records] == [1, 2, 3, 4, 5, 6]  # one record per input line, in order
    assert [r.get("error") for r in records] == [None, "empty input", "empty input",
                                                 "text of 240 characters, over the limit of 200 (--max-chars)", None,
                                                 None]
    assert all("label" in records[i] for i in (0, 4, 5))
    assert records[5]["truncated"] is True and "truncated" not in records[0]
    for expected in ("warning: line 2: empty input", "warning: line 4: text of 240 characters",
                     "warning: line 6: 42 tokens, cut to 32 as in training",
                     "6 rows (3 with an error, 1 truncated)"):
        assert expected in res.stderr, (expected, res.stderr)


def test_qa_row_without_a_context(exported, tmp_path):
    rows = "w1 w2 w9\tw20 w9 w33 w40\nw1 w2 w9\n\tw20 w9 w33\nw1 w9\t   \n"
    res, records = _run(exported["qa"], input=rows)
    assert res.exit_code == 0, res.output
    assert "answer" in records[0]
    assert records[1]["error"].startswith("no context: this model reads a question and its context per row; give "
                                          "the question and the context separated by a TAB")
    assert records[2]["error"] == "empty question" and records[3]["error"] == "empty context"
    assert "warning: line 2: no context" in res.stderr


def test_pair_row_without_its_second_sentence(exported):
    res, records = _run(exported["regression"], "--text", "w11 w12\tw13", "--text", "w11 w12")
    assert res.exit_code == 0, res.output
    assert isinstance(records[0]["score"], float)
    assert records[1]["error"].startswith("no second sentence: this model reads two sentences per row")


def test_unreadable_input_exits_2_with_one_message(exported, tmp_path):
    (tmp_path / "bad.tsv").write_text("identifier\tcontent\n1\tw11\n")
    for args, message in ((["--input", str(tmp_path / "bad.tsv")], "no column named text or sentence"),
                          (["--input", str(tmp_path / "missing.txt")], "missing.txt not found"),
                          (["--text", "w1", "--input", str(tmp_path / "bad.tsv")], "not both"),
                          (["--runtime", "onnx", "--text", "w1"], "export it with `distillpipe export hybrid-toy "
                                                                  "--onnx`"),
                          (["--batch-size", "0", "--text", "w1"], "--batch-size")):
        res = runner.invoke(app, ["predict", str(exported["classification"]), *args])
        assert res.exit_code == 2 and message in res.output, (args, res.output)
        assert "Traceback" not in res.output


def test_tsv_ids_and_short_rows(exported):
    p = Predictor(exported["regression"])
    records, summary = p.predict([Row(2, ("w11", "w12"), id="a"), Row(3, ("w11",), id="b")])
    assert records[0]["id"] == "a" and "score" in records[0]
    assert records[1] == {"line": 3, "id": "b", "error": records[1]["error"]} and summary.errors == 1
