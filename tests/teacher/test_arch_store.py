"""Each architecture's teacher through the real build: loaded from a save_pretrained folder (DeBERTa eager, the
others sdpa), its cache written and read back equal to the model's own outputs row by row, and a student trained
a few steps from that cache."""

import numpy as np
import pytest
import torch
from _arch_tiny import LAYERS, save_hub_tokenizer, tiny_model
from _teacher_tiny import spec_for
from _tiny import make_classification_tokens, signals
from test_arch_capture import ATTENTION, EVERY

from distillpipe.config.base import build
from distillpipe.config.run import LoaderConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.store.constants import as_constants
from distillpipe.store.reader import open_store
from distillpipe.teacher.arch import model_inputs
from distillpipe.teacher.batching import collate
from distillpipe.teacher.cache import build_teacher_cache
from distillpipe.teacher.capture import capture_batch
from distillpipe.train.loop import train_student

N_TRAIN, N_DEV = 32, 8
LOADER = {"block_rows": 16, "buffer_blocks": 2, "streams": 1}
MODEL = {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 4, "d_vec": 16,
         "init_std": 0.01, "embedding_init": "random", "dropout": 0.0}
RUN = {"dataset": "toy", "teacher": "data/teacher/toy.zarr", "model": MODEL, "encoding": "joint", "mlm_views": "static",
       "head": {"type": "mlp", "hidden_size": 16, "dropout": 0.0},
       "objective": {"loss_weights": {"hard": 0.5, "soft": 0.5}, "hidden_loss": "cosine", "layer_map": [-1],
                     "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                  "temperature_decay": False}},
       "optim": {"epochs": 1, "max_steps": None, "batch_size": 8, "lr": 3e-3, "weight_decay": 0.0,
                 "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
       "note": "test"}


@pytest.mark.parametrize("family", EVERY)
def test_cache_round_trip_and_a_student_trained_from_it(family, tmp_path):
    teacher = save_hub_tokenizer(family, tmp_path / "teacher")
    model = tiny_model(family, "classification", num_labels=2)
    model.save_pretrained(teacher)
    tokens = make_classification_tokens(tmp_path / "tokens", teacher, n_train=N_TRAIN, n_dev=N_DEV)
    attn = [LAYERS] if family in ATTENTION else []
    embeddings = family != "electra_small"  # its embedding output is 16 wide: refused (test_arch_capture)
    cfg = build(TeacherCacheDatasetConfig, {"teacher": "t", "head": "classification", "split": "train",
                                            "max_rows": None, "signals": signals(logits=True, hidden_layers=[0, LAYERS],
                                                                                 attn_layers=attn, pool=2,
                                                                                 embeddings=embeddings)},
                "teacher_cache.datasets.toy")
    build_teacher_cache("toy", tokens, teacher, cfg, "cpu", 8, 16, tmp_path / "toy.zarr", cpu_threads=1)

    from datasets import load_from_disk

    rows = load_from_disk(str(tokens))["train"]
    names = ["logits", "hidden/L0", f"hidden/L{LAYERS}", *[f"attn_scores/L{j}" for j in attn]]
    store = open_store(tmp_path / "toy.zarr")
    got = store.read(names, 0, N_TRAIN)
    if embeddings:
        derive = as_constants(*store.constants(), store.manifest.signals).embeddings
    for i in (0, 11, N_TRAIN - 1):  # one row alone, no padding: the model's own eager outputs
        ids = torch.tensor([rows[i]["input_ids"]])
        one = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids)}
        with torch.no_grad():
            ref = model(**model_inputs(model, one), output_hidden_states=True, output_attentions=True)
        np.testing.assert_allclose(got["logits"][i].astype(np.float32), ref.logits[0].numpy(), rtol=2e-3, atol=2e-3)
        n = ids.shape[1]
        if embeddings:  # derived from the stored tables, equal to the model's own embedding output
            derived = derive(ids, torch.zeros_like(ids), torch.ones_like(ids, dtype=torch.bool))[0]
            torch.testing.assert_close(derived, ref.hidden_states[0][0], rtol=2e-3, atol=2e-3)
        for j in (0, LAYERS):
            h = ref.hidden_states[j][0]
            pooled = torch.stack([h[g:g + 2].mean(0) for g in range(0, n, 2)]).numpy()  # WaLDORf eq. (3)
            np.testing.assert_allclose(got[f"hidden/L{j}"][i][: len(pooled)].astype(np.float32), pooled,
                                       rtol=2e-3, atol=2e-3)
        if attn:  # the stored max-pooled scores are the capture's of this row alone (tested against eager there)
            one_row = collate([dict(rows[i])], pad_id=0)
            mine = capture_batch(model, one_row, spec_for(model, attn_layers=attn, pool=2))
            g = (n + 1) // 2
            np.testing.assert_allclose(got[f"attn_scores/L{LAYERS}"][i][:, :g, :g].astype(np.float32),
                                       mine[f"attn_scores/L{LAYERS}"][0].float().numpy(), rtol=2e-3, atol=2e-3)

    run = build(TrainRunConfig, RUN, "runs.toy")
    s = train_student("toy", model_cfg=run.model, run=run, loader_cfg=build(LoaderConfig, LOADER, "loader"),
                      device="cpu", tokens_dir=tokens, store_path=tmp_path / "toy.zarr", prepared_dir=None,
                      out_dir=tmp_path / "student", ckpt_dir=tmp_path / "student.ckpt",
                      live_dir=tmp_path / "student.live")
    assert s.steps == N_TRAIN // 8 and np.isfinite(s.dev["accuracy"])
