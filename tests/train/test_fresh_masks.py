"""Fresh MLM masks each epoch (a run's ``mlm_views: fresh``, its teacher live): the masks of epoch e are the ones the
tokenize stage itself would draw as further static views, epoch 0's are the static ones, and the live teacher
scores exactly the masks the student sees. References: the tokenize stage run with more views, and the teacher's own
MLM logits on the new inputs."""

import shutil

import numpy as np
import pytest
import torch
from _tiny import signals
from datasets import Dataset, DatasetDict, load_from_disk

from distillpipe.assets import TOKENIZER_FILES, load_tokenizer, resolve_model
from distillpipe.config.base import ConfigError, build
from distillpipe.config.run import LoaderConfig
from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
from distillpipe.config.tokenize import TokenizeConfig, TokenizeMLMConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.data import schema
from distillpipe.data.collate import TrainDataError, collate
from distillpipe.data.masking import MaskingSpec, fresh_views
from distillpipe.data.tokenize import tokenize_dataset
from distillpipe.store.schema import MLM_TOPK_IDS
from distillpipe.students import load_student
from distillpipe.teacher.live import LiveSettings, live_teacher
from distillpipe.train.data import Source, teacher_targets
from distillpipe.train.loop import train_student

TEXT = ("Anarchism is a political philosophy that advocates self-governed societies based on voluntary institutions. "
        "Autism is a disorder of neural development characterized by impaired social interaction and communication. "
        "Albedo, or reflection coefficient, is the diffuse reflectivity or reflecting power of a surface. ")


def _tokenize(prepared, out, tokenizer, views):
    mlm = TokenizeMLMConfig(kind="mlm", max_seq_len=None, mask_views=views, mask_prob=0.15, mask_token_fraction=0.8,
                            random_token_fraction=0.1, seed=0, max_eval_blocks=None)
    tokenize_dataset("wiki", prepared, TokenizeConfig(str(tokenizer), 32, {"wiki": mlm}), out)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A real MLM corpus tokenized by the tokenize stage with 2 and with 6 static views, and the MiniLM teacher with
    an MLM head (random: only which positions it scores matters) whose tokenizer made them."""
    import transformers

    root = tmp_path_factory.mktemp("fresh")
    minilm = resolve_model("embedded:minilm-l6")
    teacher = root / "models" / "teacher" / "wiki"
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    transformers.BertForMaskedLM.from_pretrained(minilm, attn_implementation="eager").save_pretrained(teacher)
    for f in TOKENIZER_FILES:
        if (minilm / f).is_file():
            shutil.copy(minilm / f, teacher / f)
    docs = {"doc_id": [f"d{i}" for i in range(12)], "text": [TEXT * (1 + i % 3) for i in range(12)]}
    prepared = root / "prepared"
    DatasetDict({"train": Dataset.from_dict(docs), "dev": Dataset.from_dict(docs)}).save_to_disk(str(prepared))
    schema.write_meta(prepared, {"name": "wiki", "task_type": "corpus"})
    return {"teacher": teacher, "two": _tokenize(prepared, root / "two", teacher, 2),
            "six": _tokenize(prepared, root / "six", teacher, 6)}


def _spec(tokens):
    meta = schema.read_meta(tokens)
    p = meta["params"]
    tok = load_tokenizer(meta["tokenizer"]["spec"])[0]
    return MaskingSpec.build(mask_prob=p["mask_prob"], mask_token_fraction=p["mask_token_fraction"],
                             random_token_fraction=p["random_token_fraction"], seed=p["seed"],
                             mask_id=int(meta["tokenizer"]["mask_id"]), special_ids=tok.all_special_ids,
                             vocab_size=len(tok))


def test_epoch_e_masks_are_the_tokenize_stages_views_2e_and_2e_plus_1(corpus):
    two, six = load_from_disk(str(corpus["two"]))["train"], load_from_disk(str(corpus["six"]))["train"]
    rows = two[:]
    reference = {(b, v): i for i, (b, v) in enumerate(zip(six["block_id"], six["view"], strict=True))}
    spec = _spec(corpus["two"])
    again = fresh_views(rows, spec, "train", 2, 0)  # epoch 0: the static views themselves
    assert {k: [np.asarray(x).tolist() for x in v] for k, v in again.items()} == rows
    for epoch in (1, 2):
        got = fresh_views(rows, spec, "train", 2, epoch)
        for i, (b, v) in enumerate(zip(rows["block_id"], rows["view"], strict=True)):
            want = six[reference[(b, v + 2 * epoch)]]
            for key in ("input_ids", "masked_positions", "masked_labels"):
                assert list(got[key][i]) == list(want[key]), (epoch, b, v, key)
        assert any(list(a) != list(b) for a, b in zip(got["masked_positions"], rows["masked_positions"], strict=True))


def test_the_live_teacher_scores_the_masks_the_student_sees(corpus):
    tokens = corpus["two"]
    cfg = build(TeacherCacheDatasetConfig, {"teacher": "wiki", "head": "mlm", "split": "train", "max_rows": None,
                                            "signals": signals(mlm_topk=4, hidden_layers=[], attn_layers=[], pool=1)},
                "teacher_cache.datasets.wiki")
    live = live_teacher(LiveSettings("wiki", corpus["teacher"], cfg, 8, 8, 1), tokens, "cpu")
    kw = {"batch_size": 4, "seed": 0, "block_rows": 8, "buffer_blocks": 2, "streams": 1}
    static, fresh = Source("wiki", tokens, live, [], **kw), Source("wiki", tokens, live, [], fresh_masks=True, **kw)
    changed = 0
    for epoch in (0, 1):
        for s in (static, fresh):
            s.loader.set_epoch(epoch)
        for (rs, _), (rf, arrays) in zip(static.batches(), fresh.batches(), strict=True):
            same = rs["input_ids"] == [list(x) for x in rf["input_ids"]]
            assert same or epoch == 1, "epoch 0 is the static views"
            changed += not same
            batch, targets = collate(rf, kind="mlm", pad_id=fresh.pad_id, labeled=True, pairs=False)
            targets |= teacher_targets(arrays, batch["attention_mask"], 1)
            fresh.complete(batch, targets)
            with torch.no_grad():  # the teacher's own logits on the new inputs, at the new masks
                logits = live.model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                                    attention_mask=batch["attention_mask"].long()).logits
            pos = batch["mlm_positions"]
            for b in range(pos.shape[0]):
                for m in range(pos.shape[1]):
                    if pos[b, m] >= 0:
                        want = logits[b, pos[b, m]].topk(4).indices
                        assert torch.equal(targets[MLM_TOPK_IDS][b, m].long(), want), (epoch, b, m)
    assert changed == len(fresh.loader)  # every batch of epoch 1 had new masks


def test_a_fresh_masks_run_trains_and_is_refused_without_a_live_teacher(corpus, tmp_path):
    run = {"dataset": "wiki", "teacher": "models/teacher/wiki", "mlm_views": "fresh",
           "model": {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 4, "d_vec": 16,
                     "init_std": 0.01, "embedding_init": "random", "dropout": 0.0},
           "encoding": "joint", "head": None,
           "objective": {"loss_weights": {"hard": 0.5, "mlm_kd": 0.5}, "hidden_loss": "cosine", "layer_map": [-1],
                         "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                      "temperature_decay": False}},
           "optim": {"epochs": 2, "max_steps": None, "batch_size": 4, "lr": 1e-3, "weight_decay": 0.0,
                     "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
           "note": "fresh masks"}
    cfg = build(TeacherCacheDatasetConfig, {"teacher": "wiki", "head": "mlm", "split": "train", "max_rows": None,
                                            "signals": signals(mlm_topk=4, hidden_layers=[], attn_layers=[], pool=1)},
                "teacher_cache.datasets.wiki")
    rcfg = build(TrainRunConfig, run, "train.runs.r")
    s = train_student("r", model_cfg=rcfg.model, run=rcfg, loader_cfg=LoaderConfig(8, 2, 1), device="cpu",
                      tokens_dir=corpus["two"], store_path=LiveSettings("wiki", corpus["teacher"], cfg, 8, 8, 1),
                      prepared_dir=None, out_dir=tmp_path / "s", ckpt_dir=tmp_path / "ck", live_dir=tmp_path / "p")
    assert s.steps > 0 and np.isfinite(s.dev["mlm_loss"])
    assert load_student(tmp_path / "s", torch.device("cpu"))[1]["steps"] == s.steps
    with pytest.raises(ConfigError, match="mlm_views=fresh needs the teacher live"):
        build(TrainRunConfig, {**run, "teacher": "data/teacher/wiki.zarr"}, "train.runs.r")
    from distillpipe.teacher.cache import build_teacher_cache

    build_teacher_cache("wiki", corpus["two"], corpus["teacher"], cfg, "cpu", 8, 8, tmp_path / "c.zarr",
                        cpu_threads=1)
    with pytest.raises(TrainDataError, match="fresh MLM masks need the teacher live"):  # the Source's own check
        Source("wiki", corpus["two"], tmp_path / "c.zarr", [], batch_size=4, seed=0, block_rows=8, buffer_blocks=2,
               streams=1, fresh_masks=True)
