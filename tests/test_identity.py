"""Import closures and code fingerprints (distillpipe.identity) on a hand-made package whose closure is known; code
fingerprints by meaning against Python's own compiler on every file of the project; and the tokens fingerprint as a
content digest."""

import json
import re
import shutil
from pathlib import Path

import pytest

from distillpipe.identity import code_fingerprints, import_closure, python_fingerprint


@pytest.fixture
def pkg(tmp_path) -> Path:
    """A package ``toy`` with every kind of import the project uses."""
    files = {
        "__init__.py": "",
        "a.py": "from toy.sub import b\n",                     # from-import of a submodule
        "sub/__init__.py": "import toy.util\n",                # a package __init__ runs first
        "sub/b.py": "from . import c\nfrom ..util import f\n",  # relative imports
        "sub/c.py": "def g():\n    from toy.late import h\n",  # function-local import
        "util.py": "import json\ndef f(): pass\n",             # outside the package: not followed
        "late.py": "",
        "unused.py": "import toy.a\n",
    }
    root = tmp_path / "toy"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def rel(paths, root):
    return sorted(p.relative_to(root).as_posix() for p in paths)


def test_closure_follows_every_kind_of_import(pkg):
    assert rel(import_closure(["toy.a"], package_dir=pkg), pkg) == [
        "__init__.py", "a.py", "late.py", "sub/__init__.py", "sub/b.py", "sub/c.py", "util.py"]
    assert rel(import_closure(["toy.late"], package_dir=pkg), pkg) == ["__init__.py", "late.py"]


def test_closure_of_a_script(pkg, tmp_path):
    script = tmp_path / "run.py"
    script.write_text("from toy.sub.c import g\n")
    assert rel(import_closure(scripts=[script], package_dir=pkg), pkg) == [
        "__init__.py", "late.py", "sub/__init__.py", "sub/c.py", "util.py"]


def test_unknown_module_is_refused(pkg):
    with pytest.raises(ValueError, match="toy.nope is not a module"):
        import_closure(["toy.nope"], package_dir=pkg)


def test_code_fingerprints_name_the_file_that_changed(pkg):
    before = code_fingerprints(["toy.a"], package_dir=pkg)
    assert set(before) == {f"toy/{p}" for p in ("__init__.py", "a.py", "late.py", "sub/__init__.py", "sub/b.py",
                                                   "sub/c.py", "util.py")}
    (pkg / "late.py").write_text("x = 1\n")
    after = code_fingerprints(["toy.a"], package_dir=pkg)
    assert [k for k in before if before[k] != after[k]] == ["toy/late.py"]
    (pkg / "late.py").write_text("# a comment\n\nx = (\n    1\n)  # the same x\n")
    assert code_fingerprints(["toy.a"], package_dir=pkg) == after
    (pkg / "unused.py").write_text("x = 2\n")  # not in the closure
    assert code_fingerprints(["toy.a"], package_dir=pkg) == after
    (pkg / "sub" / "table.csv").write_text("a,b\n")  # package data beside a module of the closure: by its bytes
    with_data = code_fingerprints(["toy.a"], package_dir=pkg)
    assert set(with_data) - set(after) == {"toy/sub/table.csv"} and with_data["toy/sub/table.csv"].startswith("sha256:")
    (pkg / "sub" / "table.csv").write_text("a,c\n")
    assert code_fingerprints(["toy.a"], package_dir=pkg)["toy/sub/table.csv"] != with_data["toy/sub/table.csv"]


# -- fingerprints by meaning -----------------------------------------------------------------------------------

_BASE = '''"""Module docstring."""
import math


class Pool:
    """Class docstring."""

    scale: float = 2.0
    """An attribute's docstring."""

    @staticmethod
    def mean(xs, eps=1e-6):
        """Mean of xs."""
        total = sum(xs)  # the sum
        return total / (len(xs) + eps) * math.pi
'''

_SAME = {  # the same code, written otherwise: no fingerprint changes
    "comments": _BASE.replace("import math\n", "import math  # for pi\n# a comment line\n"),
    "docstrings": _BASE.replace("Mean of xs.", "The mean, now documented\n        at length.").replace(
        '"""Module docstring."""\n', "").replace('"""An attribute\'s docstring."""', '"""Changed."""'),
    "layout": _BASE.replace("return total / (len(xs) + eps) * math.pi",
                            "return (total\n                / (len(xs) + eps)\n                * math.pi)").replace(
        "\n\nclass", "\nclass").replace("mean(xs, eps=1e-6)", "mean(\n        xs,\n        eps=1e-6,\n    )"),
    "quotes and u prefix": _BASE.replace('"""Class docstring."""', "u'Class docstring.'"),
}

_OTHER = {  # one token of meaning changed: the fingerprint changes
    "a renamed local variable": _BASE.replace("total", "s"),
    "a constant's type": _BASE.replace("scale: float = 2.0", "scale: float = 2"),
    "a default value": _BASE.replace("eps=1e-6", "eps=1e-7"),
    "an operator": _BASE.replace("* math.pi", "/ math.pi"),
    "an annotation": _BASE.replace("scale: float", "scale: int"),
    "a decorator": _BASE.replace("@staticmethod", "@classmethod"),
    "an import": _BASE.replace("import math", "import math\nimport cmath"),
    "a string that is a value": _BASE.replace("return total", "name = 'mean'\n        return total"),
    "the order of statements": _BASE.replace('    scale: float = 2.0\n    """An attribute\'s docstring."""\n',
                                             "").replace("    @staticmethod", "    @staticmethod").replace(
        "        return total", "        scale = 2.0\n        return total"),
}


@pytest.mark.parametrize("how", sorted(_SAME))
def test_a_comment_a_docstring_or_the_layout_changes_no_fingerprint(how):
    assert _SAME[how] != _BASE
    assert python_fingerprint(_SAME[how]) == python_fingerprint(_BASE)


@pytest.mark.parametrize("how", sorted(_OTHER))
def test_every_change_of_meaning_changes_the_fingerprint(how):
    assert python_fingerprint(_OTHER[how]) != python_fingerprint(_BASE)


def _code(obj) -> list:
    """What CPython compiles a code object to, without positions: its instructions, nested code objects
    (functions, classes, comprehensions) walked; the independent reference for 'the same meaning'. Positions steer
    the compiler's block layout (line-event NOPs, a jump forwards or backwards to an exit block kept per line), so
    NOPs are dropped and a jump is only a jump (which kind, direction and target depend on the layout of a
    boolean expression over lines)."""
    import dis
    import types

    out = []
    for i in dis.get_instructions(obj):
        if i.opname == "NOP":
            continue
        if i.opcode in dis.hasjrel or i.opcode in dis.hasjabs:
            out.append(("JUMP",))
        elif isinstance(i.argval, types.CodeType):
            out.append((i.opname, _code(i.argval)))
        else:
            out.append((i.opname, type(i.argval).__name__, i.argrepr))
    return out


def _compiled(source: str) -> list:
    return _code(compile(source, "f", "exec", dont_inherit=True, optimize=2))  # optimize=2: no docstrings


def test_fingerprints_agree_with_the_compiler_on_every_project_file():
    """Independent reference, over every Python file of this repository: each file written out again by
    ``ast.unparse`` (other layout, no comments, other quotes) and with its docstrings removed compiles to the same
    code as the file (checked here with CPython's compiler, positions aside) and has the file's fingerprint; the
    file with one name renamed compiles to other code and has another fingerprint."""
    import ast

    root = Path(__file__).resolve().parents[1]
    files = sorted([*(root / "src").rglob("*.py"), *(root / "stages").glob("*.py")])
    assert len(files) > 100
    checked = 0
    for path in files:
        source = path.read_text()
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                    and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                    and isinstance(node.body[0].value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
        rewritten = ast.unparse(tree)
        assert rewritten != source
        assert python_fingerprint(rewritten) == python_fingerprint(source), path
        assert _compiled(rewritten) == _compiled(source), path
        names = sorted({n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and len(n.id) > 3})
        if names:
            renamed = re.sub(rf"\b{names[0]}\b", names[0] + "_renamed", source)
            assert python_fingerprint(renamed) != python_fingerprint(source), path
            assert _compiled(renamed) != _compiled(source), path
            checked += 1
    assert checked > 100


def test_only_the_command_line_reads_a_docstring():
    """Docstrings are left out of fingerprints because no stage output can depend on one: the only reader of a
    ``__doc__`` in the package is the command line's help text."""
    import ast

    def reads_doc(tree: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id == "__doc__" or isinstance(n, ast.Attribute) and n.attr in (
            "__doc__", "getdoc") or isinstance(n, ast.keyword) and n.arg == "use_attribute_docstrings"
            or isinstance(n, ast.Constant) and n.value == "__doc__" for n in ast.walk(tree))

    root = Path(__file__).resolve().parents[1]
    readers = sorted(p.relative_to(root).as_posix() for p in (root / "src").rglob("*.py")
                     if reads_doc(ast.parse(p.read_text())))
    assert readers == ["src/distillpipe/cli.py"], readers


def test_tokens_fingerprint_is_the_content(tmp_path):
    """Same bytes, same fingerprint (whatever produced them); any other byte, another fingerprint."""
    from _tiny import make_qa_tokens, make_tiny_bert_dir

    from distillpipe.data.schema import read_meta
    from distillpipe.data.tokenize import tokens_fingerprint

    teacher = make_tiny_bert_dir(tmp_path / "t", qa=True)
    _, tokens = make_qa_tokens(tmp_path, teacher)
    meta = read_meta(tokens)
    assert meta["fingerprint"] == tokens_fingerprint(tokens)
    again = tmp_path / "again"
    _, tokens2 = make_qa_tokens(again, teacher)
    assert read_meta(tokens2)["fingerprint"] == meta["fingerprint"]
    moved = tmp_path / "moved_tokens"
    shutil.copytree(tokens, moved)
    m = json.loads((moved / "meta.json").read_text())
    m["tokenizer"]["spec"] = "/somewhere/else"  # where the tokenizer was read from is not content
    (moved / "meta.json").write_text(json.dumps(m))
    assert tokens_fingerprint(moved) == meta["fingerprint"]
    arrow = next(moved.rglob("*.arrow"))
    data = bytearray(arrow.read_bytes())
    data[-20] ^= 0x01
    arrow.write_bytes(bytes(data))
    assert tokens_fingerprint(moved) != meta["fingerprint"]


# -- the pipeline's own identities: no holes ----------------------------------------------------------

def _stage_scripts():
    from test_dvc_deps import ROOT, stage_script, stage_templates

    return ROOT, {name: stage_script(stage) for name, stage in stage_templates().items()}


def test_every_stage_script_only_runs_its_command():
    """A stage script is left out of the code identities (it is not installed on dask workers), so it must
    be unable to change an output: a docstring, ``from distillpipe.commands.<stage> import main`` and
    ``if __name__ == "__main__": main()``, nothing else."""
    import ast

    _, scripts = _stage_scripts()
    for name, script in scripts.items():
        body = ast.parse(script.read_text()).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        expected = ast.parse(f"from distillpipe.commands.{script.stem} import main\n"
                             "if __name__ == '__main__':\n    main()\n").body
        assert ast.dump(ast.Module(body, [])) == ast.dump(ast.Module(expected, [])), f"{name}: {script}"


def test_resumable_identities_hold_every_file_dvc_reruns_the_stage_for():
    """The code in a store manifest, a checkpoint's identity or augment's chunk identity is the stage's
    whole import closure, with the very fingerprints its fingerprint file holds (the file DVC re-runs the stage
    for; tests/test_dvc_deps.py checks it covers the imports), for a student run with its own architecture's file
    and no other's. So no edit can make DVC re-run a stage that then resumes work done by other code, an edit
    to another architecture neither re-runs nor restarts it, and DVC, a store and a checkpoint agree on what code
    made an output."""
    from test_dvc_deps import ROOT, code_deps, stage_templates

    from distillpipe.config.students import ARCHITECTURES
    from distillpipe.fingerprints import documents
    from distillpipe.identity import stage_code
    from distillpipe.qg import augment, finetune
    from distillpipe.teacher import cache
    from distillpipe.train import build, teacher_finetune

    stages = stage_templates()
    docs = {k: json.loads(v)["files"] for k, v in documents(ROOT).items()}
    identities = {cache.STAGE: cache.producer_code(), augment.CODE_STAGE: stage_code(augment.CODE_STAGE),
                  teacher_finetune.CODE_STAGE: stage_code(teacher_finetune.CODE_STAGE),
                  finetune.CODE_STAGE: stage_code(finetune.CODE_STAGE)}
    assert set(identities) == {"teacher_cache", "augment", "teacher_finetune", "qg_finetune"}
    for stage, code in identities.items():
        assert {f"src/{f}" for f in code} == code_deps(stages[stage]) - {f"stages/{stage}.py"}, stage
        assert {f"src/{f}": v for f, v in code.items()} == {
            f: v for f, v in docs[f"fingerprints/{stage}.json"].items() if f.startswith("src/")}, stage
    for arch in ARCHITECTURES:
        code = stage_code(*build.CODE_STAGES, student=arch)
        training = {f"src/{f}" for f in code}
        others = {f"src/distillpipe/students/{a}.py" for a in ARCHITECTURES if a != arch}
        assert f"src/distillpipe/students/{arch}.py" in training and not training & others, arch
        assert code[f"distillpipe/students/{arch}.py"] == \
            docs[f"fingerprints/students/{arch}.json"][f"src/distillpipe/students/{arch}.py"]
        for stage in ("train", "train_aug", "finetune", "train_lm"):
            assert stage in build.CODE_STAGES and code_deps(stages[stage], arch) - {f"stages/{stage}.py"} <= training
    # the two files whose edits a narrower identity once let resume a stale store
    assert {"distillpipe/teacher/cache.py", "distillpipe/teacher/load.py"} <= set(identities["teacher_cache"])


def test_a_checkpoint_identity_holds_its_own_architecture():
    """run_identity (what a checkpoint must match to resume) hashes the training code with the run's architecture:
    two runs of the real params.yaml, a CMOW and a WaLDORf, get the code digests stage_code gives for each."""
    import torch
    from test_dvc_deps import ROOT

    from distillpipe.config.base import load_section
    from distillpipe.config.train import TrainConfig
    from distillpipe.identity import code_identity, stage_code
    from distillpipe.train.build import CODE_STAGES, run_identity

    cfg = load_section(ROOT / "params.yaml", "train", TrainConfig)
    codes = {}
    for name in ("hybrid", "waldorf-soft"):
        run = cfg.runs[name]
        ident = run_identity(run=run, model_cfg=run.model, loader_cfg=cfg.loader, tokens_meta={"fingerprint": "t"},
                             sources={}, init_dir=None, augment=None, device=torch.device("cpu"), processes=1)
        assert ident["code"] == code_identity(stage_code(*CODE_STAGES, student=run.model.student)), name
        codes[name] = ident["code"]
    assert codes["hybrid"] != codes["waldorf-soft"]
