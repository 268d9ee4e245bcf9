"""dvc.yaml's code deps are each stage's fingerprint file, which covers exactly what the stage imports, and
``distillpipe dvc-deps`` / ``distillpipe fingerprint`` write them.

A stage whose fingerprint misses a project file it imports is not re-run when that file changes (a stale output
that looks fresh); one that covers a file it does not import re-runs for nothing (an edit to one student
architecture re-running every student). The import closure is read from the source
(distillpipe.identity.import_closure), checked here against Python's own import system; a stage that builds
students depends on the shared student code and on its item's own architecture only
(``fingerprints/students/${item.model.student}.json``), checked against DVC's own templating and ``dvc status``."""

import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from distillpipe.cli import app
from distillpipe.commands.dvc_deps import DepsError, generate
from distillpipe.config.students import ARCHITECTURES
from distillpipe.fingerprints import FOLDER, CodeLayoutError, documents, stage_scripts, stale
from distillpipe.identity import fingerprint_file, import_closure, python_fingerprint

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = re.compile(r"\bpython3?\s+(?:-m\s+(stages\.\w+)|(stages/\w+\.py))")
ARCH = re.compile(r"\$\{item(?:\.\w+)+\}")
_DOCUMENTS: dict = {}


def stage_templates() -> dict[str, dict]:
    """Each stage (a foreach group counts once) as written in dvc.yaml, before templating; not the fingerprint
    stage, which depends on the source itself."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: s.get("do", s) for name, s in stages.items() if name != "fingerprint"}


def stage_script(stage: dict) -> Path:
    m = SCRIPT.search(stage["cmd"])
    assert m, f"cannot find the stage script in {stage['cmd']!r}"
    return ROOT / (m.group(2) or m.group(1).replace(".", "/") + ".py")


def architecture_dep(stage: dict) -> str | None:
    """The stage's one interpolated code dep (its item's architecture), if it has one."""
    found = [d for d in stage.get("deps", []) if d.startswith("fingerprints/") and ARCH.search(d)]
    assert len(found) <= 1, found
    return found[0] if found else None


def code_deps(stage: dict, architecture: str | None = None) -> set[str]:
    """The source files the stage's deps stand for, for an item of ``architecture``: the files its fingerprint
    files cover, as ``distillpipe fingerprint`` writes them for the working tree now. A dep on the source itself
    counts as such too (none should be left)."""
    if "docs" not in _DOCUMENTS:
        _DOCUMENTS["docs"] = documents(ROOT)
    out: set[str] = set()
    for d in stage.get("deps", []):
        if not d.startswith(("fingerprints/", "src/", "stages")):
            continue  # data
        if ARCH.search(d):
            assert architecture is not None, f"{d}: which architecture?"
            d = ARCH.sub(architecture, d)
        if d.startswith("fingerprints/"):
            out.update(json.loads(_DOCUMENTS["docs"][d])["files"])
        elif d.startswith(("src/", "stages/")):
            p = ROOT / d
            files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
            out.update(f.relative_to(ROOT).as_posix() for f in files if "__pycache__" not in f.parts)
    return out


def _rel(paths) -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in paths}


def imported(script: Path, architecture: str | None = None) -> set[str]:
    """What an item of the stage imports: its script's closure, and its architecture's module's."""
    pkg = ROOT / "src" / "distillpipe"
    files = _rel(import_closure(scripts=[script], package_dir=pkg))
    if architecture is not None:
        files |= _rel(import_closure([f"distillpipe.students.{architecture}"], package_dir=pkg))
    return files


def test_dvc_yaml_is_what_the_generator_writes():
    text, drift = generate(ROOT / "dvc.yaml")
    assert not drift, f"run `distillpipe dvc-deps` (make deps): {drift}"
    assert text == (ROOT / "dvc.yaml").read_text()


def test_the_committed_fingerprints_are_the_codes():
    """fingerprints/ is git-tracked: what a commit holds there is what its code means (`make deps` writes it; a
    `dvc repro` would too)."""
    assert stale(ROOT, ROOT / "fingerprints") == [], "run `distillpipe fingerprint` (make deps)"


def test_only_the_fingerprint_stage_depends_on_the_source():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert stages["fingerprint"]["deps"] == ["stages", "src/distillpipe"]
    assert stages["fingerprint"]["outs"] == [{"fingerprints": {"cache": False, "persist": True}}]
    for name, stage in stage_templates().items():
        source = [d for d in stage["deps"] if d.startswith(("src/", "stages"))]
        assert not source, f"{name} depends on source files {source}: DVC would re-run it for a comment"


def test_every_stage_item_depends_on_exactly_the_project_files_it_imports():
    """Independent of the generator: each stage, and for a stage that builds students each architecture its item
    may name, against the closure computed directly (script + that architecture's module)."""
    problems = []
    for name, stage in stage_templates().items():
        script = stage_script(stage)
        rel = script.relative_to(ROOT).as_posix()
        for arch in ARCHITECTURES if architecture_dep(stage) else [None]:
            have, need = code_deps(stage, arch), imported(script, arch) | {rel}
            who = f"{name} ({arch})" if arch else name
            problems += [f"{who}: imports {f} but does not depend on it" for f in sorted(need - have)]
            problems += [f"{who}: depends on {f} but does not import it" for f in sorted(have - need)]
    assert not problems, "dvc.yaml deps differ from the imports:\n" + "\n".join(problems)


def test_stages_that_build_students_name_their_architecture_and_no_other():
    """The students registry is in the closure of the six stages that train or load students, none of which holds
    an architecture's module but through its item; every other stage holds none at all."""
    builders = {n for n, s in stage_templates().items() if architecture_dep(s)}
    assert builders == {"train", "train_aug", "train_lm", "finetune", "evaluate", "speed"}
    for name, stage in stage_templates().items():
        shared = {**stage, "deps": [d for d in stage["deps"] if not ARCH.search(d)]}
        held = {a for a in ARCHITECTURES if f"src/distillpipe/students/{a}.py" in code_deps(shared)}
        assert not held, f"{name} depends on {held} whatever its item"


_FORKED_IMPORTS = """
import ast, importlib, json, os, sys
for lib in ("numpy", "torch", "transformers", "datasets", "pyarrow", "zarr", "typer", "yaml", "sklearn", "scipy",
            "dask.distributed", "dvclive", "numcodecs", "tqdm", "tokenizers", "gensim"):
    try:  # third-party libraries first, once: each child below then imports only the project's modules
        importlib.import_module(lib)
    except ImportError:
        pass
assert not [n for n in sys.modules if n.split(".")[0] == "distillpipe"]
found = {}
for name, script in json.loads(sys.argv[1]).items():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a fresh child per stage: the project modules its script's imports load, and nothing before
        os.close(read)
        for node in ast.parse(open(script).read()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                exec(compile(ast.Module([node], []), "stage", "exec"))
        files = sorted(m.__file__ for n, m in sys.modules.items()
                       if n.split(".")[0] == "distillpipe" and getattr(m, "__file__", None))
        os.write(write, json.dumps(files).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0, name
    found[name] = json.loads(b"".join(chunks))
print(json.dumps(found))
"""


def test_the_static_closure_holds_every_module_python_really_imports():
    """Independent reference: import each stage script's modules in a fresh interpreter (a child forked from one
    that has loaded the third-party libraries and no project module) and list the project modules in sys.modules.
    The static closure may hold more (function-local imports that did not run), never less; and no architecture is
    imported until a student is built."""
    scripts = {name: str(stage_script(stage)) for name, stage in stage_templates().items()}
    res = subprocess.run([sys.executable, "-c", _FORKED_IMPORTS, json.dumps(scripts)], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    loaded = json.loads(res.stdout.splitlines()[-1])
    assert set(loaded) == set(scripts)
    arch_files = {f"src/distillpipe/students/{a}.py" for a in ARCHITECTURES}
    for name, files in loaded.items():
        got = {Path(f).resolve().relative_to(ROOT).as_posix() for f in files}
        assert "src/distillpipe/__init__.py" in got, name  # the child really imported the stage
        missing = got - imported(Path(scripts[name]))
        assert not missing, f"{name}: Python imports {sorted(missing)}, the static closure misses them"
        assert not got & arch_files, f"{name}: importing the stage loads {sorted(got & arch_files)}"
    # building a student loads its architecture and no other (one interpreter: what each build adds to sys.modules)
    code = ("import json, sys\nfrom distillpipe.students import student_class\nnew = {}\n"
            f"for arch in {list(ARCHITECTURES)!r}:\n"
            "    before = set(sys.modules)\n"
            "    student_class(arch)\n"
            "    new[arch] = sorted(sys.modules[n].__file__ for n in set(sys.modules) - before\n"
            "                       if n.split('.')[0] == 'distillpipe')\n"
            "print(json.dumps(new))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    for arch, files in json.loads(res.stdout.splitlines()[-1]).items():
        got = {Path(f).resolve().relative_to(ROOT).as_posix() for f in files}
        assert got & arch_files == {f"src/distillpipe/students/{arch}.py"}, (arch, sorted(got & arch_files))
        missing = got - _rel(import_closure([f"distillpipe.students.{arch}"], package_dir=ROOT / "src" / "distillpipe"))
        assert not missing, f"{arch}: Python imports {sorted(missing)}, the static closure misses them"




def test_only_the_students_registry_imports_project_modules_by_name():
    """import_closure cannot see ``importlib.import_module(<computed name>)``: the one place that imports a project
    module so is the registry, whose architectures dvc.yaml names through each item (checked above); the other
    import by name loads an embedded model's package, never a project module."""
    from distillpipe.assets import EMBEDDED_MODELS

    users = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "src").rglob("*.py")
                   if re.search(r"\bimport_module\(|__import__\(", p.read_text()))
    assert users == ["src/distillpipe/assets.py", "src/distillpipe/students/__init__.py"], users
    assert not [m for m, _ in EMBEDDED_MODELS.values() if m.split(".")[0] == "distillpipe"]


def test_registry_keys_are_the_architecture_modules():
    from distillpipe.students import STUDENTS

    assert tuple(STUDENTS) == ARCHITECTURES
    for key in STUDENTS:
        assert (ROOT / "src" / "distillpipe" / "students" / f"{key}.py").is_file(), key


# -- the generator on copies of this repository ---------------------------------------------------------------


@pytest.fixture
def copy(tmp_path) -> Path:
    """dvc.yaml, stages/ and src/ of this working tree, where the generator and the fingerprint command read
    them."""
    for rel in ("stages", "src"):
        shutil.copytree(ROOT / rel, tmp_path / rel, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path} no longer holds {old!r} once: update this test"
    path.write_text(text.replace(old, new))


def test_generator_rewrites_drifted_deps_and_keeps_everything_else(copy):
    """A fingerprint dep dropped, a source file added, an architecture line in its form before fingerprints: the
    generator restores the very bytes of dvc.yaml (comments, data deps, params, outs untouched), and ``--check``
    names each drift and exits 1."""
    original = (copy / "dvc.yaml").read_text()
    _edit(copy / "dvc.yaml", "\n      - fingerprints/report.json\n", "\n")  # report
    _edit(copy / "dvc.yaml", "\n        - fingerprints/teacher_import.json\n",
          "\n        - fingerprints/teacher_import.json\n        - src/distillpipe/losses.py\n")
    _edit(copy / "dvc.yaml", "- fingerprints/train.json\n        - fingerprints/students/${item.model.student}.json\n",
          "- fingerprints/train.json\n        - src/distillpipe/students/${item.model.student}.py\n")
    res = CliRunner().invoke(app, ["dvc-deps", "--check", "--dvc-yaml", str(copy / "dvc.yaml")])
    assert res.exit_code == 1, res.output
    assert "report:\n  + fingerprints/report.json" in res.output, res.output
    assert "teacher_import:\n  - src/distillpipe/losses.py" in res.output, res.output
    assert "train:\n  - src/distillpipe/students/${item.model.student}.py\n  + fingerprints/students/" in res.output
    res = CliRunner().invoke(app, ["dvc-deps", "--dvc-yaml", str(copy / "dvc.yaml")])
    assert res.exit_code == 0, res.output
    assert (copy / "dvc.yaml").read_text() == original
    res = CliRunner().invoke(app, ["dvc-deps", "--check", "--dvc-yaml", str(copy / "dvc.yaml")])
    assert res.exit_code == 0, res.output


def test_a_dvc_yaml_of_source_deps_gets_the_fingerprint_stage(copy):
    """A pipeline from before fingerprints (every stage on its source files, no fingerprint stage): the generator
    adds the stage first and turns every stage's source deps into its fingerprint file; DVC reads the result."""
    from dvc.repo import Repo

    doc = yaml.safe_load((copy / "dvc.yaml").read_text())
    del doc["stages"]["fingerprint"]
    body = doc["stages"]["train"]["do"]
    body["deps"] = [d for d in body["deps"] if not d.startswith("fingerprints/")] + [
        "stages/train.py", "src/distillpipe/losses.py", "src/distillpipe/students/${item.model.student}.py"]
    (copy / "dvc.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    text, drift = generate(copy / "dvc.yaml")
    assert drift["fingerprint"] == ([], ["stages", "src/distillpipe"])
    assert drift["train"] == (["stages/train.py", "src/distillpipe/losses.py",
                               "src/distillpipe/students/${item.model.student}.py"],
                              ["fingerprints/train.json", "fingerprints/students/${item.model.student}.json"])
    new = yaml.safe_load(text)["stages"]
    assert list(new)[0] == "fingerprint"
    assert new["fingerprint"]["outs"] == [{"fingerprints": {"cache": False, "persist": True}}]
    (copy / "dvc.yaml").write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=copy, check=True)
    shutil.copy(ROOT / "params.yaml", copy / "params.yaml")
    with Repo(str(copy)) as repo:
        train = next(s for s in repo.index.stages if s.name == "train@hybrid")
        fp = next(s for s in repo.index.stages if s.name == "fingerprint")
        assert [str(d.def_path) for d in train.deps if str(d.def_path).startswith("fingerprints/")] == [
            "fingerprints/train.json", "fingerprints/students/cmow_hybrid.json"]
        import networkx as nx

        assert nx.has_path(repo.index.graph, train, fp)  # DVC's DAG: train comes after fingerprint


def test_a_module_changes_exactly_the_fingerprints_of_the_stages_that_import_it(copy):
    """A module no stage imports changes no fingerprint file; the same module imported by the data sources changes
    the files of exactly the scripts whose closure holds the sources (prepare: augment writes a prepared dataset
    through data/features.py, not the sources), and a comment in it then changes none."""
    before = documents(copy)
    (copy / "src/distillpipe/data/sources/scratch.py").write_text("X = 1\n")
    assert documents(copy) == before
    _edit(copy / "src/distillpipe/data/sources/__init__.py", "from __future__ import annotations\n",
          "from __future__ import annotations\n\nfrom distillpipe.data.sources import scratch  # noqa: F401\n")
    after = documents(copy)
    changed = sorted(k for k in before if before[k] != after[k])
    holders = sorted(f"fingerprints/{Path(s).stem}.json" for s in (copy / "stages").glob("*.py")
                     if "src/distillpipe/data/sources/__init__.py" in
                     {p.relative_to(copy).as_posix() for p in import_closure(
                         scripts=[s], package_dir=copy / "src" / "distillpipe")})
    assert changed == holders == ["fingerprints/prepare.json"]
    assert all("src/distillpipe/data/sources/scratch.py" in json.loads(after[k])["files"] for k in changed)
    (copy / "src/distillpipe/data/sources/scratch.py").write_text('"""Scratch."""\n\n# one\nX = (1)  # two\n')
    assert documents(copy) == after


def test_fingerprints_refuse_an_architecture_spread_over_two_files(copy):
    """An item can name one file of its architecture: a helper only WaLDORf imports would be code no stage item
    could name, so the fingerprint stage says to keep it in waldorf.py."""
    (copy / "src/distillpipe/students/waldorf_util.py").write_text("X = 1\n")
    _edit(copy / "src/distillpipe/students/waldorf.py", "import math\n",
          "import math\n\nfrom distillpipe.students import waldorf_util  # noqa: F401\n")
    with pytest.raises(CodeLayoutError,
                       match=r"'waldorf' imports \['src/distillpipe/students/waldorf_util.py'\] besides"):
        documents(copy)


def test_generator_asks_for_the_architecture_line_where_it_belongs(copy):
    dvc = copy / "dvc.yaml"
    text = dvc.read_text()
    dvc.write_text(text.replace("        - fingerprints/students/${item.student}.json\n", ""))
    with pytest.raises(DepsError, match=r"stage finetune imports the students registry .* add `- fingerprints/"
                                        r"students/\$\{item.<key>\}.json`"):
        generate(dvc)
    line = "        - fingerprints/tokenize.json\n"
    dvc.write_text(text.replace(line, line + "        - fingerprints/students/${item.student}.json\n"))
    with pytest.raises(DepsError, match="stage tokenize depends on .* but it does not import the students registry"):
        generate(dvc)


def test_the_fingerprint_command_writes_and_checks(copy):
    out = copy / "fingerprints"
    res = CliRunner().invoke(app, ["fingerprint", "--root", str(copy), "--out", str(out), "--check"])
    assert res.exit_code == 1 and "out of date" in res.output, res.output
    res = CliRunner().invoke(app, ["fingerprint", "--root", str(copy), "--out", str(out)])
    assert res.exit_code == 0 and ": changed fingerprints/" in res.output and "fingerprints/train.json" in res.output
    assert {p.relative_to(copy).as_posix(): p.read_text() for p in out.rglob("*.json")} == documents(copy)
    res = CliRunner().invoke(app, ["fingerprint", "--root", str(copy), "--out", str(out)])
    assert res.exit_code == 0 and "no stage's code changed meaning" in res.output, res.output
    (out / "gone.json").write_text("{}")  # a script that no longer exists
    res = CliRunner().invoke(app, ["fingerprint", "--root", str(copy), "--out", str(out)])
    assert "removed fingerprints/gone.json" in res.output and not (out / "gone.json").exists(), res.output


# -- which stage groups each shared module reaches: the reviewed table of docs/code-deps.md ----------------------

CODE_DEPS = ROOT / "docs" / "code-deps.md"
REACH = "## Which stages a shared module reaches"
DOCSTRING_ONLY = python_fingerprint('""""""')
POOLING_STAGES = {"teacher_cache", "train", "train_aug", "train_lm", "finetune"}


def _tables(text: str) -> list[list[list[str]]]:
    """The markdown tables of the section ``REACH`` of ``text``: each a list of rows of cells, without the header
    and its rule."""
    assert REACH in text, f"docs/code-deps.md has no section {REACH!r}"
    tables, rows = [], []
    for line in [*text.split(REACH, 1)[1].split("\n## ", 1)[0].splitlines(), ""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            tables.append(rows[2:])
            rows = []
    return tables


def reach_table(text: str) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """(each group: its stage scripts, each module: the groups its row lists), from the section's last two tables.
    A row may name several modules (each in backticks); modules are relative to ``src/distillpipe/``."""
    *_, group_rows, module_rows = _tables(text)
    groups = {row[0]: re.findall(r"`(\w+)`", row[1]) for row in group_rows}
    modules: dict[str, set[str]] = {}
    for row in module_rows:
        for m in re.findall(r"`([\w/]+\.py)`", row[0]):
            assert f"src/distillpipe/{m}" not in modules, f"docs/code-deps.md: {m} has two rows"
            modules[f"src/distillpipe/{m}"] = {g.strip() for g in row[1].split(",")}
    return groups, modules


def reach(root: Path, groups: dict[str, list[str]]) -> dict[str, set[str]]:
    """Each file the stages' fingerprint files hold (as ``distillpipe fingerprint`` writes them for ``root``): the
    groups of the stages that hold it. An architecture's own file is its items' alone (the section above)."""
    group_of = {s: g for g, scripts in groups.items() for s in scripts}
    out: dict[str, set[str]] = defaultdict(set)
    for rel, text in documents(root).items():
        if not rel.startswith(f"{FOLDER}/students/"):
            doc = json.loads(text)
            for f in doc["files"]:
                out[f].add(group_of[doc["stage"]])
    return out


def reach_problems(root: Path, text: str) -> list[str]:
    """Where the table in ``text`` differs from what the fingerprints of the code under ``root`` hold, each with
    what to do."""
    groups, table = reach_table(text)
    scripts = sorted(Path(s).stem for s in stage_scripts(root))
    listed = sorted(s for members in groups.values() for s in members)
    if listed != scripts:
        return [f"the groups hold the stage scripts {listed}, stages/ has {scripts}: give each script one group"]
    got = reach(root, groups)
    shared = {f: g for f, g in got.items() if f.startswith("src/") and len(g) > 1
              and not (f.endswith("/__init__.py") and fingerprint_file(root / f) == DOCSTRING_ONLY)}

    def row(f: str) -> str:
        return f"| `{f.removeprefix('src/distillpipe/')}` | {', '.join(g for g in groups if g in shared[f])} | <why> |"

    problems = []
    for f in sorted(shared):
        if f not in table:
            problems.append(f"{f} reaches {sorted(shared[f])} and has no row: review that, then add {row(f)}")
        elif table[f] != shared[f]:
            wider = sorted(shared[f] - table[f])
            what = f"now reaches {wider} too" if wider else f"reaches only {sorted(shared[f])}"
            problems.append(f"{f} {what} (its row: {sorted(table[f])}): review that, then write {row(f)}, or "
                            "move what those stages call out of it")
    for f in sorted(set(table) - set(shared)):
        problems.append(f"{f} has a row but reaches {sorted(got.get(f, set()))}: remove the row")
    return problems


def test_the_table_of_what_each_shared_module_reaches_is_what_the_fingerprints_hold():
    """docs/code-deps.md's reviewed table lists exactly the groups each shared module reaches, computed here from the
    fingerprint files; a commit that widens a stage's closure must change the table."""
    problems = reach_problems(ROOT, CODE_DEPS.read_text())
    assert not problems, "docs/code-deps.md, " + REACH.lstrip("# ") + ":\n" + "\n".join(problems)


def test_the_table_check_catches_a_widened_closure_a_missing_row_and_a_stale_one(copy):
    """The check above can fail: the code that made a pooling edit re-run the teacher fine-tunings (data/batching.py
    importing pooling.py) is refused, naming the new groups and the row to write; so are a shared module without a
    row and a row for a module that reaches one group; a stage script in no group too."""
    text = CODE_DEPS.read_text()
    assert reach_problems(copy, text) == []
    batching = copy / "src/distillpipe/data/batching.py"
    source = batching.read_text()
    batching.write_text(source + "\nfrom distillpipe.pooling import n_groups  # noqa: E402, F401\n")
    problems = reach_problems(copy, text)
    assert len(problems) == 1, problems
    assert problems[0].startswith("src/distillpipe/pooling.py now reaches ['evaluation', 'qg', 'teacher'] too")
    assert "| `pooling.py` | teacher, teacher_cache, qg, students, evaluation | <why> |" in problems[0]
    batching.write_text(source)
    row = next(line for line in text.splitlines() if line.startswith("| `data/subset.py` |"))
    assert reach_problems(copy, text.replace(row + "\n", "")) == [
        "src/distillpipe/data/subset.py reaches ['data', 'students', 'teacher_cache'] and has no row: review that, "
        "then add | `data/subset.py` | data, teacher_cache, students | <why> |"]
    stale_row = "| `qg/model.py` | qg | the generator |\n"
    assert reach_problems(copy, text.replace(row + "\n", row + "\n" + stale_row)) == [
        "src/distillpipe/qg/model.py has a row but reaches ['qg']: remove the row"]
    assert "give each script one group" in reach_problems(copy, text.replace(", `word_vectors` |", " |"))[0]


def test_a_behavioural_edit_in_pooling_reaches_only_the_stages_that_pool(copy):
    """docs/code-deps.md's example, found by meaning (the first value the capture's average pooling returns,
    doubled): the fingerprints of exactly the teacher cache and the student trainings change, and by DVC's own
    resolution of this dvc.yaml no teacher_finetune, qg_finetune, augment or evaluate item depends on one of them."""
    from _edits import edit_function, scale_first_returned
    from dvc.repo import Repo

    import distillpipe.teacher.capture as capture

    before = documents(copy)
    rel = edit_function(copy, capture.avg_pool_seq, scale_first_returned("2"))
    assert rel == "src/distillpipe/pooling.py"
    after = documents(copy)
    changed = {k for k in before if after[k] != before[k]}
    assert {json.loads(before[k])["stage"] for k in changed} == POOLING_STAGES
    with Repo(str(ROOT)) as repo:
        reached = {s.addressing for s in repo.index.stages if {str(d.def_path) for d in s.deps} & changed}
    assert {a.split("@")[0] for a in reached} == POOLING_STAGES, sorted(reached)


# -- in a real DVC repository ----------------------------------------------------------------------------------


def _architectures_of_runs(params: dict) -> dict[str, str]:
    """Each run's architecture, read the long way (a trained run's model; a fine-tuned one's init), not from the
    ``student`` keys the stages interpolate: so a wrong key in params.yaml fails here too."""
    arch = {k: r["model"]["student"] for sec in ("train", "train_aug", "train_lm")
            for k, r in params[sec]["runs"].items()}
    arch |= {k: arch[r["init"]] for k, r in params["finetune"]["runs"].items()}
    return arch


def test_dvc_resolves_each_student_stage_to_its_own_architecture():
    """DVC's own templating (``dvc.repo.Repo(...).index``) on this repository: each stage item of the six student
    stages depends on the file of its run's architecture (found the long way, not from the interpolated key) and
    on no other architecture's."""
    from dvc.repo import Repo

    arch = _architectures_of_runs(yaml.safe_load((ROOT / "params.yaml").read_text()))
    files = {f"fingerprints/students/{a}.json": a for a in ARCHITECTURES}
    seen = set()
    with Repo(str(ROOT)) as repo:
        for stage in repo.index.stages:
            group, _, item = stage.addressing.partition("@")
            held = {files[str(d.def_path)] for d in stage.deps if str(d.def_path) in files}
            if group in ("train", "train_aug", "train_lm", "finetune", "evaluate", "speed"):
                assert held == {arch[item]}, (stage.addressing, held)
                seen.add(arch[item])
            else:
                assert not held, (stage.addressing, held)
    assert seen == set(ARCHITECTURES)


@pytest.mark.slow  # ~3 min of `dvc commit`, `dvc repro fingerprint` and `dvc status` over the whole pipeline; fast,
# the same property: test_dvc_resolves_each_student_stage_to_its_own_architecture (DVC's resolver),
# test_every_stage_item_depends_on_exactly_the_project_files_it_imports and tests/test_dvc_trust.py
@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for DVC repositories")
def test_an_edit_to_one_architecture_makes_dvc_status_list_only_its_stages(tmp_path):
    """This working tree's pipeline, with every stage recorded in dvc.lock as run (``dvc commit`` over stand-ins for
    the data and the outputs: which stages DVC calls stale depends on the deps' hashes only). A comment added to
    one architecture's file makes ``dvc status`` list the fingerprint stage only, and once it has run, nothing. An
    edit that changes behaviour lists exactly the stages of that architecture's runs (train, train_aug, train_lm,
    finetune, evaluate, speed) once the fingerprint stage has run; one to the shared students/heads.py, all of
    theirs."""
    from _dvc import DVC, sh, working_tree_repo
    from dvc.repo import Repo

    repo = working_tree_repo(tmp_path / "repo")
    sh(repo, DVC, "repro", "-s", "fingerprint", repo=repo)
    with Repo(str(repo)) as r:
        paths = {str(x.def_path) for s in r.index.stages for x in (*s.deps, *s.outs)}
    for rel in sorted(paths, key=lambda p: -p.count("/")):  # deepest first: a folder dep holds others' outputs
        if not rel.startswith(("src/", "stages", "fingerprints")) and not (repo / rel).exists():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_text(f"stand-in for {rel}\n")
    sh(repo, DVC, "commit", "-f", "-q")

    def stale() -> set[str]:
        return set(json.loads(sh(repo, DVC, "status", "--json").stdout or "{}"))

    assert stale() == set()
    params = yaml.safe_load((repo / "params.yaml").read_text())
    arch = _architectures_of_runs(params)
    sections = ("train", "train_aug", "train_lm", "finetune", "evaluate", "speed")
    runs_of = {a: {f"{sec}@{k}" for sec in sections for k in params[sec]["runs"] if arch[k] == a}
               for a in ARCHITECTURES}
    for target, expected in [*((f"{a}.py", runs_of[a]) for a in ARCHITECTURES),
                             ("heads.py", set().union(*runs_of.values()))]:
        assert expected, target
        path = repo / "src" / "distillpipe" / "students" / target
        source = path.read_text()
        path.write_text(source + "# an edit that changes no behaviour\n")
        assert stale() == {"fingerprint"}, target
        sh(repo, DVC, "repro", "-s", "fingerprint", repo=repo)
        assert stale() == set(), target
        path.write_text(source + "_AN_EDIT_THAT_DOES = 1\n")
        sh(repo, DVC, "repro", "-s", "fingerprint", repo=repo)
        assert stale() == expected, target
        path.write_text(source)
        sh(repo, DVC, "repro", "-s", "fingerprint", repo=repo)
    assert stale() == set()
