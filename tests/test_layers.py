"""The package graph runs downwards (distillpipe.LAYERS): every import of a distillpipe package, anywhere in
the source, points to a lower layer, and none hides inside a function."""

import ast
from pathlib import Path

import distillpipe
from distillpipe import LAYERS

SRC = Path(distillpipe.__file__).parent


def _target(node: ast.ImportFrom | ast.Import, module: tuple[str, ...]) -> list[str]:
    """The distillpipe top-level names (``data``, ``errors``...) an import statement reaches."""
    if isinstance(node, ast.Import):
        return [a.name.split(".")[1] for a in node.names if a.name.startswith("distillpipe.")]
    if node.level:  # relative: resolve against the importing module's package
        base = ("distillpipe", *module[:-1])[: len(module) + 1 - node.level]
        full = [*base, *(node.module.split(".") if node.module else [])]
    else:
        full = node.module.split(".") if node.module else []
    if not full or full[0] != "distillpipe":
        return []
    if len(full) > 1:
        return [full[1]]
    return [a.name for a in node.names]  # from distillpipe import losses


def violations(src: Path, layers) -> list[str]:
    rank = {name: i for i, layer in enumerate(layers) for name in layer}
    found = []
    for f in sorted(src.rglob("*.py")):
        module = f.relative_to(src).with_suffix("").parts
        if module == ("__init__",):
            continue
        own = module[0]
        if own not in rank:
            found.append(f"{'/'.join(module)}: distillpipe.{own} is in no layer of distillpipe.LAYERS")
            continue
        tree = ast.parse(f.read_text(), str(f))
        top_level = set(map(id, tree.body))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _target(node, module):
                if target == own or target == "__version__" or target == "LAYERS":
                    continue
                where = f"{'/'.join(module)}.py:{node.lineno}"
                if id(node) not in top_level:
                    found.append(f"{where}: function-local import of distillpipe.{target}")
                if target not in rank:
                    found.append(f"{where}: imports distillpipe.{target}, which is in no layer")
                elif rank[target] >= rank[own]:
                    found.append(f"{where}: {own} (layer {rank[own]}) imports {target} (layer {rank[target]})")
    return found


def test_every_import_points_down():
    assert violations(SRC, LAYERS) == []


def test_every_package_has_one_layer():
    names = [n for layer in LAYERS for n in layer]
    assert len(names) == len(set(names))
    present = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert present == set(names)


def test_the_check_finds_upward_sideways_and_hidden_imports(tmp_path):
    pkg = tmp_path / "distillpipe"
    for name, text in {
        "low/__init__.py": "",
        "low/a.py": "from distillpipe.high.b import x\n",  # upward
        "low/c.py": "from . import d\nfrom .d import y\n",  # within its own package: fine
        "low/d.py": "x = y = 1\n",
        "side/__init__.py": "from distillpipe import low\n",  # sideways (same layer as low)
        "high/__init__.py": "",
        "high/b.py": "import distillpipe.low.d\n\ndef f():\n    from ..low import c\n",  # down, but hidden
        "stray.py": "",
    }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    found = violations(pkg, (("low", "side"), ("high",)))
    assert found == [
        "high/b.py:4: function-local import of distillpipe.low",
        "low/a.py:1: low (layer 0) imports high (layer 1)",
        "side/__init__.py:1: side (layer 0) imports low (layer 0)",
        "stray: distillpipe.stray is in no layer of distillpipe.LAYERS",
    ]
