"""docs/embedded-results.md is the report of the embedded default as it stands: made from params.yaml's current
values (``distillpipe embedded-results``; a change to params.yaml's values cannot land without it regenerated)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from typer.testing import CliRunner

from distillpipe.cli import app
from distillpipe.commands.embedded_results import params_digest, recorded_digest

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_page_was_made_from_these_params():
    page = ROOT / "docs" / "embedded-results.md"
    assert page.is_file(), "docs/embedded-results.md is missing: `make repro && make embedded-results`"
    assert recorded_digest(page) == params_digest(ROOT / "params.yaml"), (
        "params.yaml's values changed since docs/embedded-results.md was made: run `make repro` on a fresh clone, "
        "then `make embedded-results REPRO_TIME=...` and commit the page")
    assert (ROOT / "docs" / "embedded-results.png").is_file()


def test_digest_is_of_values_not_layout(tmp_path):
    a, b, c = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml"
    a.write_text("train:\n  lr: 1.0e-3   # a comment\n  steps: [1, 2]\n")
    b.write_text("# another comment\ntrain:\n  steps:\n  - 1\n  - 2\n  lr: 0.001\n")
    c.write_text("train:\n  lr: 2.0e-3\n  steps: [1, 2]\n")
    assert params_digest(a) == params_digest(b)
    assert params_digest(a) != params_digest(c)


def test_page_is_the_report_verbatim_under_its_header(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    body = "# Results\n\nSome `table`.\n\n## Speed vs quality\n\n![Speed vs quality](results.png)\n"
    (tmp_path / "reports" / "results.md").write_text(body)
    (tmp_path / "reports" / "results.png").write_bytes(b"\x89PNG fake")
    (tmp_path / "params.yaml").write_text("a: 1\n")
    res = CliRunner().invoke(app, ["embedded-results", "--repro-time", "12 min 3 s"])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "docs" / "embedded-results.md").read_text()
    head, _, rest = page.partition("\n---\n\n")
    assert rest == body.replace("(results.png)", "(embedded-results.png)")
    assert "- `make repro`: 12 min 3 s" in head and "cores" in head
    assert recorded_digest(tmp_path / "docs" / "embedded-results.md") == params_digest(tmp_path / "params.yaml")
    assert (tmp_path / "docs" / "embedded-results.png").read_bytes() == b"\x89PNG fake"


def test_no_report_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("a: 1\n")
    res = CliRunner().invoke(app, ["embedded-results"])
    assert res.exit_code == 2 and "make repro" in res.output


def test_commit_is_clean_when_only_the_page_itself_changed(tmp_path, monkeypatch):
    """The page and its plot, which the command rewrites, do not make the commit "uncommitted"; any other tracked
    file does (the header names the code the report came from)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "results.md").write_text("# Results\n\n![plot](results.png)\n")
    (tmp_path / "reports" / "results.png").write_bytes(b"png 1")
    (tmp_path / "params.yaml").write_text("a: 1\n")

    def git(*args):
        return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                              capture_output=True, text=True).stdout.strip()

    def header_commit():
        res = CliRunner().invoke(app, ["embedded-results"])
        assert res.exit_code == 0, res.output
        line = next(x for x in (tmp_path / "docs" / "embedded-results.md").read_text().splitlines()
                    if x.startswith("- commit: "))
        return line.removeprefix("- commit: ")

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("reports/\n")  # a DVC output, as in the project
    header_commit()
    git("add", "-A")
    git("commit", "-qm", "page")
    head = git("rev-parse", "--short", "HEAD")
    (tmp_path / "reports" / "results.png").write_bytes(b"png 2")  # a new run: the page and plot get rewritten
    (tmp_path / "reports" / "results.md").write_text("# Results, again\n\n![plot](results.png)\n")
    assert header_commit() == head
    assert git("status", "--porcelain", "--untracked-files=no")  # the page and plot did change
    (tmp_path / "params.yaml").write_text("a: 2\n")
    assert header_commit() == f"{head} with uncommitted changes"
