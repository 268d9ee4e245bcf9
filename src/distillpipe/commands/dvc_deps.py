"""``distillpipe dvc-deps``: write every ``dvc.yaml`` stage's code deps from its import closure.

A stage's code deps are the stage script and exactly the project files it imports (its import closure,
:func:`distillpipe.identity.import_closure`): a file it imports but does not depend on would leave a stale output
looking fresh, a file it depends on but does not import re-runs it for nothing. This command writes them, so no
one keeps them by hand; ``--check`` writes nothing and exits 1 naming each stage whose deps differ.

What it writes, per stage (a ``foreach`` group once, for all its items):

* the script ``stages/<stage>.py`` and the closure's files, sorted; a folder instead of its files where the stage
  imports every file in it, subfolders included (``src/distillpipe/config``), never where one file there is not
  imported: DVC hashes every file of a folder dep;
* for a stage that builds or loads students through the registry (``students/__init__.py`` is in its closure),
  which imports an architecture only by name: what every architecture imports beyond the stage's closure
  (``students/base.py``, ``students/heads.py``...), and ONE line naming the item's own architecture, such as
  ``src/distillpipe/students/${item.model.student}.py``. That line is the one code dep written by hand (it says
  which key of the stage's params items names the architecture); this command keeps it, and refuses a stage that
  lacks it or one whose architectures import more than their own file beyond what they share (then that file
  would be a dep no interpolation can name: keep an architecture in one module).

Everything else in ``dvc.yaml`` (comments, order, data deps, params, outs) is kept byte for byte: the file is
edited with ruamel.yaml's round-trip mode, which reproduces it exactly (tested). Data deps stay first, the code
deps follow them.
"""

from __future__ import annotations

import functools
import io
import re
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import user_errors
from distillpipe.config.students import ARCHITECTURES
from distillpipe.errors import UserError
from distillpipe.identity import PACKAGE, STUDENT_MODULES, import_closure

SCRIPT = re.compile(r"\bpython3?\s+(?:-m\s+(stages\.\w+)|(stages/\w+\.py))")
"""The stage script in a stage's ``cmd``: ``python -m stages.<name>`` or ``python stages/<name>.py``."""
SRC = f"src/{PACKAGE}"
REGISTRY = f"{SRC}/students/__init__.py"
ARCHITECTURE_DEP = re.compile(rf"^{SRC}/students/\$\{{item(\.\w+)+\}}\.py$")
"""The hand-written line naming a stage item's architecture, e.g. ``src/distillpipe/students/${item.student}.py``."""
IGNORED = ("__pycache__",)
"""Folder names DVC does not hash in a folder dep (``.dvcignore``: ``__pycache__/`` and ``*.pyc``)."""


DVC_YAML = Path("dvc.yaml")
CHECK_HELP = "write nothing; exit 1 naming each stage whose code deps differ from its imports"


class DepsError(UserError):
    """dvc.yaml cannot be given generated deps as it stands (what and how to fix it is in the message)."""


def _yaml():
    """ruamel.yaml round-trip set to reproduce ``dvc.yaml`` exactly (its list indentation, no re-wrapping)."""
    from ruamel.yaml import YAML

    y = YAML()
    y.indent(mapping=2, sequence=4, offset=2)
    y.width = 4096
    y.preserve_quotes = True
    return y


def stage_script(cmd: str, stage: str) -> str:
    """The script a stage runs (``stages/<name>.py``), from its ``cmd``."""
    m = SCRIPT.search(cmd)
    if not m:
        raise DepsError(f"dvc.yaml: stage {stage}: cannot find `python -m stages.<name>` in its cmd {cmd!r}")
    return m.group(2) or m.group(1).replace(".", "/") + ".py"


def is_code_dep(dep: str) -> bool:
    """Whether this command writes the dep (the stage script and the package's files), or it is the stage's own
    (data, models, a user's folder)."""
    return dep.startswith((f"{SRC}/", "stages/"))


@dataclass(frozen=True)
class Closures:
    """Import closures of the package under ``root``, as repository-relative paths."""

    root: Path

    @property
    def package_dir(self) -> Path:
        return self.root / SRC

    def _rel(self, paths) -> set[str]:
        return {p.relative_to(self.root).as_posix() for p in paths}

    def of_script(self, script: str) -> set[str]:
        return self._rel(import_closure(scripts=[self.root / script], package_dir=self.package_dir))

    @functools.cache  # noqa: B019 (one Closures per run of the command: the cache goes with it)
    def of_architecture(self, key: str) -> frozenset[str]:
        return frozenset(self._rel(import_closure([f"{STUDENT_MODULES}.{key}"], package_dir=self.package_dir)))


def code_files(closures: Closures, script: str, architecture_dep: str | None, stage: str) -> set[str]:
    """The project files a stage's item imports, its architecture's file left out (``architecture_dep`` names it):
    the script's closure, plus what every architecture imports beyond it when the stage loads students by name."""
    files = closures.of_script(script)
    if REGISTRY not in files:
        if architecture_dep is not None:
            raise DepsError(f"dvc.yaml: stage {stage} depends on {architecture_dep}, but it does not import the "
                            f"students registry ({REGISTRY}): remove that line")
        return files
    if architecture_dep is None:
        raise DepsError(f"dvc.yaml: stage {stage} imports the students registry ({REGISTRY}), which imports an "
                        f"architecture by name: add `- {SRC}/students/${{item.<key>}}.py` to its deps, <key> being "
                        "the field of its params items that names the architecture (model.student, student)")
    extra = {key: set(closures.of_architecture(key)) - files for key in ARCHITECTURES}
    shared = reduce(set.intersection, extra.values())
    for key, own in extra.items():
        module = f"{SRC}/students/{key}.py"
        beyond = own - shared - {module}
        if module not in own or beyond:
            raise DepsError(f"stage {stage}: architecture {key!r} imports {sorted(beyond)} besides its module, the "
                            "stage's closure and what every architecture imports; a stage's item can name one file "
                            f"of its architecture only: keep {key!r} in {module} (or share the rest)")
    return files | shared


def _files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and p.suffix != ".pyc"
            and not set(IGNORED) & set(p.relative_to(folder).parts)]


def compress(root: Path, files: set[str]) -> list[str]:
    """``files`` with each folder under ``src/`` whose every file is among them written as the folder (the
    outermost such folder), sorted."""
    folders = sorted({p.rsplit("/", i)[0] for p in files if p.startswith(f"{SRC}/")
                      for i in range(1, p.count("/"))}, key=lambda f: (f.count("/"), f))
    chosen: list[str] = []
    for folder in folders:
        if any(folder.startswith(c + "/") for c in chosen):
            continue
        inside = {p.relative_to(root).as_posix() for p in _files_under(root / folder)}
        if inside and inside <= files:
            chosen.append(folder)
    rest = {f for f in files if not any(f.startswith(c + "/") for c in chosen)}
    return sorted(rest | set(chosen))


def stage_deps(closures: Closures, stage: str, body: dict) -> list[str]:
    """The code deps this command writes for one stage (``body``: its definition, a foreach's ``do``)."""
    script = stage_script(body["cmd"], stage)
    arch = [d for d in body.get("deps") or [] if ARCHITECTURE_DEP.match(d)]
    if len(arch) > 1:
        raise DepsError(f"dvc.yaml: stage {stage} names its architecture twice: {arch}")
    bad = [d for d in body.get("deps") or [] if "${" in d and is_code_dep(d) and d not in arch]
    if bad:
        raise DepsError(f"dvc.yaml: stage {stage}: {bad[0]} is not a code dep this command can keep; the one "
                        f"interpolated code dep is `{SRC}/students/${{item.<key>}}.py`")
    files = code_files(closures, script, arch[0] if arch else None, stage)
    return [script] + sorted(compress(closures.root, files) + arch)


def generate(dvc_yaml: Path) -> tuple[str, dict[str, tuple[list[str], list[str]]]]:
    """(the text of ``dvc_yaml`` with every stage's code deps written, {stage: (removed, added)} where they
    differ from the file's)."""
    y = _yaml()
    doc = y.load(dvc_yaml.read_text(encoding="utf-8"))
    closures = Closures(dvc_yaml.resolve().parent)
    drift: dict[str, tuple[list[str], list[str]]] = {}
    for stage, definition in (doc.get("stages") or {}).items():
        body = definition.get("do", definition)
        if "cmd" not in body or not SCRIPT.search(body["cmd"]):
            continue  # not a project stage (a user's own command): its deps are theirs
        deps = body.get("deps")
        if deps is None:
            raise DepsError(f"dvc.yaml: stage {stage} has no deps: add `deps: [{stage_script(body['cmd'], stage)}]`")
        new = stage_deps(closures, stage, body)
        own = [d for d in deps if not is_code_dep(d)]
        if [d for d in deps[: len(own)]] != own:
            raise DepsError(f"dvc.yaml: stage {stage}: list its data deps before its code deps (stages/, {SRC}/)")
        old = list(deps[len(own):])
        if old == new:
            continue
        drift[stage] = ([d for d in old if d not in new], [d for d in new if d not in old])
        tail = deps.ca.items.pop(len(deps) - 1, None)  # a comment after the list sits on its last item
        for i in range(len(deps) - 1, len(own) - 1, -1):
            deps.ca.items.pop(i, None)
            del deps[i]
        deps.extend(new)
        if tail is not None:
            deps.ca.items[len(deps) - 1] = tail
    out = io.StringIO()
    y.dump(doc, out)
    return out.getvalue(), drift


def describe(drift: dict[str, tuple[list[str], list[str]]]) -> str:
    lines = []
    for stage, (removed, added) in drift.items():
        lines.append(f"{stage}:")
        lines += [f"  - {d}" for d in removed] + [f"  + {d}" for d in added]
        if not removed and not added:
            lines.append("  (order)")
    return "\n".join(lines)


@user_errors
def dvc_deps(dvc_yaml: Annotated[Path, typer.Option("--dvc-yaml", help="the pipeline file")] = DVC_YAML,
             check: Annotated[bool, typer.Option("--check", help=CHECK_HELP)] = False) -> None:
    """Write each dvc.yaml stage's code deps from its import closure (run after adding an import or a module;
    `make deps`). Everything else in dvc.yaml is kept as it is."""
    if not dvc_yaml.is_file():
        raise FileNotFoundError(f"{dvc_yaml} not found (run from the repository root or pass --dvc-yaml)")
    text, drift = generate(dvc_yaml)
    if not drift:
        typer.echo(f"{dvc_yaml}: code deps match the imports")
        return
    if check:
        typer.echo(f"{dvc_yaml}: code deps differ from the imports (run `distillpipe dvc-deps`):\n{describe(drift)}",
                   err=True)
        raise typer.Exit(1)
    tmp = dvc_yaml.with_name(f".{dvc_yaml.name}.partial")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(dvc_yaml)
    typer.echo(f"{dvc_yaml}: wrote the code deps of {len(drift)} stage(s)\n{describe(drift)}")
