"""load_teacher: the requested head, sdpa attention, eval mode; a missing head is refused clearly."""

import pytest
from _teacher_tiny import save_teacher_dir, tiny_model

from distillpipe.assets import AssetError
from distillpipe.teacher.load import load_teacher


@pytest.fixture(scope="module")
def teacher_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("teachers")
    return {kind: save_teacher_dir(root / kind, tiny_model(kind)) for kind in ("base", "mlm", "classification", "qa")}


@pytest.mark.parametrize("head,cls", [("base", "BertModel"), ("mlm", "BertForMaskedLM"),
                                      ("classification", "BertForSequenceClassification"),
                                      ("qa", "BertForQuestionAnswering")])
def test_loads_each_head_sdpa_and_in_eval_mode(teacher_dirs, head, cls):
    model, tok = load_teacher(teacher_dirs[head], head, "cpu")
    assert type(model).__name__ == cls
    assert not model.training and model.config._attn_implementation == "sdpa"
    assert next(model.parameters()).device.type == "cpu"
    assert tok("w1 w2")["input_ids"][0] == tok.cls_token_id


def test_base_loads_from_a_checkpoint_with_a_head(teacher_dirs):
    """An MLM checkpoint has no pooler: that is fine for hidden/attention capture."""
    model, _ = load_teacher(teacher_dirs["mlm"], "base", "cpu")
    assert type(model).__name__ == "BertModel"


def test_missing_mlm_head_is_refused(teacher_dirs):
    with pytest.raises(AssetError, match="no MLM head.*hidden-state and attention signals only"):
        load_teacher(teacher_dirs["base"], "mlm", "cpu")


@pytest.mark.parametrize("head", ["classification", "qa"])
def test_missing_task_head_is_refused(teacher_dirs, head):
    with pytest.raises(AssetError, match="teacher_finetune"):
        load_teacher(teacher_dirs["base"], head, "cpu")
    with pytest.raises(AssetError, match="no fine-tuned"):
        load_teacher(teacher_dirs["mlm"], head, "cpu")


def test_bad_head_and_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="unknown teacher head"):
        load_teacher(tmp_path, "lm", "cpu")
    with pytest.raises(AssetError, match="does not exist"):
        load_teacher("models/teacher/nowhere", "base", "cpu")
