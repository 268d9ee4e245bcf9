"""Each loss against its formula written out independently (numpy float64 loops on tiny cases),
masking (masked entries, including the teacher cache's -inf, change nothing and gradients stay
finite), T^2 scaling, and top-k KD against full soft CE."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from distillpipe import losses
from distillpipe.pooling import avg_pool_seq, max_pool_scores, pooled_mask


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _lengths_mask(lengths: list[int], L: int) -> torch.Tensor:
    return torch.tensor([[i < n for i in range(L)] for n in lengths])


# ------------------------------------------------------------------------------------------------
# output-layer losses
# ------------------------------------------------------------------------------------------------


def test_hard_ce_matches_loop_and_ignores_rows():
    logits = torch.randn(5, 4, generator=_gen(0))
    labels = torch.tensor([2, -100, 0, 3, -100])
    want = np.mean([-math.log(_np_softmax(logits[i].double().numpy())[labels[i]]) for i in (0, 2, 3)])
    assert losses.hard_ce(logits, labels, -100).item() == pytest.approx(want, rel=1e-5)
    # an ignored row's logits do not matter
    logits2 = logits.clone()
    logits2[1] = 1e4
    assert losses.hard_ce(logits2, labels, -100).item() == pytest.approx(want, rel=1e-5)
    # nothing to learn from: 0, not nan, and still differentiable
    x = logits.clone().requires_grad_()
    out = losses.hard_ce(x, torch.full((5,), -100), -100)
    out.backward()
    assert out.item() == 0.0 and torch.all(x.grad == 0)


@pytest.mark.parametrize("T", [1.0, 2.5])
def test_soft_kl_matches_formula_and_is_the_cross_entropy_less_the_teacher_entropy(T):
    s, t = torch.randn(3, 5, generator=_gen(1)), torch.randn(3, 5, generator=_gen(2)) * 3
    kl, ce = [], []
    for i in range(3):
        p = _np_softmax(t[i].double().numpy() / T)
        q = _np_softmax(s[i].double().numpy() / T)
        kl.append(sum(p[c] * math.log(p[c] / q[c]) for c in range(5)))
        ce.append(-sum(p[c] * math.log(q[c]) for c in range(5)))
    got = losses.soft_kl(s, t, T).item()
    assert got == pytest.approx(T * T * np.mean(kl), rel=1e-5)
    entropy = np.mean([-(p * np.log(p)).sum() for p in (_np_softmax(r.double().numpy() / T) for r in t)])
    assert got == pytest.approx(T * T * (np.mean(ce) - entropy), rel=1e-5)  # the papers' CE, less a constant
    assert losses.soft_kl(t, t, T).item() == pytest.approx(0.0, abs=1e-6)  # a perfect student logs 0


def test_soft_kl_t2_scaling_keeps_gradient_scale():
    """Hinton: d(CE at T)/ds ~ (s - t) / (T^2 C) for large T, so the T^2 factor makes the gradient
    independent of T, tending to ((s - mean s) - (t - mean t)) / (C N) (N rows of the mean)."""
    s, t = torch.randn(4, 6, generator=_gen(3)), torch.randn(4, 6, generator=_gen(4))
    s, t = s - s.mean(-1, keepdim=True), t - t.mean(-1, keepdim=True)
    grads = {}
    for T in (1.0, 500.0, 1000.0):
        x = s.clone().requires_grad_()
        losses.soft_kl(x, t, T).backward()
        grads[T] = x.grad
    limit = (s - t) / (6 * 4)
    torch.testing.assert_close(grads[1000.0], limit, rtol=0.01, atol=2e-4)  # O(1/T) from the limit
    ratio = grads[500.0].norm() / grads[1000.0].norm()
    assert ratio.item() == pytest.approx(1.0, abs=0.01)
    # without the factor the ratio would be 4 (= (1000/500)^2); at T=1 the gradient is softmax(s) - softmax(t)
    torch.testing.assert_close(grads[1.0], (s.softmax(-1) - t.softmax(-1)) / 4)


def _topk_inputs(teacher: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    vals, ids = teacher.topk(k, dim=-1)
    return ids, vals, torch.logsumexp(teacher, dim=-1)


@pytest.mark.parametrize("T", [1.0, 2.0, 0.5])
def test_topk_kd_equals_soft_kl_when_k_is_v(T):
    V = 7
    s, t = torch.randn(4, V, generator=_gen(5)), torch.randn(4, V, generator=_gen(6)) * 2
    ids, vals, lse = _topk_inputs(t, V)
    got = losses.topk_kd(s, ids, vals, lse, T)
    torch.testing.assert_close(got, losses.soft_kl(s, t, T), rtol=1e-5, atol=1e-6)


def _np_topk_kd(s: np.ndarray, ids: np.ndarray, tl: np.ndarray, lse: np.ndarray, T: float) -> float:
    """k+1 buckets: top-k tokens and one tail, tempered bucket-wise (the documented T != 1 rule)."""
    rows = []
    for i in range(s.shape[0]):
        p_top = np.exp(tl[i] - lse[i])
        p = np.append(p_top, max(1.0 - p_top.sum(), 0.0))
        q_full = _np_softmax(s[i])
        q_top = q_full[ids[i]]
        q = np.append(q_top, q_full[[j for j in range(s.shape[1]) if j not in set(ids[i])]].sum())
        with np.errstate(divide="ignore"):
            pt = _np_softmax(np.log(p) / T)
        qt = _np_softmax(np.log(q) / T)
        rows.append(sum(a * math.log(a / b) for a, b in zip(pt, qt) if a > 0))
    return T * T * float(np.mean(rows))


@pytest.mark.parametrize("T", [1.0, 3.0])
def test_topk_kd_tail_bucket_matches_formula(T):
    V, k = 9, 3
    s, t = torch.randn(5, V, generator=_gen(7)), torch.randn(5, V, generator=_gen(8)) * 2
    ids, vals, lse = _topk_inputs(t, k)
    want = _np_topk_kd(s.double().numpy(), ids.numpy(), vals.double().numpy(), lse.double().numpy(), T)
    assert losses.topk_kd(s, ids, vals, lse, T).item() == pytest.approx(want, rel=1e-5)
    # at T = 1 this is the KL of the full distributions with the tail merged into one bucket
    if T == 1.0:
        p, q = t.double().softmax(-1), s.double().softmax(-1)
        tail = torch.ones_like(p, dtype=torch.bool).scatter_(1, ids, False)
        p_tail, q_tail = (p * tail).sum(-1), (q * tail).sum(-1)
        kl = (p.gather(1, ids) * (p.gather(1, ids) / q.gather(1, ids)).log()).sum(-1) + p_tail * (p_tail / q_tail).log()
        assert want == pytest.approx(kl.mean().item(), rel=1e-6)


def test_topk_kd_tail_mass_behaves():
    V, k = 10, 4
    t = torch.randn(3, V, generator=_gen(9)) * 2
    ids, vals, lse = _topk_inputs(t, k)
    # a student equal to the teacher is a minimum: zero gradient, at T = 1 and T != 1
    for T in (1.0, 2.0):
        x = t.clone().requires_grad_()
        losses.topk_kd(x, ids, vals, lse, T).backward()
        torch.testing.assert_close(x.grad, torch.zeros_like(x.grad), atol=1e-6, rtol=0)
    # only the student's total tail mass matters, not how it is spread over the tail
    s = torch.randn(3, V, generator=_gen(10))
    tail_ids = [[j for j in range(V) if j not in set(r.tolist())] for r in ids]
    s_perm = s.clone()
    for i, tails in enumerate(tail_ids):
        s_perm[i, tails] = s[i, tails].flip(0)
    torch.testing.assert_close(losses.topk_kd(s, ids, vals, lse, 1.0), losses.topk_kd(s_perm, ids, vals, lse, 1.0))
    # a student putting more mass on the tail than the teacher has is pushed back: the gradient
    # on a tail logit is positive (descent lowers it) exactly when q_tail > p_tail
    s_tail = t.clone()
    s_tail[0, tail_ids[0][0]] += 5.0
    x = s_tail.requires_grad_()
    losses.topk_kd(x, ids, vals, lse, 1.0).backward()
    assert x.grad[0, tail_ids[0][0]] > 0
    # float16 cache dtypes are accepted; tail mass clamps at 0 when the top-k logits overshoot
    out = losses.topk_kd(s, ids, vals.half(), lse, 1.0)
    assert torch.isfinite(out)
    out = losses.topk_kd(s, ids, vals + 1.0, lse, 1.0)  # sum p > 1: tail bucket 0, still finite
    assert torch.isfinite(out)


def test_topk_kd_empty_is_zero():
    s = torch.randn(0, 6, requires_grad=True)
    out = losses.topk_kd(s, torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 2), torch.zeros(0), 1.0)
    assert out.item() == 0.0


def test_span_ce_hand_case():
    # L = 4, last position padded; position 0 = [CLS] = no answer
    start = torch.tensor([[1.0, 2.0, 0.0, 50.0], [0.0, 0.0, 0.0, 0.0]])
    end = torch.tensor([[0.0, 0.0, 3.0, -7.0], [2.0, 1.0, 0.0, 9.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, False]])
    sp, ep = torch.tensor([1, 0]), torch.tensor([2, 0])
    ce_s = [-(2.0 - math.log(math.e + math.e**2 + 1)), -math.log(1 / 3)]
    ce_e = [-(3.0 - math.log(2 + math.e**3)), -(2.0 - math.log(math.e**2 + math.e + 1))]
    want = 0.5 * (np.mean(ce_s) + np.mean(ce_e))
    assert losses.span_ce(start, end, sp, ep, mask).item() == pytest.approx(want, rel=1e-6)
    # padded logits (here 50 and 9) are out of the softmax: changing them changes nothing
    start2, end2 = start.clone(), end.clone()
    start2[:, 3], end2[:, 3] = float("inf"), float("nan")
    x = start2.requires_grad_()
    out = losses.span_ce(x, end2, sp, ep, mask)
    out.backward()
    assert out.item() == pytest.approx(want, rel=1e-6) and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("T", [1.0, 2.0])
def test_span_kd_matches_loop(T):
    B, L = 3, 6
    g = _gen(11)
    s_st, s_en, t_st, t_en = (torch.randn(B, L, generator=g) for _ in range(4))
    mask = _lengths_mask([6, 4, 1], L)
    want = 0.0
    for s, t in ((s_st, t_st), (s_en, t_en)):
        rows = []
        for b in range(B):
            n = int(mask[b].sum())
            p = _np_softmax(t[b, :n].double().numpy() / T)
            q = _np_softmax(s[b, :n].double().numpy() / T)
            rows.append((p * np.log(p / q)).sum())
        want += 0.5 * T * T * np.mean(rows)
    assert losses.span_kd(s_st, s_en, t_st, t_en, mask, T).item() == pytest.approx(want, rel=1e-5)
    # masked teacher/student entries do not matter, gradients finite
    t_st2, s_st2 = t_st.clone(), s_st.clone()
    t_st2[~mask], s_st2[~mask] = float("-inf"), 1e30
    x = s_st2.requires_grad_()
    out = losses.span_kd(x, s_en, t_st2, t_en, mask, T)
    out.backward()
    assert out.item() == pytest.approx(want, rel=1e-5)
    assert torch.isfinite(x.grad).all() and torch.all(x.grad[~mask] == 0)


def test_continuous_cosine_hand_case():
    pred = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    target = torch.tensor([[0.0, 1.0], [2.0, 2.0], [-3.0, 0.0]])
    # distances 1, 0, 2
    assert losses.continuous_cosine(pred, target).item() == pytest.approx(1.0, abs=1e-6)


# ------------------------------------------------------------------------------------------------
# intermediate-layer losses
# ------------------------------------------------------------------------------------------------


def test_hidden_mse_and_cosine_match_loops_and_ignore_masked():
    B, L, d = 3, 5, 4
    g = _gen(12)
    s, t = torch.randn(B, L, d, generator=g), torch.randn(B, L, d, generator=g)
    mask = _lengths_mask([5, 2, 3], L)
    sq, cos = [], []
    for b in range(B):
        for i in range(L):
            if mask[b, i]:
                u, v = s[b, i].double().numpy(), t[b, i].double().numpy()
                sq.extend((u - v) ** 2)
                cos.append(1 - u @ v / np.linalg.norm(u) / np.linalg.norm(v))
    t_bad = t.clone()
    t_bad[~mask] = float("-inf")  # what a forgotten mask would learn from
    t_bad[2, 4, 0] = float("nan")
    for fn, want in (
        (losses.hidden_mse, np.mean(sq)),
        (losses.embedding_mse, np.mean(sq)),
        (losses.hidden_cosine, np.mean(cos)),
    ):
        assert fn(s, t, mask).item() == pytest.approx(want, rel=1e-5)
        x = s.clone()
        x[~mask] = float("inf")
        x.requires_grad_()
        out = fn(x, t_bad, mask)
        out.backward()
        assert out.item() == pytest.approx(want, rel=1e-5)
        assert torch.isfinite(x.grad).all() and torch.all(x.grad[~mask] == 0)


def test_subspace_losses_are_the_full_losses_seen_in_the_subspace():
    """A teacher state t = mu + U c + e (e orthogonal to U, what the cache left out): the subspace MSE is the full MSE
    less the out-of-subspace part, ||(I - U U^T)(s - mu) - e||^2 / d; the subspace cosine is the cosine of the student
    and the teacher both put in mu + span(U) (a loop in float64); and no gradient reaches the student's part outside
    the subspace."""
    B, L, d, r = 3, 5, 7, 3
    g = _gen(21)
    u = torch.linalg.qr(torch.randn(d, r, generator=g, dtype=torch.float64))[0]
    mu = torch.randn(d, generator=g, dtype=torch.float64)
    c = torch.randn(B, L, r, generator=g, dtype=torch.float64)
    e = torch.randn(B, L, d, generator=g, dtype=torch.float64)
    e = e - (e @ u) @ u.T  # orthogonal to the subspace
    t = mu + c @ u.T + e
    s = torch.randn(B, L, d, generator=g, dtype=torch.float64)
    mask = _lengths_mask([5, 2, 4], L)
    perp = (s - mu) - ((s - mu) @ u) @ u.T - e
    full, out = losses.hidden_mse(s, t, mask).item(), perp.square().sum(-1)[mask].mean().item() / d
    got = losses.subspace_mse(s, c.float(), mu.float(), u.float(), mask).item()
    assert got == pytest.approx(full - out, rel=1e-5)
    cos = []
    for b in range(B):
        for i in range(L):
            if mask[b, i]:
                x = (mu + u @ (u.T @ (s[b, i] - mu))).numpy()
                y = (mu + u @ c[b, i]).numpy()
                cos.append(1 - x @ y / np.linalg.norm(x) / np.linalg.norm(y))
    assert losses.subspace_cosine(s.float(), c.float(), mu.float(), u.float(), mask).item() == pytest.approx(
        np.mean(cos), rel=1e-5)
    for fn in (losses.subspace_mse, losses.subspace_cosine):
        x = s.float().clone().requires_grad_()
        fn(x, c.float(), mu.float(), u.float(), mask).backward()
        assert torch.allclose(x.grad - (x.grad @ u.float()) @ u.float().T, torch.zeros_like(x.grad), atol=1e-7)
        assert torch.all(x.grad[~mask] == 0)


def _np_attn_mse(s: np.ndarray, t: np.ndarray, mask: np.ndarray) -> float:
    B, H, L, _ = s.shape
    sq = [
        (s[b, h, q, k] - t[b, h, q, k]) ** 2
        for b in range(B)
        for h in range(H)
        for q in range(L)
        for k in range(L)
        if mask[b, q] and mask[b, k]
    ]
    return float(np.mean(sq))


def test_attn_score_mse_matches_loop_with_inf_teacher():
    B, H, L = 2, 3, 5
    g = _gen(13)
    s, t = torch.randn(B, H, L, L, generator=g), torch.randn(B, H, L, L, generator=g)
    mask = _lengths_mask([5, 3], L)
    t16 = t.half()
    t16[~(mask[:, None, :, None] & mask[:, None, None, :]).expand_as(t16)] = float("-inf")  # the cache's ATTN_MASKED
    want = _np_attn_mse(s.double().numpy(), t16.double().numpy(), mask.numpy())
    x = s.clone().requires_grad_()
    out = losses.attn_score_mse(x, t16, mask)
    out.backward()
    assert out.item() == pytest.approx(want, rel=1e-5)
    assert torch.isfinite(x.grad).all()
    assert torch.all(x.grad[1, :, 3:, :] == 0) and torch.all(x.grad[1, :, :, 3:] == 0)


def test_attn_score_mse_through_student_pooling_has_finite_grads():
    """The training path: student scores max-pooled (-inf on empty blocks) vs cached pooled teacher."""
    B, H, L, p = 2, 2, 7, 2
    g = _gen(14)
    s, t = torch.randn(B, H, L, L, generator=g), torch.randn(B, H, L, L, generator=g)
    mask = _lengths_mask([7, 2], L)
    t_pooled, _ = max_pool_scores(t, mask, p)
    t_pooled = t_pooled.half()
    x = s.clone().requires_grad_()
    s_pooled = losses.pool_student_scores(x, mask, p)
    assert torch.isinf(s_pooled[1, :, 1:, :]).all()  # empty blocks of the short row
    out = losses.attn_score_mse(s_pooled, t_pooled, pooled_mask(mask, p))
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(x.grad).all()
    assert torch.all(x.grad[1, :, 2:, :] == 0) and torch.all(x.grad[1, :, :, 2:] == 0)
    assert x.grad[0].abs().sum() > 0


def test_attn_kl_matches_loop_and_ignores_masked():
    B, H, L = 2, 2, 5
    g = _gen(15)
    s, t_scores = torch.randn(B, H, L, L, generator=g), torch.randn(B, H, L, L, generator=g)
    mask = _lengths_mask([5, 3], L)
    teacher_probs = t_scores.masked_fill(~mask[:, None, None, :], float("-inf")).softmax(-1)
    kls = []
    for b in range(B):
        n = int(mask[b].sum())
        for h in range(H):
            for q in range(n):
                pt = teacher_probs[b, h, q, :n].double().numpy()
                ps = _np_softmax(s[b, h, q, :n].double().numpy())
                kls.append(sum(pt[k] * math.log(pt[k] / ps[k]) for k in range(n)))
    assert losses.attn_kl(s, teacher_probs, mask).item() == pytest.approx(np.mean(kls), rel=1e-5, abs=1e-7)
    # garbage in padded query rows / keys of either side changes nothing; gradients finite
    t_bad, x = teacher_probs.clone(), s.clone()
    t_bad[1, :, 3:, :] = float("nan")
    t_bad[1, :, :, 3:] = float("inf")
    x[1, :, :, 3:] = float("-inf")
    x[1, :, 3:, :] = 1e30
    x.requires_grad_()
    out = losses.attn_kl(x, t_bad.half(), mask)
    out.backward()
    assert out.item() == pytest.approx(np.mean(kls), rel=2e-3, abs=1e-4)  # fp16 teacher
    assert torch.isfinite(x.grad).all() and torch.all(x.grad[1, :, 3:, :] == 0)
    # equal distributions: KL 0
    assert losses.attn_kl(
        t_scores, t_scores.masked_fill(~mask[:, None, None, :], -1e9).softmax(-1), mask
    ).item() == pytest.approx(0.0, abs=1e-6)


# ------------------------------------------------------------------------------------------------
# student-side pooling
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [1, 2, 3])
def test_student_pooling_matches_naive_and_teacher(p):
    B, H, L, d = 2, 2, 7, 3
    g = _gen(16)
    h, sc = torch.randn(B, L, d, generator=g), torch.randn(B, H, L, L, generator=g)
    mask = _lengths_mask([7, 4], L)
    n = -(-L // p)
    got_h = losses.pool_student_hidden(h, mask, p)
    got_s = losses.pool_student_scores(sc, mask, p)
    assert got_h.shape == (B, n, d) and got_s.shape == (B, H, n, n)
    for b in range(B):
        for a in range(n):
            idx = [i for i in range(a * p, min(a * p + p, L)) if mask[b, i]]
            want = h[b, idx].mean(0) if idx else torch.zeros(d)
            torch.testing.assert_close(got_h[b, a], want)
            for c in range(n):
                keys = [k for k in range(c * p, min(c * p + p, L)) if mask[b, k]]
                for hh in range(H):
                    if idx and keys:
                        assert got_s[b, hh, a, c] == sc[b, hh][idx][:, keys].max()
                    else:
                        assert got_s[b, hh, a, c] == float("-inf")
    torch.testing.assert_close(got_h, avg_pool_seq(h, mask, p)[0])
    torch.testing.assert_close(got_s, max_pool_scores(sc.clone(), mask, p)[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_losses_on_cuda_match_cpu():
    B, H, L, p = 2, 2, 9, 4
    g = _gen(17)
    s, t = torch.randn(B, H, L, L, generator=g), torch.randn(B, H, L, L, generator=g)
    mask = _lengths_mask([9, 5], L)
    t_pooled = max_pool_scores(t, mask, p)[0].half()

    def run(device):
        x = s.to(device).requires_grad_()
        m = mask.to(device)
        out = losses.attn_score_mse(losses.pool_student_scores(x, m, p), t_pooled.to(device), pooled_mask(m, p))
        out = out + losses.attn_kl(x, t.to(device).softmax(-1), m)
        out.backward()
        return out.detach().cpu(), x.grad.cpu()

    (cpu_v, cpu_g), (gpu_v, gpu_g) = run("cpu"), run("cuda")
    torch.testing.assert_close(gpu_v, cpu_v, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gpu_g, cpu_g, rtol=1e-4, atol=1e-5)
