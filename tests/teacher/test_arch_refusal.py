"""A params file asking a teacher for a signal its architecture cannot give is refused from the teacher's config
alone, in one line naming the architecture, the signal and the nearest signal set that works, by teacher_import
(before anything is copied or fine-tuned), plan and new-task; the same table (teacher/arch.py) the capture
follows. DistilBERT's config is sized by plan under its own key names."""

import json

import pytest
import yaml
from _arch_tiny import save_hub_tokenizer, tiny_model
from _tiny import invoke_cli, make_classification_tokens, signals, write_params

from distillpipe.scaffold import add_task
from distillpipe.teacher.arch import ArchitectureError
from distillpipe.teacher.plan import plan_caches

ROOT_PARAMS = __import__("pathlib").Path(__file__).resolve().parents[2] / "params.yaml"


def _item(teacher, **sig):
    return {"teacher": teacher, "head": "classification", "split": "train", "max_rows": None,
            "signals": signals(logits=True, **sig)}


def _teacher(tmp_path, family):
    folder = save_hub_tokenizer(family, tmp_path / f"hub-{family}")
    tiny_model(family, "classification", num_labels=2).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family, name, signal", [("deberta_v2", "DeBERTa-v2/v3", "attn_scores"),
                                                  ("modernbert", "ModernBERT", "attn_scores")])
def test_teacher_import_refuses_before_copying_anything(tmp_path, family, name, signal):
    hub = _teacher(tmp_path, family)
    params = write_params(tmp_path / "params.yaml", {
        "teacher_import": {"models": {"base": str(hub)}},
        "teacher_finetune": {"tasks": {"sst2": {}}},  # sst2's teacher is fine-tuned from base: base's architecture
        "teacher_cache": {"device": "cpu", "batch_size": 8, "cpu_threads": 1, "shard_rows": 16,
                          "datasets": {"sst2": _item("sst2", hidden_layers=[1, 2], attn_layers=[2], pool=2)}}})
    res = invoke_cli(["teacher-import", "--name", "base", "--out", str(tmp_path / "out"), "--params", str(params)])
    assert res.returncode != 0
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, (res.stdout, res.stderr)
    assert (f"teacher_cache.datasets.sst2: a {name} teacher cannot give {signal}" in lines[0]
            and "Nearest signal set that works: {logits, hidden} (set attn_layers: [];" in lines[0]), lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()

    ok = yaml.safe_load(params.read_text())
    ok["teacher_cache"]["datasets"]["sst2"] = _item("sst2", hidden_layers=[1, 2], attn_layers=[], pool=2)
    write_params(params, ok)
    res = invoke_cli(["teacher-import", "--name", "base", "--out", str(tmp_path / "out"), "--params", str(params)])
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "out" / "config.json").is_file()


def test_plan_refuses_in_the_builds_words_and_sizes_a_distilbert(tmp_path):
    for name, family in (("deb", "deberta_v2"), ("dist", "distilbert")):
        folder = tmp_path / "models" / "teacher" / name
        save_hub_tokenizer(family, folder)
        tiny_model(family, "classification", num_labels=2).save_pretrained(folder)
        make_classification_tokens(tmp_path / "data" / "tokens" / name, folder, n_train=16, n_dev=4)
    params = write_params(tmp_path / "params.yaml", {
        "teacher_cache": {"device": "cpu", "batch_size": 16, "cpu_threads": 1, "shard_rows": 16, "datasets": {
            "deb": _item("deb", hidden_layers=[1], attn_layers=[1], attn_probs=True, pool=1),
            "dist": _item("dist", hidden_layers=[1], attn_layers=[1], pool=1)}},
        "tokenize": {"tokenizer": "unused", "max_seq_len": 32, "datasets": {}}})
    items = {i.name: i for i in plan_caches(params, tmp_path, tmp_path / "no_bench.json").items}
    assert items["deb"].problems == [
        "teacher_cache.datasets.deb: a DeBERTa-v2/v3 teacher cannot give attn_probs: disentangled attention (c2c + "
        "c2p + p2c relative-position terms at scale 1/sqrt(d_head x (1 + #pos_att_type)), computed inside "
        "DisentangledSelfAttention) is not Q K^T of its projections. Nearest signal set that works: {logits, hidden} "
        "(set attn_layers: [] (or attn_probs: false); docs/teachers.md)"]
    assert items["deb"].spec is None
    dist = items["dist"]
    assert not dist.problems and dist.spec is not None, dist.notes
    assert dist.spec.hidden_size == 32 and dist.spec.n_heads == 4 and dist.row_bytes > 0


def test_new_task_refuses_a_signal_the_base_teacher_cannot_give(tmp_path):
    hub = _teacher(tmp_path, "modernbert")
    p = tmp_path / "params.yaml"
    params = yaml.safe_load(ROOT_PARAMS.read_text())
    params["teacher_import"]["models"]["base"] = str(hub)
    p.write_text(yaml.safe_dump(params, sort_keys=False))
    local = {"format": "glue", "task": "sst2", "path": "data/raw/x", "files": {"train": "train.tsv"},
             "encoding": "utf-8", "on_bad_rows": "error", "carve": {"dev": 0.1, "test": 0.1, "seed": 0}}
    # wiki_pairs caches logits only: a ModernBERT gives them
    add_task(p, "pairs2", "wiki_pairs", {**local, "task": "mrpc"}, write=False)
    params["teacher_cache"]["datasets"]["polarity"]["signals"].update(attn_layers=[1], attn_probs=True)
    p.write_text(yaml.safe_dump(params, sort_keys=False))
    before = p.read_text()
    with pytest.raises(ArchitectureError) as e:  # --like polarity copies its (now attention) signals
        add_task(p, "sst2", "polarity", local)
    assert str(e.value).startswith("teacher_cache.datasets.sst2: a ModernBERT teacher cannot give attn_probs: ")
    assert "\n" not in str(e.value)
    assert p.read_text() == before  # nothing written
    assert json.loads((hub / "config.json").read_text())["model_type"] == "modernbert"
