"""``distillpipe dvc-deps``: wire every ``dvc.yaml`` stage to its code fingerprint, the one code dep DVC sees.

A stage's code is its import closure (:func:`distillpipe.identity.import_closure`), and DVC must re-run the stage
when, and only when, that code changes what it does. So no stage depends on the source: the ``fingerprint`` stage
does (``stages/`` and ``src/distillpipe/`` as folders) and writes one file per stage script,
``fingerprints/<script>.json``, holding the fingerprint by meaning of every file of its closure
(:mod:`distillpipe.fingerprints`; comments, docstrings and layout do not count). Every other stage depends on its
script's file. This command writes those deps, so no one keeps them by hand; ``--check`` writes nothing and exits
1 naming each stage whose deps differ.

What it writes, per stage (a ``foreach`` group once, for all its items), after the stage's data deps:

* ``fingerprints/<script>.json``, the script being the one its ``cmd`` runs (``python -m stages.<script>``);
* for a stage that builds or loads students through the registry (``students/__init__.py`` is in its closure),
  which imports an architecture only by name: ONE line naming the item's own architecture's file, such as
  ``fingerprints/students/${item.model.student}.json``. That line is the one code dep written by hand (it says
  which key of the stage's params items names the architecture); this command keeps it (and turns the form
  before fingerprints, ``src/distillpipe/students/${item.model.student}.py``, into it);
* for the ``fingerprint`` stage itself: ``stages`` and ``src/distillpipe``. A ``dvc.yaml`` without that stage
  gets it, first.

Everything else in ``dvc.yaml`` (comments, order, data deps, params, outs) is kept byte for byte: the file is
edited with ruamel.yaml's round-trip mode, which reproduces it exactly (tested).
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import user_errors
from distillpipe.errors import UserError
from distillpipe.fingerprints import FOLDER, SELF, SRC, STAGES, Closures, stage_file

SCRIPT = re.compile(r"\bpython3?\s+(?:-m\s+(stages\.\w+)|(stages/\w+\.py))")
"""The stage script in a stage's ``cmd``: ``python -m stages.<name>`` or ``python stages/<name>.py``."""
ARCHITECTURE_DEP = re.compile(rf"^{FOLDER}/students/\$\{{item(\.\w+)+\}}\.json$")
"""The hand-written line naming a stage item's architecture, e.g. ``fingerprints/students/${item.student}.json``."""
OLD_ARCHITECTURE_DEP = re.compile(rf"^{SRC}/students/\$\{{(item(?:\.\w+)+)\}}\.py$")
"""The same line before fingerprints, naming the source file: rewritten into the form above."""
SOURCE_DEPS = [STAGES, SRC]
"""The ``fingerprint`` stage's code deps: the source folders it reads."""
FINGERPRINT_STAGE = {"cmd": f"python -m stages.{SELF} --out {FOLDER}", "deps": list(SOURCE_DEPS),
                     "outs": [{FOLDER: {"cache": False, "persist": True}}]}
FINGERPRINT_COMMENT = ("seconds: the one stage that reads the source. Its output is small and git-tracked (cache: "
                       "false): a\ncommit's diff of fingerprints/ shows which stages the commit changes.")


DVC_YAML = Path("dvc.yaml")
CHECK_HELP = "write nothing; exit 1 naming each stage whose code deps differ from what this command writes"


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
    """Whether this command writes the dep (a fingerprint file, the source, a script), or it is the stage's own
    (data, models, a user's folder)."""
    return dep in SOURCE_DEPS or dep.startswith((f"{FOLDER}/", f"{SRC}/", f"{STAGES}/"))


def _architecture_line(deps: list[str], stage: str) -> str | None:
    found = []
    for d in deps:
        if ARCHITECTURE_DEP.match(d):
            found.append(d)
        elif m := OLD_ARCHITECTURE_DEP.match(d):
            found.append(f"{FOLDER}/students/${{{m.group(1)}}}.json")
        elif "${" in d and is_code_dep(d):
            raise DepsError(f"dvc.yaml: stage {stage}: {d} is not a code dep this command can keep; the one "
                            f"interpolated code dep is `{FOLDER}/students/${{item.<key>}}.json`")
    if len(found) > 1:
        raise DepsError(f"dvc.yaml: stage {stage} names its architecture twice: {found}")
    return found[0] if found else None


def stage_deps(closures: Closures, stage: str, body: dict) -> list[str]:
    """The code deps this command writes for one stage (``body``: its definition, a foreach's ``do``)."""
    script = stage_script(body["cmd"], stage)
    if Path(script).stem == SELF:
        return list(SOURCE_DEPS)
    arch = _architecture_line(list(body.get("deps") or []), stage)
    builds = closures.builds_students(script)
    if builds and arch is None:
        raise DepsError(f"dvc.yaml: stage {stage} imports the students registry ({SRC}/students/__init__.py), which "
                        f"imports an architecture by name: add `- {FOLDER}/students/${{item.<key>}}.json` to its "
                        "deps, <key> being the field of its params items that names the architecture (model.student, "
                        "student)")
    if arch is not None and not builds:
        raise DepsError(f"dvc.yaml: stage {stage} depends on {arch}, but it does not import the students registry: "
                        "remove that line")
    return [stage_file(script)] + ([arch] if arch else [])


def _add_fingerprint_stage(stages) -> None:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    body = CommentedMap(cmd=FINGERPRINT_STAGE["cmd"], deps=CommentedSeq(SOURCE_DEPS),
                        outs=CommentedSeq([CommentedMap({FOLDER: CommentedMap(cache=False, persist=True)})]))
    stages.insert(0, SELF, body)
    body.yaml_set_start_comment(FINGERPRINT_COMMENT, indent=4)


def generate(dvc_yaml: Path) -> tuple[str, dict[str, tuple[list[str], list[str]]]]:
    """(the text of ``dvc_yaml`` with every stage's code deps written, {stage: (removed, added)} where they
    differ from the file's)."""
    y = _yaml()
    doc = y.load(dvc_yaml.read_text(encoding="utf-8"))
    closures = Closures(dvc_yaml.resolve().parent)
    drift: dict[str, tuple[list[str], list[str]]] = {}
    stages = doc.get("stages") or {}
    scripts = [SCRIPT.search(str(d.get("do", d).get("cmd", ""))) for d in stages.values()]
    if not any(m and Path(m.group(2) or m.group(1).replace(".", "/")).stem == SELF for m in scripts):
        _add_fingerprint_stage(stages)
        drift[SELF] = ([], list(SOURCE_DEPS))
    for stage, definition in stages.items():
        body = definition.get("do", definition)
        if "cmd" not in body or not SCRIPT.search(body["cmd"]):
            continue  # not a project stage (a user's own command): its deps are theirs
        deps = body.get("deps")
        if deps is None:
            first = stage_file(stage_script(body["cmd"], stage))
            raise DepsError(f"dvc.yaml: stage {stage} has no deps: add `deps: [{first}]`")
        new = stage_deps(closures, stage, body)
        own = [d for d in deps if not is_code_dep(d)]
        if [d for d in deps[: len(own)]] != own:
            raise DepsError(f"dvc.yaml: stage {stage}: list its data deps before its code deps ({FOLDER}/, {STAGES}/, "
                            f"{SRC}/)")
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
    """Wire each dvc.yaml stage to its code fingerprint file (run after adding a stage; `make deps`). Everything
    else in dvc.yaml is kept as it is."""
    if not dvc_yaml.is_file():
        raise FileNotFoundError(f"{dvc_yaml} not found (run from the repository root or pass --dvc-yaml)")
    text, drift = generate(dvc_yaml)
    if not drift:
        typer.echo(f"{dvc_yaml}: every stage depends on its code fingerprint")
        return
    if check:
        typer.echo(f"{dvc_yaml}: code deps differ (run `distillpipe dvc-deps`):\n{describe(drift)}",
                   err=True)
        raise typer.Exit(1)
    tmp = dvc_yaml.with_name(f".{dvc_yaml.name}.partial")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(dvc_yaml)
    typer.echo(f"{dvc_yaml}: wrote the code deps of {len(drift)} stage(s)\n{describe(drift)}")
