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
