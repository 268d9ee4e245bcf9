"""Classification heads: shapes, gradients, a toy fit, channel layout and the paper's parameter counts."""

import pytest
import torch

from distillpipe.config.students import HeadConfig
from distillpipe.students.heads import build_head, diffcat


def head_cfg(kind, hidden=16, dropout=0.0):
    return HeadConfig(type=kind, hidden_size=hidden, dropout=dropout)


def n_params(module):
    return sum(p.numel() for p in module.parameters())


D, F, B, L, DTOK = 4, 32, 24, 6, 8  # matrix side, seq features (2 channels of 4x4), batch, length, token features


def toy_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randn(B, F, generator=g)
    tokens = torch.randn(B, L, DTOK, generator=g)
    lengths = torch.randint(2, L + 1, (B,), generator=g)
    mask = torch.arange(L)[None] < lengths[:, None]
    return seq, tokens * mask[..., None], mask


def build(kind, pairs=False, num_labels=3):
    return build_head(head_cfg(kind), F, num_labels, token_features=DTOK, matrix_side=D, pairs=pairs)


@pytest.mark.parametrize("kind", ["linear", "mlp", "cnn", "bilstm"])
@pytest.mark.parametrize("pairs", [False, True])
def test_shape_and_gradients(kind, pairs):
    torch.manual_seed(0)
    head = build(kind, pairs)
    seq, tokens, mask = toy_inputs()
    pair = toy_inputs(seed=1) if pairs else None
    logits = head(seq, tokens, mask, pair=pair)
    assert logits.shape == (B, 3)
    logits.square().sum().backward()
    for name, p in head.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("kind", ["linear", "mlp", "cnn", "bilstm"])
def test_fits_a_separable_toy_problem(kind):
    torch.manual_seed(0)
    head = build(kind, num_labels=2)
    seq, tokens, mask = toy_inputs()
    # linearly separable: the sign of a fixed direction (of the pooled encoding / of the first token)
    y = (seq[:, :8].sum(1) > 0).long() if kind != "bilstm" else (tokens[:, 0, :4].sum(1) > 0).long()
    opt = torch.optim.Adam(head.parameters(), lr=2e-2)
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(head(seq, tokens, mask), y)
        loss.backward()
        opt.step()
    head.eval()
    acc = (head(seq, tokens, mask).argmax(1) == y).float().mean().item()
    assert acc >= 0.95, (kind, acc)


def test_diffcat_formula():
    a, b = torch.tensor([[1.0, -2.0]]), torch.tensor([[3.0, -1.0]])
    assert diffcat(a, b).tolist() == [[1.0, -2.0, 2.0, 1.0, 3.0, -1.0]]


@pytest.mark.parametrize("kind", ["linear", "mlp", "bilstm"])
def test_pair_classifies_diffcat_of_separately_pooled(kind):
    torch.manual_seed(0)
    head = build(kind, pairs=True).eval()
    A, Bq = toy_inputs(0), toy_inputs(1)
    seen = {}
    head.classifier.register_forward_pre_hook(lambda m, inp: seen.setdefault("x", inp[0]))
    head(*A, pair=Bq)
    u_a, u_b = head.pool(*A), head.pool(*Bq)
    torch.testing.assert_close(seen["x"], torch.cat([u_a, (u_a - u_b).abs(), u_b], dim=-1))


def test_cnn_channels_are_the_matrices():
    """Channel c of the CNN input is the c-th d x d block of the encoding; the CBOW rest is zero-filled."""
    torch.manual_seed(0)
    in_features = 2 * D * D + 8  # two matrices and an 8-dim CBOW sum
    for pairs, parts in ((False, 1), (True, 3)):
        head = build_head(head_cfg("cnn"), in_features, 2, token_features=DTOK, matrix_side=D, pairs=pairs).eval()
        seen = {}
        head.classifier.net[0].register_forward_pre_hook(lambda m, inp, seen=seen: seen.setdefault("x", inp[0]))
        mats = torch.randn(parts, 2, 2, D, D)
        vec = torch.randn(parts, 2, 8)
        feats = torch.cat([mats.flatten(2), vec], dim=-1)  # (parts, 2, in_features): parts is DiffCat a, |a-b|, b
        head.classifier(feats.permute(1, 0, 2).reshape(2, parts * in_features))
        grid = seen["x"]  # (2, parts * 3, D, D)
        assert grid.shape == (2, parts * 3, D, D)
        for k in range(parts):
            torch.testing.assert_close(grid[:, 3 * k], mats[k, :, 0])
            torch.testing.assert_close(grid[:, 3 * k + 1], mats[k, :, 1])
            torch.testing.assert_close(grid[:, 3 * k + 2].flatten(1)[:, :8], vec[k])
            assert (grid[:, 3 * k + 2].flatten(1)[:, 8:] == 0).all()


def test_paper_parameter_counts():
    """CMOW paper, Table XIII (DiffCat, 2 classes), classifier only: bidirectional hybrid (d=20, d_vec=400,
    1200 features) MLP 3,605,002 (1,000 hidden units) and CNN 11,764; unidirectional hybrid CNN 7,390."""
    mlp = build_head(head_cfg("mlp", hidden=1000), 1200, 2, token_features=1600, matrix_side=20, pairs=True)
    assert n_params(mlp) == 3_605_002
    cnn = build_head(head_cfg("cnn"), 1200, 2, token_features=1600, matrix_side=20, pairs=True)
    assert n_params(cnn) == 11_764
    cnn_uni = build_head(head_cfg("cnn"), 800, 2, token_features=800, matrix_side=20, pairs=True)
    assert n_params(cnn_uni) == 7_390


def test_bilstm_ignores_padding():
    torch.manual_seed(0)
    head = build("bilstm").eval()
    _, tokens, mask = toy_inputs()
    row = 0
    n = int(mask[row].sum())
    alone = head.pool(None, tokens[row : row + 1, :n], mask[row : row + 1, :n])
    noisy = tokens.clone()
    noisy[~mask] = 7.0  # garbage at pad positions must not matter
    batched = head.pool(None, noisy, mask)[row : row + 1]
    torch.testing.assert_close(alone, batched)


def test_errors_a_user_can_act_on():
    with pytest.raises(ValueError, match="needs CMOW matrices"):
        build_head(head_cfg("cnn"), 16, 2, token_features=16, matrix_side=None, pairs=False)
    with pytest.raises(ValueError, match="too small"):
        build_head(head_cfg("cnn"), 8, 2, token_features=8, matrix_side=2, pairs=False)
    head = build("bilstm")
    seq, tokens, mask = toy_inputs()
    with pytest.raises(ValueError, match="right-padded"):
        head(seq, tokens, mask.flip(1))
