"""WaLDORf student: shapes for any length, padding invariance, pre-softmax scores against a reference
attention, the L/4 mask rule, gradients, overfitting one batch, and Table 1's parameter count."""

from __future__ import annotations

import math
import typing

import pytest
import torch
import torch.nn.functional as F

from distillpipe.config.base import ConfigError, build
from distillpipe.config.students import HeadConfig, WaLDORfConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.pooling import pooled_mask
from distillpipe.students.base import TaskSpec
from distillpipe.students.waldorf import WaLDORf

VOCAB = 40


def tiny_cfg(**kw) -> WaLDORfConfig:
    base = {
        "student": "waldorf",
        "embedding_size": 16,
        "conv_channels": [12, 20],
        "conv_kernel": 3,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 4,
        "d_ff": 48,
        "dropout": 0.1,
        "init_std": 0.02, "embedding_init": "random",
    }
    return WaLDORfConfig(**{**base, **kw})


def qa_task(max_seq_len: int = 128) -> TaskSpec:
    return TaskSpec(
        kind="qa", vocab_size=VOCAB, max_seq_len=max_seq_len, pad_id=0, num_labels=0, encoding="joint", head=None
    )


def make_batch(lengths: list[int], L: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded rows (pad id 0) with question (type 0) / context (type 1) segments."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), L, dtype=torch.long)
    types = torch.zeros(len(lengths), L, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        types[i, n // 3 : n] = 1
    mask = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def row(batch: dict[str, torch.Tensor], i: int, n: int) -> dict[str, torch.Tensor]:
    """Row i alone, cropped to its n real tokens."""
    return {k: v[i : i + 1, :n] for k, v in batch.items()}



@pytest.fixture
def model() -> WaLDORf:
    torch.manual_seed(0)
    return WaLDORf(tiny_cfg(), qa_task()).eval()


@pytest.mark.parametrize("L", [1, 5, 16, 17, 63, 64, 128])
def test_output_shapes(model, L):
    cfg = model.cfg
    batch = make_batch([L, max(1, L // 2)], L, seed=L)
    with torch.no_grad():
        out = model(batch)
    n = math.ceil(L / 4)
    assert out.start_logits.shape == out.end_logits.shape == (2, L)
    assert out.hidden_stride == 4
    assert len(out.hidden) == len(out.attn_scores) == cfg.n_layers
    for h, s in zip(out.hidden, out.attn_scores):
        assert h.shape == (2, n, cfg.d_model)
        assert s.shape == (2, cfg.n_heads, n, n)
    assert out.embeddings.shape == (2, L, cfg.embedding_size)
    assert all(torch.isfinite(t).all() for t in (out.start_logits, out.end_logits, *out.hidden, *out.attn_scores))


def test_padding_invariance(model):
    """A row alone (no padding at all) and the same row inside a longer, padded batch give the same outputs
    on its real positions: logits per token, hidden states and scores per real pooled position."""
    lengths = [23, 13, 6, 1]
    batch = make_batch(lengths, 23, seed=1)
    with torch.no_grad():
        out = model(batch)
        for i, n in enumerate(lengths):
            alone = model(row(batch, i, n))
            torch.testing.assert_close(out.start_logits[i, :n], alone.start_logits[0], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out.end_logits[i, :n], alone.end_logits[0], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out.embeddings[i, :n], alone.embeddings[0], atol=1e-6, rtol=1e-5)
            m = math.ceil(n / 4)
            for h, h1, s, s1 in zip(out.hidden, alone.hidden, out.attn_scores, alone.attn_scores):
                torch.testing.assert_close(h[i, :m], h1[0], atol=1e-5, rtol=1e-4)
                torch.testing.assert_close(s[i, :, :m, :m], s1[0], atol=1e-5, rtol=1e-4)


def test_padding_content_is_ignored(model):
    """What sits in padded slots (ids, types) does not change any real output."""
    batch = make_batch([9, 14], 18, seed=2)
    noisy = {k: v.clone() for k, v in batch.items()}
    pad = ~batch["attention_mask"]
    noisy["input_ids"][pad] = torch.randint(1, VOCAB, (int(pad.sum()),))
    noisy["token_type_ids"][pad] = 1
    with torch.no_grad():
        a, b = model(batch), model(noisy)
    real = batch["attention_mask"]
    torch.testing.assert_close(a.start_logits[real], b.start_logits[real])
    torch.testing.assert_close(a.end_logits[real], b.end_logits[real])


def _capture_attention(model: WaLDORf, batch):
    """(input x, key_mask, output y, scores) of every block's attention module, through forward hooks."""
    seen = []
    hooks = [
        blk.attn.register_forward_hook(lambda mod, args, out: seen.append((mod, *args, *out))) for blk in model.blocks
    ]
    with torch.no_grad():
        out = model(batch)
    for h in hooks:
        h.remove()
    return out, seen


def test_attention_mask_at_quarter_length(model):
    """A pooled position is real when any of its 4 tokens is real (the teacher's pooled_mask rule)."""
    batch = make_batch([1, 4, 5, 9, 22], 22, seed=3)
    _, seen = _capture_attention(model, batch)
    expected = pooled_mask(batch["attention_mask"], 4)  # (B, 6)
    assert expected[2].tolist() == [True, True, False, False, False, False]  # 5 tokens: groups 0-3 and 4-7
    for _, _, key_mask, _, _ in seen:
        assert torch.equal(key_mask, expected)


def test_scores_are_pre_softmax(model):
    """The returned scores are q.k/sqrt(d_head); their softmax over real keys is the attention that
    produced the block's output, checked against torch's own masked scaled_dot_product_attention."""
    batch = make_batch([21, 10, 3], 21, seed=4)
    out, seen = _capture_attention(model, batch)
    H = model.cfg.n_heads
    for j, (mod, x, key_mask, y, scores) in enumerate(seen):
        assert scores is out.attn_scores[j]
        B, n, d = x.shape
        q, k, v = (t.view(B, n, H, d // H).transpose(1, 2) for t in mod.qkv(x).split(d, dim=2))
        # not probabilities: unnormalised, signed, and padded keys are not overwritten by a fill value
        assert (scores < 0).any() and not torch.allclose(scores.sum(-1), torch.ones(()))
        torch.testing.assert_close(scores, q @ k.transpose(-2, -1) / math.sqrt(d // H))
        keys = key_mask[:, None, None, :]  # (B, 1, 1, n)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)  # (B, H, n, dh)
        ref = mod.proj(ref.transpose(1, 2).reshape(B, n, d))
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-4)
        probs = torch.softmax(scores.masked_fill(~keys, float("-inf")), dim=-1)
        mine = mod.proj((probs @ v).transpose(1, 2).reshape(B, n, d))
        torch.testing.assert_close(y, mine, atol=1e-5, rtol=1e-4)


def test_gradients_reach_every_parameter():
    torch.manual_seed(0)
    model = WaLDORf(tiny_cfg(), qa_task()).train()
    batch = make_batch([19, 11, 4], 19, seed=5)
    out = model(batch)
    target = torch.tensor([3, 7, 1])
    loss = F.cross_entropy(out.start_logits, target) + F.cross_entropy(out.end_logits, target + 1)
    loss.backward()
    dead = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not dead, f"no gradient reaches {dead}"


def test_overfits_one_qa_batch():
    """A tiny student learns the spans of one small batch (start/end argmax over real tokens)."""
    torch.manual_seed(0)
    model = WaLDORf(tiny_cfg(dropout=0.0), qa_task())
    lengths = [24, 20, 15, 9]
    batch = make_batch(lengths, 24, seed=6)
    starts = torch.tensor([5, 12, 2, 6])
    ends = torch.tensor([7, 13, 2, 8])
    mask = batch["attention_mask"]
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(120):
        out = model(batch)
        s = out.start_logits.masked_fill(~mask, float("-inf"))
        e = out.end_logits.masked_fill(~mask, float("-inf"))
        loss = F.cross_entropy(s, starts) + F.cross_entropy(e, ends)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05, loss.item()
    assert torch.equal(s.argmax(1), starts) and torch.equal(e.argmax(1), ends)


def test_classification_head():
    task = TaskSpec(
        kind="classification",
        vocab_size=VOCAB,
        max_seq_len=64,
        pad_id=0,
        num_labels=3,
        encoding="joint",
        head=HeadConfig(type="mlp", hidden_size=8, dropout=0.1),
    )
    torch.manual_seed(0)
    model = WaLDORf(tiny_cfg(), task).eval()
    assert not hasattr(model, "up_1")  # no decoder for classification
    batch = make_batch([13, 5], 13, seed=7)
    with torch.no_grad():
        out = model(batch)
        alone = model(row(batch, 1, 5))
    assert out.logits.shape == (2, 3) and out.start_logits is None
    torch.testing.assert_close(out.logits[1], alone.logits[0], atol=1e-5, rtol=1e-4)


def test_unsupported_setups_fail_clearly():
    mlm = TaskSpec(kind="mlm", vocab_size=VOCAB, max_seq_len=64, pad_id=0, num_labels=0, encoding="joint", head=None)
    with pytest.raises(ValueError, match="qa' and 'classification"):
        WaLDORf(tiny_cfg(), mlm)
    cnn = TaskSpec(
        kind="classification",
        vocab_size=VOCAB,
        max_seq_len=64,
        pad_id=0,
        num_labels=2,
        encoding="joint",
        head=HeadConfig(type="cnn", hidden_size=8, dropout=0.1),
    )
    with pytest.raises(ValueError, match="cnn"):
        WaLDORf(tiny_cfg(), cnn)
    model = WaLDORf(tiny_cfg(), qa_task(max_seq_len=16))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(make_batch([17], 17))


def test_config_checks_and_loader():
    with pytest.raises(ConfigError, match="divisible by n_heads"):
        tiny_cfg(d_model=30, n_heads=4)
    with pytest.raises(ConfigError, match="odd"):
        tiny_cfg(conv_kernel=4)
    with pytest.raises(ConfigError, match="conv_channels"):
        tiny_cfg(conv_channels=[8])
    raw = {k: getattr(tiny_cfg(), k) for k in WaLDORfConfig.__dataclass_fields__}
    student_config = typing.get_type_hints(TrainRunConfig)["model"]  # StudentConfig, forward refs resolved
    assert build(student_config, raw, "model") == tiny_cfg()  # the loader picks the variant by `student`


TABLE_1 = {
    "student": "waldorf",
    "embedding_size": 96,
    "conv_channels": [96, 192],
    "conv_kernel": 3,
    "d_model": 480,
    "n_layers": 8,
    "n_heads": 16,
    "d_ff": 1440,
    "dropout": 0.1,
    "init_std": 0.02, "embedding_init": "random",
}


def test_table_1_parameter_count():
    """Table 1 with BERT-Large-WWM's vocabulary (30,522) and 512 positions: a component-by-component
    count written out independently, and the paper's stated 24.6 M (kernel width 3 is our assumption)."""
    V, P, e, c1, c2, d, f, k, n = 30522, 512, 96, 96, 192, 480, 1440, 3, 8
    task = TaskSpec(kind="qa", vocab_size=V, max_seq_len=P, pad_id=0, num_labels=0, encoding="joint", head=None)
    with torch.device("meta"):
        model = WaLDORf(WaLDORfConfig(**TABLE_1), task)
    embeddings = V * e + P * e + 2 * e + 2 * e  # token, position, type, LayerNorm
    down = (e * c1 * k + c1) + (c1 * c2 * k + c2)  # conv_1, conv_2
    expand = c2 * d + d
    block = (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
    up = 2 * (2 * (d * d * k + d) + 2 * d)  # two stages of two convs and a LayerNorm
    head = d * 2 + 2
    expected = embeddings + down + expand + n * block + up + head
    total = sum(p.numel() for p in model.parameters())
    assert total == expected
    assert abs(total - 24.6e6) / 24.6e6 < 0.01, total  # 24,403,202
