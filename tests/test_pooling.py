"""Pooling against naive loops over WaLDORf eqs. (3) and (5), with masking and L not divisible by p."""

import math

import pytest
import torch

from distillpipe.pooling import SCORE_MASKED, avg_pool_seq, max_pool_scores, pooled_mask


def naive_avg_pool(h, mask, p):
    """Eq. (3) with masking: mean of the valid positions of each group of p; empty group -> 0, invalid."""
    B, L, d = h.shape
    n = math.ceil(L / p)
    out, valid = torch.zeros(B, n, d, dtype=torch.float64), torch.zeros(B, n, dtype=torch.bool)
    for b in range(B):
        for a in range(n):
            picked = [h[b, a * p + kx].double() for kx in range(p) if a * p + kx < L and mask[b, a * p + kx]]
            if picked:
                out[b, a] = sum(picked) / len(picked)
                valid[b, a] = True
    return out, valid


def naive_max_pool(scores, mask, p):
    """Eq. (5) with masking: max over valid (query, key) pairs of each p x p block; none -> -inf."""
    B, H, L, _ = scores.shape
    n = math.ceil(L / p)
    out = torch.full((B, H, n, n), float("-inf"), dtype=torch.float64)
    valid = torch.zeros(B, n, n, dtype=torch.bool)
    for b in range(B):
        for a in range(n):
            for c in range(n):
                for h in range(H):
                    best = None
                    for kx in range(p):
                        for ky in range(p):
                            qi, ki = a * p + kx, c * p + ky
                            if qi < L and ki < L and mask[b, qi] and mask[b, ki]:
                                v = float(scores[b, h, qi, ki])
                                best = v if best is None else max(best, v)
                    if best is not None:
                        out[b, h, a, c] = best
                        valid[b, a, c] = True
    return out, valid


def masks(B, L, seed):
    """Right-padded rows (one empty, one full) plus one arbitrary (non-contiguous) mask."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    lengths[0], lengths[1] = L, 0
    m = torch.arange(L)[None, :] < lengths[:, None]
    m[2] = torch.rand(L, generator=g) < 0.5
    return m


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("L", [8, 10, 13])
def test_avg_pool_matches_naive_loop(p, L):
    g = torch.Generator().manual_seed(L * 10 + p)
    h = torch.randn(5, L, 6, generator=g)
    mask = masks(5, L, seed=p + L)
    h[~mask] = float("nan")  # padding states must not leak into any average
    pooled, valid = avg_pool_seq(h, mask, p)
    ref, ref_valid = naive_avg_pool(h, mask, p)
    assert pooled.shape == (5, math.ceil(L / p), 6) and pooled.dtype == h.dtype
    assert torch.equal(valid, ref_valid)
    torch.testing.assert_close(pooled.double(), ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(pooled_mask(mask, p), ref_valid)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("L", [8, 10, 13])
def test_max_pool_scores_matches_naive_loop(p, L):
    g = torch.Generator().manual_seed(L * 10 + p)
    scores = torch.randn(4, 3, L, L, generator=g) * 5
    mask = masks(4, L, seed=p * L)
    # Padding carries the largest values: any leak of a padded query or key into the max shows.
    pair = mask[:, None, :, None] & mask[:, None, None, :]
    scores = scores.masked_fill(~pair, 1e4)
    pooled, valid = max_pool_scores(scores, mask, p)
    ref, ref_valid = naive_max_pool(scores, mask, p)
    assert pooled.shape == (4, 3, math.ceil(L / p), math.ceil(L / p))
    assert torch.equal(valid, ref_valid)
    assert torch.equal(pooled.double(), ref)  # max is exact, -inf where the block has no valid pair
    assert torch.all(pooled[~valid[:, None].expand_as(pooled)] == SCORE_MASKED)


def test_inplace_max_pool_equals_out_of_place():
    scores = torch.randn(2, 2, 9, 9)
    mask = torch.arange(9)[None, :] < torch.tensor([[9], [5]])
    ref, _ = max_pool_scores(scores, mask, 4)
    work = scores.clone()
    got, _ = max_pool_scores(work, mask, 4, inplace=True)
    assert torch.equal(got, ref)


def test_p1_is_identity_on_valid_entries():
    h, s = torch.randn(3, 7, 4), torch.randn(3, 2, 7, 7)
    mask = torch.arange(7)[None, :] < torch.tensor([[7], [4], [1]])
    ph, vh = avg_pool_seq(h, mask, 1)
    assert torch.equal(vh, mask) and torch.equal(ph[mask], h[mask]) and torch.all(ph[~mask] == 0)
    ps, vs = max_pool_scores(s, mask, 1)
    pair = mask[:, :, None] & mask[:, None, :]
    assert torch.equal(vs, pair)
    assert torch.equal(ps[pair[:, None].expand_as(s)], s[pair[:, None].expand_as(s)])


def test_pooling_is_differentiable_for_student_losses():
    """Students pool their own outputs with the same functions: a masked loss has finite gradients."""
    h = torch.randn(2, 10, 4, requires_grad=True)
    s = torch.randn(2, 2, 10, 10, requires_grad=True)
    mask = torch.arange(10)[None, :] < torch.tensor([[10], [3]])
    ph, vh = avg_pool_seq(h, mask, 4)
    ps, vs = max_pool_scores(s, mask, 4)
    target = torch.zeros_like(ps)
    loss = ph[vh].pow(2).mean() + (ps - target)[vs[:, None].expand_as(ps)].pow(2).mean()
    loss.backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(s.grad).all()
    assert torch.all(h.grad[~mask] == 0) and h.grad[mask].abs().sum() > 0
    pair = mask[:, None, :, None] & mask[:, None, None, :]
    assert torch.all(s.grad[~pair.expand_as(s)] == 0) and s.grad.abs().sum() > 0


def test_bad_pool_factor_is_refused():
    with pytest.raises(ValueError, match="p must be >= 1"):
        avg_pool_seq(torch.zeros(1, 4, 2), torch.ones(1, 4, dtype=torch.bool), 0)
