"""Every file a tokenizer needs survives teacher_import, teacher_finetune's save and export, for each architecture
family's tokenizer in the layout the hub ships it (DeBERTa-v3: spm.model and no tokenizer.json); the tokenizer
digest covers those files; a hub snapshot brings only what loading needs."""

import shutil

import huggingface_hub.constants
import pytest
from _arch_tiny import SENTENCE, save_hub_tokenizer, tiny_model
from huggingface_hub.utils import filter_repo_objects
from transformers import AutoTokenizer

from distillpipe.assets import hub_allow_patterns, tokenizer_files, tokenizer_sha256
from distillpipe.ship.bundle import write_tokenizer
from distillpipe.teacher.importer import import_teacher
from distillpipe.train.teacher_finetune import _save

FAMILIES = ("bert", "roberta", "electra", "distilbert", "deberta_v2", "modernbert")


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_encodes_as_the_original_after_import_finetune_and_export(tmp_path, family):
    hub = save_hub_tokenizer(family, tmp_path / "hub")
    model = tiny_model(family)
    model.save_pretrained(hub)
    original = AutoTokenizer.from_pretrained(hub)
    want = original(SENTENCE)["input_ids"]
    assert len(set(want)) > 6, "the reference tokenizer itself must have a real vocabulary"

    import_teacher(str(hub), tmp_path / "imported")
    _save(model, tmp_path / "imported", tmp_path / "finetuned", {}, {})
    (tmp_path / "export").mkdir()
    write_tokenizer(tmp_path / "export", tmp_path / "finetuned", tokenizer_sha256(hub))
    for stage in ("imported", "finetuned", "export"):
        folder = tmp_path / stage
        assert tokenizer_files(folder) == tokenizer_files(hub), stage
        assert tokenizer_sha256(folder) == tokenizer_sha256(hub), stage
        reloaded = AutoTokenizer.from_pretrained(folder)
        assert len(reloaded) == len(original), stage
        assert reloaded(SENTENCE)["input_ids"] == want, stage


def test_deberta_sentencepiece_model_is_carried_and_covered_by_the_digest(tmp_path):
    hub = save_hub_tokenizer("deberta_v2", tmp_path / "hub")
    assert "spm.model" in tokenizer_files(hub) and not (hub / "tokenizer.json").exists()
    before = tokenizer_sha256(hub)
    other = save_hub_tokenizer("deberta_v2", tmp_path / "other")
    data = (other / "spm.model").read_bytes()
    (hub / "spm.model").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit of the SentencePiece model
    assert tokenizer_sha256(hub) != before
    (hub / "spm.model").unlink()  # what the old file list did to a fine-tuned DeBERTa: a 7-token vocabulary
    assert len(AutoTokenizer.from_pretrained(hub)) < 10


def test_hub_download_keeps_weights_config_and_tokenizer_only():
    repo = ["config.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5", "flax_model.msgpack",
            "onnx/model.onnx", "rust_model.ot", "coreml/model.mlpackage", "spm.model", "tokenizer_config.json",
            "tokenizer.json", "vocab.txt", "merges.txt", "vocab.json", "added_tokens.json", "special_tokens_map.json",
            "README.md", "model-00001-of-00002.safetensors", "model.safetensors.index.json"]
    kept = set(filter_repo_objects(repo, allow_patterns=hub_allow_patterns()))
    assert kept == set(repo) - {"tf_model.h5", "flax_model.msgpack", "onnx/model.onnx", "rust_model.ot",
                                "coreml/model.mlpackage", "README.md"}


def test_import_of_a_hub_snapshot_copies_only_what_loading_needs(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--org--deb" / "snapshots" / ("c" * 40)
    save_hub_tokenizer("deberta_v2", snap)
    tiny_model("deberta_v2").save_pretrained(snap)
    for junk in ("tf_model.h5", "flax_model.msgpack", "README.md"):
        (snap / junk).write_bytes(b"x")
    (snap / "onnx").mkdir()
    (snap / "onnx" / "model.onnx").write_bytes(b"x")
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("c" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    import_teacher("org/deb", tmp_path / "t")
    names = {p.name for p in (tmp_path / "t").iterdir()}
    assert names == {"config.json", "model.safetensors", "spm.model", "tokenizer_config.json",
                     "distillpipe_source.json"}
    shutil.rmtree(tmp_path / "hub")
    with pytest.raises(Exception, match="not in the local Hugging Face cache"):  # offline: fails at once, saying so
        import_teacher("org/deb", tmp_path / "t2")
