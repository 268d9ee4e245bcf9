"""The docs cannot drift from the code: README.md and docs/*.md are checked against the CLIs, the Makefile and the tree.

- Every ``distillpipe ...`` line in a fenced code block, and every inline code span that is a command line, names a
  real subcommand, and click's own parser, built from the Typer app of ``distillpipe.cli``, accepts its options: an
  unknown or renamed option fails, and so do a value a ``Literal`` option does not have and an extra argument.
- Every ``dvc ...`` line is parsed by DVC's own argparse parser (``dvc.cli.parser``, nothing is run), with prefix
  abbreviations turned off so that ``--only`` does not pass for ``--only-changed``; ``dvc repro`` targets name
  stage groups of dvc.yaml.
- ``make <target>`` names a target of the Makefile.
- Relative links point to existing files, and their ``#anchors`` to headings of those files (GitHub's slugs);
  inline code spans that are repository paths (``src/...``, ``tests/...``, ``benchmarks/...``, ``stages/...``) exist.

Shell syntax is read as a shell would split it: ``\\`` continuations, ``NAME=value`` prefixes, ``cd x &&`` chains
and pipes, comments, redirections, and a ``$ `` prompt. Placeholders (``<name>``), ``...`` and the ``[--opt]``
brackets of optional parts are not words the CLI sees. The checker itself is tested on invented options below.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest
import typer
import yaml

from distillpipe.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMANDS = ("distillpipe", "dvc", "make")
SEPARATORS = {"&&", "||", ";", "|", "&"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1", "&>"}
PLACEHOLDER = re.compile(r"<[^<>\s]+>")
PATH_PREFIXES = ("src/", "tests/", "benchmarks/", "stages/")


# ---------------------------------------------------------------------------------------------------- reading pages

def fenced_lines(text: str) -> list[tuple[int, str]]:
    """(line number, logical line) of every fenced code block, ``\\`` continuations joined."""
    out, fence, pending, start = [], False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^\s*```.*?^\s*```[^\n]*$", "", text, flags=re.M | re.S)


def inline_code(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(text))


def command_lines(page: Path) -> list[tuple[str, str]]:
    """(where, line) of every command line the page shows: fenced blocks, and inline code that starts with one."""
    text = page.read_text()
    name = page.relative_to(ROOT)
    found = [(f"{name}:{n}", line) for n, line in fenced_lines(text)]
    for span in inline_code(text):
        words = span.split()
        # `dvc exp`, `dvc plots`: prose naming a command group, not a command line
        if len(words) >= 2 and words[0] in COMMANDS and not (words[0] == "dvc" and len(words) == 2):
            found.append((f"{name} (inline)", span))
    return found


def segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line that start with one of COMMANDS, as the words the program receives."""
    line = line.strip()
    if line.startswith("$ "):
        line = line[2:]
    line = PLACEHOLDER.sub("X", line).replace("$'", "'")
    words = [w for w in re.split(r"\s+", line) if w]
    if not any(w in COMMANDS for w in words):
        return []
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    out, current = [], []
    for token in [*tokens, ";"]:
        if token in SEPARATORS:
            out.append(current)
            current = []
        else:
            current.append(token)
    commands = []
    for seg in out:
        while seg and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", seg[0]):  # NAME=value prefixes
            seg = seg[1:]
        words, skip = [], False
        for token in seg:
            if skip:
                skip = False
            elif token in REDIRECTS:
                skip = True
            elif token not in ("...", "…"):
                words.append(token.removeprefix("[").removesuffix("]"))
        if words and words[0] in COMMANDS:
            commands.append(words)
    return commands


# ---------------------------------------------------------------------------------------------------- the checkers

CLI = typer.main.get_command(app)
try:  # typer >= 0.2x carries its own copy of click; older ones use click itself
    from typer._click import core as click_core
    from typer._click.exceptions import UsageError
except ImportError:
    from click import core as click_core
    from click.exceptions import UsageError


def choices(param) -> tuple | None:
    """The values a ``Literal`` (or click ``Choice``) option accepts; None for any other type."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    return getattr(getattr(param, "type", None), "choices", None)


def check_distillpipe(words: list[str]) -> None:
    """Raise AssertionError unless the distillpipe command line parses with click's own parser."""
    args = words[1:]
    if args in ([], ["--help"]):
        return
    assert args[0] in CLI.commands, f"no subcommand {args[0]!r} (have {sorted(CLI.commands)})"
    cmd = CLI.commands[args[0]]
    ctx = click_core.Context(cmd, info_name=args[0])
    try:
        values, extra, _ = cmd.make_parser(ctx).parse_args(args[1:])
    except UsageError as e:
        raise AssertionError(f"distillpipe {args[0]}: {e.format_message()}") from None
    assert not extra, f"distillpipe {args[0]}: unexpected arguments {extra}"  # what no argument of the command took
    for p in cmd.params:
        given, allowed = values.get(p.name), choices(p)
        if allowed and isinstance(given, str) and given != "X":
            assert given in allowed, f"distillpipe {args[0]} {p.opts[0]} {given}: not one of {allowed}"


def _dvc_parser() -> argparse.ArgumentParser:
    from dvc.cli.parser import get_main_parser

    parser = get_main_parser.__wrapped__()  # a fresh one: abbreviations are turned off below
    todo = [parser]
    while todo:
        p = todo.pop()
        p.allow_abbrev = False
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return parser


DVC_PARSER = _dvc_parser()
DVC_STAGES = set(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])


def check_dvc(words: list[str]) -> None:
    """Raise AssertionError unless DVC's own parser accepts the line (nothing runs)."""
    from dvc.cli import DvcParserError

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            ns, unknown = DVC_PARSER.parse_known_args(words[1:])
    except (DvcParserError, SystemExit):
        raise AssertionError(f"dvc rejects {shlex.join(words)}:\n{out.getvalue()[-800:]}") from None
    assert not unknown, f"dvc: unrecognized arguments {unknown}"
    if words[1:2] == ["repro"]:
        for target in ns.targets:
            if "/" not in target and target != "X":  # a stage (group), not a dvc.yaml path or a placeholder
                assert target.split("@")[0] in DVC_STAGES, f"dvc repro {target}: no such stage in dvc.yaml"


MAKE_TARGETS = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", (ROOT / "Makefile").read_text(), flags=re.M))


def check_make(words: list[str]) -> None:
    for target in words[1:]:
        if not target.startswith("-") and "=" not in target:
            assert target in MAKE_TARGETS, f"make {target}: no such target (have {sorted(MAKE_TARGETS)})"


CHECKERS = {"distillpipe": check_distillpipe, "dvc": check_dvc, "make": check_make}


def check_line(line: str) -> int:
    """Check every command of one shell line; return how many were checked."""
    commands = segments(line)
    for words in commands:
        CHECKERS[words[0]](words)
    return len(commands)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*?|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page.read_text()).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", prose(page.read_text()))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with anchor #{anchor} in {file.name}")
    return broken


# ---------------------------------------------------------------------------------------------------- the tests

@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_exist(page):
    failures, checked = [], 0
    for where, line in command_lines(page):
        try:
            checked += check_line(line)
        except (AssertionError, ValueError) as e:  # ValueError: shlex on unbalanced quotes
            failures.append(f"{where}: {line.strip()}\n    {e}")
    assert not failures, "\n".join(failures)


def test_pages_show_commands():
    """The checker sees the commands the pages show (a parsing slip would otherwise pass everything)."""
    counts = {p.name: sum(check_line(line) for _, line in command_lines(p)) for p in PAGES}
    assert counts["README.md"] >= 4 and counts["use-your-student.md"] >= 6 and counts["your-data.md"] >= 8, counts
    assert sum(counts.values()) >= 60, counts


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_paths_exist(page):
    broken = broken_links(page)
    for span in inline_code(page.read_text()):
        if span.startswith(PATH_PREFIXES) and not re.search(r"[<>*{}\s]|\.\.\.", span):
            if not (ROOT / span.split(":")[0]).exists():
                broken.append(f"`{span}`: no such path")
    assert not broken, "\n".join(broken)


def test_every_page_is_linked_from_the_readme():
    linked = set(re.findall(r"\]\(docs/([^)#]+)", (ROOT / "README.md").read_text()))
    assert {p.name for p in PAGES[1:]} <= linked


@pytest.mark.parametrize("line", [
    "distillpipe plan --no-such-flag",                                  # an invented option
    "distillpipe no-such-command --out x",                              # an invented subcommand
    "distillpipe export hybrid-polarity --out a b",                     # one positional too many
    "distillpipe predict exported/x --runtime tensorflow",              # a choice the option does not have
    "cd x && distillpipe predict DIR --text a \\\n --no-such-flag",       # continuation, cd chain
    "DISTILLPIPE_CLUSTER=local dvc repro teacher_cache --no-such-flag",  # an env prefix
    "cat x | distillpipe predict DIR --no-such > y.jsonl",
    "dvc exp show --only",                                              # an abbreviation argparse would accept
    "dvc exp shw",
    "dvc repro no_such_stage@x",
    "make no-such-target",
])
def test_checker_rejects_invented(line):
    lines = [joined for _, joined in fenced_lines(f"```\n{line}\n```")]
    with pytest.raises(AssertionError):
        for joined in lines:
            check_line(joined)


@pytest.mark.parametrize("line", [
    "distillpipe predict exported/x --text $'a\\tb' --runtime onnx   # a comment --no-such-flag",
    "dvc exp apply <name>",
    "distillpipe prepare --dataset wiki --out data/prepared/wiki [--params params.yaml]",
    "$ distillpipe plan",
    "git add dvc.lock && git commit -m 'make no-such-target'",          # not a make command
])
def test_checker_accepts_real(line):
    assert check_line(line) <= 1


def test_link_checker_rejects(tmp_path):
    page = ROOT / "docs" / "pipeline.md"
    assert "no-such-heading" not in anchors(page)
    assert slug("What \"up to date\" means here") == "what-up-to-date-means-here"
    assert slug("Experiments: dvclive, `dvc exp`, `dvc plots`") == "experiments-dvclive-dvc-exp-dvc-plots"
    bad = tmp_path / "bad.md"
    bad.write_text("[a](no-such.md) [b](#no-such-heading) `[c](ignored.md)`\n# Here\n[d](#here)\n")
    assert [b.split(":")[0] for b in broken_links(bad)] == ["no-such.md", "#no-such-heading"]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="asks git what it ignores")
def test_quick_start_commits_what_a_run_leaves_untracked():
    """The README's `git add` after the first `make repro` names every path a run leaves for git: dvc.lock, each
    `cache: false` output, and the .gitignore DVC writes beside a cached output that git does not ignore already
    (checked against a fresh clone's `git status` once: dvc.lock live metrics predictions reports)."""
    untracked = {"dvc.lock"}
    for stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values():
        stage = stage.get("do", stage)
        for entry in [*stage.get("outs", []), *stage.get("metrics", []), *stage.get("plots", [])]:
            path, options = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
            path = re.sub(r"\$\{[^}]+\}", "x", path)
            if subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=ROOT, capture_output=True).returncode \
                    == 0:
                continue  # committed with the code (fingerprints/): a run changes it only where the code did
            ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0
            if options.get("cache", True) is False or not ignored:  # not ignored and cached: DVC adds a .gitignore
                untracked.add(path.split("/")[0])
    readme = (ROOT / "README.md").read_text()
    quick_start = readme[readme.index("## Quick start"):readme.index("\n## ", readme.index("## Quick start") + 1)]
    adds = [shlex.split(line) for _, line in fenced_lines(quick_start) if line.startswith("git add ")]
    assert len(adds) == 1 and set(adds[0][2:]) == untracked, (adds, untracked)


def test_the_fingerprint_example_is_what_the_stage_writes():
    """docs/code-deps.md's excerpt of a fingerprint file: its stage, its form, and files the real file covers."""
    import json

    text = (ROOT / "docs" / "code-deps.md").read_text()
    block = text[text.index("```json\n") + 8:]
    block = block[:block.index("```")]
    stage = re.search(r'"stage": "(\w+)"', block).group(1)
    real = json.loads((ROOT / "fingerprints" / f"{stage}.json").read_text())
    assert real["stage"] == stage and real["fingerprint"].startswith("ast-v1:")
    files = re.findall(r'"((?:src|stages)/[\w/]+\.py)": "ast-v1:', block)
    assert len(files) >= 3 and set(files) <= set(real["files"]), set(files) - set(real["files"])
    assert all(v.startswith("ast-v1:") for v in real["files"].values())
