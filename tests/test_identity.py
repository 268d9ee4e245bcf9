"""Import closures and code digests (distillpipe.identity) on a hand-made package whose closure is known,
and the tokens fingerprint as a content digest."""

import json
import shutil
from pathlib import Path

import pytest

from distillpipe.identity import code_digests, import_closure


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


def test_code_digests_name_the_file_that_changed(pkg):
    before = code_digests(["toy.a"], package_dir=pkg)
    assert set(before) == {f"toy/{p}" for p in ("__init__.py", "a.py", "late.py", "sub/__init__.py", "sub/b.py",
                                                   "sub/c.py", "util.py")}
    (pkg / "late.py").write_text("x = 1\n")
    after = code_digests(["toy.a"], package_dir=pkg)
    assert [k for k in before if before[k] != after[k]] == ["toy/late.py"]
    (pkg / "unused.py").write_text("x = 2\n")  # not in the closure
    assert code_digests(["toy.a"], package_dir=pkg) == after


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
    whole import closure: exactly the src/ deps dvc.yaml lists for it (which tests/test_dvc_deps.py checks
    against the imports), for a student run with its own architecture's file and no other's. So no edit can
    make DVC re-run a stage that then resumes work done by other code, and an edit to another architecture
    neither re-runs nor restarts it."""
    from test_dvc_deps import code_deps, stage_templates

    from distillpipe.config.students import ARCHITECTURES
    from distillpipe.identity import stage_code
    from distillpipe.qg import augment, finetune
    from distillpipe.teacher import cache
    from distillpipe.train import build, teacher_finetune

    stages = stage_templates()
    identities = {cache.STAGE: set(cache.producer_code()), augment.CODE_STAGE: set(stage_code(augment.CODE_STAGE)),
                  teacher_finetune.CODE_STAGE: set(stage_code(teacher_finetune.CODE_STAGE)),
                  finetune.CODE_STAGE: set(stage_code(finetune.CODE_STAGE))}
    assert set(identities) == {"teacher_cache", "augment", "teacher_finetune", "qg_finetune"}
    for stage, files in identities.items():
        assert {f"src/{f}" for f in files} == code_deps(stages[stage]), stage
    for arch in ARCHITECTURES:
        training = {f"src/{f}" for f in stage_code(*build.CODE_STAGES, student=arch)}
        others = {f"src/distillpipe/students/{a}.py" for a in ARCHITECTURES if a != arch}
        assert f"src/distillpipe/students/{arch}.py" in training and not training & others, arch
        for stage in ("train", "train_aug", "finetune", "train_lm"):
            assert stage in build.CODE_STAGES and code_deps(stages[stage], arch) <= training, (stage, arch)
    # the two files whose edits a narrower identity once let resume a stale store
    assert {"distillpipe/teacher/cache.py", "distillpipe/teacher/load.py"} <= identities["teacher_cache"]


def test_a_checkpoint_identity_holds_its_own_architecture():
    """run_identity (what a checkpoint must match to resume) hashes the training code with the run's architecture:
    two runs of the real params.yaml, a CMOW and a WaLDORf, get the code digests stage_code gives for each."""
    import torch
    from test_dvc_deps import ROOT

    from distillpipe.config.base import load_section
    from distillpipe.config.train import TrainConfig
    from distillpipe.identity import json_sha256, stage_code
    from distillpipe.train.build import CODE_STAGES, run_identity

    cfg = load_section(ROOT / "params.yaml", "train", TrainConfig)
    codes = {}
    for name in ("hybrid", "waldorf-slow"):
        run = cfg.runs[name]
        ident = run_identity(run=run, model_cfg=run.model, loader_cfg=cfg.loader, tokens_meta={"fingerprint": "t"},
                             stores={}, init_dir=None, augment=None, device=torch.device("cpu"), processes=1)
        assert ident["code"] == json_sha256(stage_code(*CODE_STAGES, student=run.model.student)), name
        codes[name] = ident["code"]
    assert codes["hybrid"] != codes["waldorf-slow"]
