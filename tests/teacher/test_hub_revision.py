"""Hub models: the commit a name resolved to is recorded with the imported weights (a DVC output), so a moved
`main` changes the output instead of slipping in; `name@<sha>` pins it. Runs huggingface_hub's real
snapshot resolution against a local hub cache laid out as the hub client writes it (no network)."""

import json
import logging
import shutil

import huggingface_hub.constants
from _tiny import make_tiny_bert_dir

from distillpipe.assets import hub_revision
from distillpipe.teacher.importer import import_teacher

OLD, NEW = "a" * 40, "b" * 40


def fake_hub_cache(root, tmp_path):
    repo = root / "models--org--tiny"
    for sha, seed in ((OLD, 0), (NEW, 1)):
        make_tiny_bert_dir(tmp_path / f"src-{sha[0]}", seed=seed)
        shutil.copytree(tmp_path / f"src-{sha[0]}", repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(OLD)
    return repo


def test_hub_commit_recorded_and_pinnable(tmp_path, monkeypatch, caplog):
    cache = tmp_path / "hub"
    repo = fake_hub_cache(cache, tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))

    with caplog.at_level(logging.WARNING, logger="distillpipe.assets"):
        import_teacher("org/tiny", tmp_path / "t1")
    assert json.loads((tmp_path / "t1" / "distillpipe_source.json").read_text())["hub_revision"] == OLD
    assert f"resolved to hub commit {OLD}" in caplog.text and f"org/tiny@{OLD}" in caplog.text

    (repo / "refs" / "main").write_text(NEW)  # the hub's main moved
    import_teacher("org/tiny", tmp_path / "t2")
    assert json.loads((tmp_path / "t2" / "distillpipe_source.json").read_text())["hub_revision"] == NEW
    assert (tmp_path / "t1" / "model.safetensors").read_bytes() != (tmp_path / "t2" / "model.safetensors").read_bytes()

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="distillpipe.assets"):
        import_teacher(f"org/tiny@{OLD}", tmp_path / "t3")  # pinned: the old weights, whatever main says
    assert (tmp_path / "t3" / "model.safetensors").read_bytes() == (tmp_path / "t1" / "model.safetensors").read_bytes()
    assert "resolved to hub commit" not in caplog.text


def test_local_and_embedded_folders_have_no_hub_revision(tmp_path):
    d = make_tiny_bert_dir(tmp_path / "m")
    assert hub_revision(d) is None
    import_teacher(str(d), tmp_path / "out")
    assert json.loads((tmp_path / "out" / "distillpipe_source.json").read_text()) == {"spec": str(d)}
