"""dvc.yaml's code deps are exactly what each stage imports.

A stage that imports a project file it does not depend on is not re-run when that file changes (a stale
output that looks fresh); a stage that depends on a file it does not import re-runs for nothing (an edit
to a config section re-running the teacher fine-tunings). The import closure is read from the source
(distillpipe.identity.import_closure), checked here against Python's own import system."""

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from distillpipe.identity import import_closure

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = re.compile(r"\bpython3?\s+(?:-m\s+(stages\.\w+)|(stages/\w+\.py))")


def stage_templates() -> dict[str, dict]:
    """Each stage (a foreach group counts once) as written in dvc.yaml, before templating."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: s.get("do", s) for name, s in stages.items()}


def stage_script(stage: dict) -> Path:
    m = SCRIPT.search(stage["cmd"])
    assert m, f"cannot find the stage script in {stage['cmd']!r}"
    return ROOT / (m.group(2) or m.group(1).replace(".", "/") + ".py")


def code_deps(stage: dict) -> set[str]:
    """The stage's deps under src/, directories expanded to the Python files in them."""
    out: set[str] = set()
    for d in stage.get("deps", []):
        if not d.startswith("src/"):
            continue
        p = ROOT / d
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        out.update(f.relative_to(ROOT).as_posix() for f in files if "__pycache__" not in f.parts)
    return out


def imported(script: Path) -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in import_closure(scripts=[script],
                                                                    package_dir=ROOT / "src" / "distillpipe")}


def test_every_stage_depends_on_exactly_the_project_files_it_imports():
    problems = []
    for name, stage in stage_templates().items():
        script = stage_script(stage)
        rel = script.relative_to(ROOT).as_posix()
        if rel not in stage.get("deps", []):
            problems.append(f"{name}: runs {rel} but does not depend on it")
        have, need = code_deps(stage), imported(script)
        problems += [f"{name}: imports {f} but does not depend on it" for f in sorted(need - have)]
        problems += [f"{name}: depends on {f} but does not import it" for f in sorted(have - need)]
    assert not problems, "dvc.yaml deps differ from the imports:\n" + "\n".join(problems)


def test_the_static_closure_holds_every_module_python_really_imports():
    """Independent reference: import each stage script's modules in a fresh interpreter and list the
    project modules in sys.modules. The static closure may hold more (function-local imports that did
    not run), never less."""
    for name, stage in stage_templates().items():
        script = stage_script(stage)
        code = (
            "import ast, json, sys\n"
            f"tree = ast.parse(open({str(script)!r}).read())\n"
            "for node in tree.body:\n"
            "    if isinstance(node, (ast.Import, ast.ImportFrom)):\n"
            "        exec(compile(ast.Module([node], []), 'stage', 'exec'))\n"
            "print(json.dumps(sorted(m.__file__ for n, m in sys.modules.items()\n"
            "      if n.split('.')[0] == 'distillpipe' and getattr(m, '__file__', None))))\n"
        )
        res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        loaded = {Path(f).resolve().relative_to(ROOT).as_posix() for f in json.loads(res.stdout)}
        missing = loaded - imported(script)
        assert not missing, f"{name}: Python imports {sorted(missing)}, the static closure misses them"
