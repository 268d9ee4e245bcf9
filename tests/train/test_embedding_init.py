"""``embedding_init: teacher``: a student's token table starts as the teacher's word table on its principal directions,
checked against scikit-learn's PCA and against the teacher's own weights read with transformers."""

import numpy as np
import pytest
import torch
from _tiny import make_classification_tokens, make_tiny_bert_dir, signals
from sklearn.decomposition import PCA
from transformers import AutoModel

from distillpipe.config.base import ConfigError, build
from distillpipe.config.run import LoaderConfig
from distillpipe.config.students import CMOWHybridConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.data.collate import TrainDataError
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.train.build import build_run
from distillpipe.train.embedding_init import principal_rows

LOADER = {"block_rows": 16, "buffer_blocks": 2, "streams": 1}
OPTIM = {"epochs": 1, "max_steps": None, "batch_size": 8, "lr": 1e-3, "weight_decay": 0.0, "max_grad_norm": 1.0,
         "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0}
OBJECTIVE = {"loss_weights": {"hard": 0.5, "soft": 0.5}, "hidden_loss": "cosine", "layer_map": [-1],
             "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                          "temperature_decay": False}}
HYBRID = {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 4, "d_vec": 8,
          "init_std": 0.01, "embedding_init": "teacher", "dropout": 0.0}
MINIALBERT = {"student": "minialbert", "embedding_size": 8, "d_model": 16, "n_heads": 4, "d_ff": 32, "n_iterations": 2,
              "adapter_size": 4, "max_position_embeddings": 64, "dropout": 0.0, "init_std": 0.02,
              "embedding_init": "teacher"}


def test_principal_rows_are_sklearns_pca_with_fixed_signs():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(300, 12)) @ rng.normal(size=(12, 12)) + 3.0  # correlated columns, off-centre
    got = principal_rows(torch.from_numpy(table).float(), 5).numpy()
    ref = PCA(n_components=5, svd_solver="full").fit_transform(table.astype(np.float32).astype(np.float64))
    signs = np.sign((got * ref).sum(axis=0))
    np.testing.assert_allclose(got, ref * signs, rtol=1e-6, atol=1e-6)
    # the fixed sign: each direction's largest loading is positive (so every machine gets the same table)
    _, _, vh = np.linalg.svd(table - table.mean(0), full_matrices=False)
    loadings = np.linalg.lstsq(table - table.mean(0), got, rcond=None)[0].T  # (5, 12): the directions used
    assert all(row[np.abs(row).argmax()] > 0 for row in loadings)
    np.testing.assert_allclose(np.abs(loadings), np.abs(vh[:5]), atol=1e-5)


def test_a_wider_student_than_teacher_is_refused():
    with pytest.raises(ValueError, match="wider than the teacher's"):
        principal_rows(torch.zeros(50, 4), 8)


def test_cmow_only_has_no_table_to_initialise():
    with pytest.raises(ConfigError, match="variant cmow"):
        build(CMOWHybridConfig, {**HYBRID, "variant": "cmow"}, "model")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("embinit")
    teacher = make_tiny_bert_dir(root / "clf", num_labels=2, seed=1)
    tokens = make_classification_tokens(root / "cls", teacher, n_train=32, n_dev=16)

    def cache(name, **sig):
        cfg = build(TeacherCacheDatasetConfig, {"teacher": "t", "head": "classification", "split": "train",
                                                "max_rows": None, "signals": signals(**sig)}, "toy")
        build_teacher_cache("cls", tokens, teacher, cfg, "cpu", 16, 16, root / name, cpu_threads=1)
        return root / name

    return {"teacher": teacher, "tokens": tokens,
            "with": cache("with.zarr", logits=True, hidden_layers=[], attn_layers=[], pool=1, embeddings=True),
            "without": cache("without.zarr", logits=True, hidden_layers=[], attn_layers=[], pool=1)}


def _build(toy, tmp_path, model, store):
    run = build(TrainRunConfig, {"dataset": "toy", "teacher": "data/teacher/toy.zarr", "mlm_views": "static",
                                 "model": model, "encoding": "joint",
                                 "head": {"type": "mlp", "hidden_size": 8, "dropout": 0.0}, "objective": OBJECTIVE,
                                 "optim": OPTIM, "note": "t"}, "runs.t")
    return build_run("t", model_cfg=run.model, run=run, loader_cfg=build(LoaderConfig, LOADER, "loader"),
                     device="cpu", tokens_dir=toy["tokens"], store_path=toy[store], prepared_dir=None,
                     ckpt_dir=tmp_path / "ckpt")


@pytest.mark.parametrize("model,table", [(HYBRID, "x_cbow"), (MINIALBERT, "tok_emb")])
def test_the_students_table_starts_as_the_teachers_on_its_principal_directions(toy, tmp_path, model, table):
    run = _build(toy, tmp_path, model, "with")
    student = run.student
    # the tables served the init; no embedding loss here, so no batch derives the teacher's embedding output
    assert run.sources[0].constants.embeddings is None
    got = getattr(student, table).weight.detach().double().numpy()
    word = AutoModel.from_pretrained(toy["teacher"]).embeddings.word_embeddings.weight
    word = word.detach().double().numpy()
    width = got.shape[1]
    ref = PCA(n_components=width, svd_solver="full").fit_transform(word)
    signs = np.sign((got * ref).sum(axis=0))
    np.testing.assert_allclose(got, ref * signs, rtol=1e-4, atol=1e-6)  # the teacher's scale, not init_std's
    random = _build(toy, tmp_path / "r", {**model, "embedding_init": "random"}, "with").student
    assert not np.allclose(getattr(random, table).weight.detach().numpy(), got, atol=1e-3)


def test_a_cache_without_the_teachers_tables_is_a_clear_error(toy, tmp_path):
    with pytest.raises(TrainDataError, match="embeddings: true"):
        _build(toy, tmp_path, HYBRID, "without")
