"""MiniALBERT student: the paper's Table 1 sizes, shapes of every output, weight sharing across iterations,
and adapter tuning through the real loop (only adapters and head move)."""

import pytest
import torch
from _tiny import make_classification_store

from distillpipe.config.base import build
from distillpipe.config.finetune import FinetuneRunConfig
from distillpipe.config.run import LoaderConfig
from distillpipe.config.students import HeadConfig, MiniALBERTConfig
from distillpipe.students import build_student, load_student, save_student
from distillpipe.students.base import TaskSpec, is_adapter
from distillpipe.train.loop import train_student

V_BERT = 30522
TINY = {"student": "minialbert", "embedding_size": 16, "d_model": 32, "n_heads": 4, "d_ff": 64, "n_iterations": 3,
        "adapter_size": 8, "max_position_embeddings": 64, "dropout": 0.0, "init_std": 0.02, "embedding_init": "random"}


def cfg(**over) -> MiniALBERTConfig:
    return build(MiniALBERTConfig, {**TINY, **over}, "model")


def mlm_task(vocab=65, max_len=32):
    return TaskSpec(kind="mlm", vocab_size=vocab, max_seq_len=max_len, pad_id=0, num_labels=0, encoding="joint",
                    head=None)


def cls_task(encoding="joint", head="linear"):
    return TaskSpec(kind="classification", vocab_size=65, max_seq_len=32, pad_id=0, num_labels=3, encoding=encoding,
                    head=HeadConfig(head, 16, 0.0))


def batch(B=3, L=10, M=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 65, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, 7:] = False
    ids[~mask] = 0
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask,
            "mlm_positions": torch.tensor([[1, 3], [2, -1], [4, 5]])[:B, :M]}


def encoder_params(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("mlm_head.", "head.")))


# --- Table 1 ------------------------------------------------------------------------------------------------------

PAPER = [  # (embedding rank r, adapters, Table 1 #Params in millions)
    (768, False, 31), (312, False, 17), (768, True, 32), (312, True, 18), (128, True, 12)]


def independent_count(r: int, adapters: bool, d=768, ff=3072, V=V_BERT, P=512, n=6, a=48) -> int:
    emb = V * r + P * r + 2 * r + 2 * r  # token, position, type embeddings, LayerNorm
    proj = r * d + d if r != d else 0  # eq. (5)'s W_e, absent without factorisation
    layer = 4 * (d * d + d) + 2 * d + (d * ff + ff) + (ff * d + d) + 2 * d  # q k v o, LN, FFN, LN
    adapter = (d * a + a) + (a * d + d) + 2 * d  # down, up, LayerNorm
    return emb + proj + layer + (2 * n * adapter if adapters else 0)


@pytest.mark.parametrize(("r", "adapters", "paper_m"), PAPER)
def test_table1_parameter_counts(r, adapters, paper_m):
    """BERT-base teacher sizes (d 768, 12 heads, d_ff 3072, 6 iterations, adapters d/16 = 48, 512 positions):
    the encoder (Table 1 counts no MLM head) matches a count written out by hand and the paper's #Params."""
    c = cfg(embedding_size=r, d_model=768, n_heads=12, d_ff=3072, n_iterations=6, adapter_size=48 if adapters else 0,
            max_position_embeddings=512)
    n = encoder_params(build_student(c, mlm_task(V_BERT, 256)))
    assert n == independent_count(r, adapters)
    assert round(n / 1e6) == paper_m


def test_adapter_tuning_trains_the_paper_s_0_9m():
    """Table 1's dagger rows: 0.9M tunable parameters (the 12 adapters; plus a 2-class linear head)."""
    c = cfg(embedding_size=128, d_model=768, n_heads=12, d_ff=3072, n_iterations=6, adapter_size=48,
            max_position_embeddings=512)
    m = build_student(c, TaskSpec(kind="classification", vocab_size=V_BERT, max_seq_len=128, pad_id=0, num_labels=2,
                                  encoding="joint", head=HeadConfig("linear", 1, 0.0)))
    adapters = sum(p.numel() for n, p in m.named_parameters() if is_adapter(n))
    assert adapters == 912_960 and round(adapters / 1e5) == 9


# --- shapes and sharing -------------------------------------------------------------------------------------------

def test_outputs_have_one_hidden_state_and_score_map_per_iteration():
    m = build_student(cfg(), mlm_task()).eval()
    out = m(batch())
    assert out.mlm_logits.shape == (3, 2, 65) and out.hidden_stride == 1
    assert len(out.hidden) == len(out.attn_scores) == 3
    assert all(h.shape == (3, 10, 32) for h in out.hidden)
    assert all(s.shape == (3, 4, 10, 10) for s in out.attn_scores)
    # the MLM decoder is the token embedding (ALBERT's tie): no separate V x r matrix
    assert not any(p.shape == (65, 16) for n, p in m.named_parameters() if n.startswith("mlm_head"))
    out.mlm_logits.sum().backward()
    assert m.tok_emb.weight.grad.abs().sum() > 0
    # padding does not leak: row 0's real tokens give the same states alone as in the padded batch
    b = batch()
    alone = {k: (v[:1, :7] if k != "mlm_positions" else v[:1]) for k, v in b.items()}
    torch.testing.assert_close(m(alone).hidden[-1][0], m(b).hidden[-1][0, :7], atol=1e-5, rtol=1e-5)


def test_classification_joint_and_diffcat():
    b = batch()
    m = build_student(cfg(), cls_task()).eval()
    out = m(b)
    assert out.logits.shape == (3, 3) and len(out.hidden) == 3
    pair = {"a_input_ids": b["input_ids"], "a_attention_mask": b["attention_mask"],
            "b_input_ids": b["input_ids"][:, :6], "b_attention_mask": b["attention_mask"][:, :6]}
    d = build_student(cfg(), cls_task("diffcat", "mlp")).eval()
    assert d(pair).logits.shape == (3, 3)


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        build_student(cfg(), mlm_task(max_len=128))
    m = build_student(cfg(max_position_embeddings=8), mlm_task(max_len=8))
    with pytest.raises(ValueError, match="exceeds the MiniALBERT student's max_position_embeddings 8"):
        m(batch())
    qa = TaskSpec(kind="qa", vocab_size=65, max_seq_len=32, pad_id=0, num_labels=0, encoding="joint", head=None)
    with pytest.raises(ValueError, match="not 'qa'"):
        build_student(cfg(), qa)


@pytest.mark.parametrize("adapter_size", [0, 8])
def test_one_shared_layer_applied_n_times(adapter_size):
    """Eq. (2)/(4): the parameter count does not grow with the iterations (but for the adapters), every
    iteration is the same layer applied to the previous output, and perturbing that layer changes them all."""
    counts = {n: encoder_params(build_student(cfg(n_iterations=n, adapter_size=adapter_size), mlm_task()))
              for n in (1, 3, 6)}
    per_adapter_pair = 2 * ((32 * 8 + 8) + (8 * 32 + 32) + 2 * 32) if adapter_size else 0
    assert counts[3] - counts[1] == 2 * per_adapter_pair and counts[6] - counts[3] == 3 * per_adapter_pair
    m = build_student(cfg(adapter_size=adapter_size), mlm_task()).eval()
    b = batch()
    mask = b["attention_mask"]
    with torch.no_grad():
        out = m(b)
        for i in range(1, 3):  # O_i = f_mlp(phi_mlp^i(f_att(phi_att^i(O_{i-1})))), by hand
            x = out.hidden[i - 1]
            if adapter_size:
                x = m.adapters_att[i](x)
            x, s = m.layer.f_att(x, mask)
            if adapter_size:
                x = m.adapters_mlp[i](x)
            torch.testing.assert_close(m.layer.f_mlp(x), out.hidden[i])
            torch.testing.assert_close(s, out.attn_scores[i])
        m.layer.ffn.weight.add_(0.05 * torch.randn_like(m.layer.ffn.weight))
        after = m(b)
    for h0, h1 in zip(out.hidden, after.hidden, strict=True):
        assert (h0 - h1)[mask].abs().max() > 1e-4


# --- adapter tuning through the loop -----------------------------------------------------------------------------

def test_adapter_tuning_moves_only_adapters_and_head(tmp_path):
    """A general-distilled MiniALBERT (saved like the train stage does) fine-tuned with tune: adapters by the real
    loop: after real steps every encoder tensor but the adapters is bit-identical to the init."""
    data = make_classification_store(tmp_path)
    init = build_student(cfg(), mlm_task(max_len=32))
    save_student(tmp_path / "init", init, cfg(), mlm_task(max_len=32), {"name": "init", "note": ""})
    run = build(FinetuneRunConfig, {
        "init": "init", "student": "minialbert", "tune": "adapters", "dataset": "toy", "encoding": "joint",
        "teacher": "data/teacher/toy.zarr",
        "head": {"type": "linear", "hidden_size": 1, "dropout": 0.0},
        "objective": {"loss_weights": {"hard": 1.0}, "hidden_loss": "cosine", "layer_map": [-1, -1, -1],
                      "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                   "temperature_decay": False}},
        "optim": {"epochs": 1, "max_steps": 6, "batch_size": 8, "lr": 1e-2, "weight_decay": 0.01,
                  "max_grad_norm": 1.0, "eval_every": 0, "patience": None, "checkpoint_minutes": 10, "seed": 0},
        "note": "adapters"}, "finetune.runs.a")
    train_student("a", model_cfg=cfg(), run=run, loader_cfg=LoaderConfig(32, 2, 1), device="cpu",
                  tokens_dir=data["tokens"], store_path=data["store"], prepared_dir=None, out_dir=tmp_path / "a",
                  ckpt_dir=tmp_path / "ck", live_dir=tmp_path / "p",
                  init_dir=tmp_path / "init")
    tuned, record = load_student(tmp_path / "a", torch.device("cpu"))
    before = init.state_dict()
    moved = {n for n, v in tuned.state_dict().items() if n in before and not torch.equal(v, before[n])}
    assert moved and all(is_adapter(n) for n in moved), sorted(moved)[:5]
    assert {n for n in before if n.startswith("adapters_")} <= moved  # every adapter trained
    n_adapters = sum(p.numel() for n, p in tuned.named_parameters() if is_adapter(n))
    n_head = sum(p.numel() for n, p in tuned.named_parameters() if n.startswith("head."))
    assert record["trainable_params"] == n_adapters + n_head
