"""The loss formulas: pure tensor functions, one per loss (fairseq-criterion / torchtune style).

Each function takes tensors and returns a scalar tensor; nothing here owns parameters (learned
projections live in :mod:`distillpipe.train.objective`) or decides which output meets which target.

Conventions shared by every function:

* Arithmetic is done in float32 whatever the input dtypes (students may run under bf16 autocast;
  cached teacher targets are float16), so the returned scalar is float32.
* ``mask`` arguments are bool, True on valid (real) positions. Masked entries never enter the
  arithmetic: they are selected away or filled with a finite value *before* any subtraction,
  exponent or product, so arbitrary values there (the teacher cache stores ``-inf`` at masked
  attention entries, see :mod:`distillpipe.pooling`) change neither the value nor the
  gradient, and gradients stay finite.
* Means are over valid elements of the whole batch (token-weighted): rows with more valid
  positions weigh more. The papers write ``1/B sum_i MSE_i`` (a per-sequence mean first); the two
  agree when every row has the same number of valid positions.
* A call with no valid element returns 0 (still attached to the graph), not nan: e.g. a batch
  whose rows hold no masked MLM position.
* Softmaxes restricted to valid positions fill invalid logits with the dtype's most negative
  finite value (not ``-inf``): exp of it is exactly 0 next to any real logit, and a row with no
  valid position stays finite (uniform) instead of producing nan gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from distillpipe.pooling import avg_pool_seq, max_pool_scores

NEG = torch.finfo(torch.float32).min
"""Fill for logits outside the valid positions of a masked softmax (float32 arithmetic)."""


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over ``mask`` (same shape, bool); 0 when nothing is valid.

    ``values`` must already be finite (or zeroed) on invalid entries: they are filled with 0 here,
    which also cuts their gradient.
    """
    total = values.masked_fill(~mask, 0.0).sum()
    return total / mask.sum().clamp(min=1).to(total.dtype)


def _check_mask(x: torch.Tensor, mask: torch.Tensor, n_dims: int, name: str) -> None:
    if mask.dtype != torch.bool:
        raise TypeError(f"{name}: mask must be a bool tensor (True = valid), got {mask.dtype}")
    if tuple(mask.shape) != tuple(x.shape[:n_dims]):
        raise ValueError(f"{name}: mask shape {tuple(mask.shape)} does not match the leading dims of {tuple(x.shape)}")


def _check_same(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name}: student shape {tuple(a.shape)} != teacher shape {tuple(b.shape)} "
            f"(is the student projected to the teacher width and pooled like the teacher cache?)"
        )


# ------------------------------------------------------------------------------------------------
# output-layer losses
# ------------------------------------------------------------------------------------------------


def hard_ce(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Ground-truth cross-entropy (CMOW L_hard; WaLDORf eq. (7) for one softmax).

    ``logits`` (N, C), ``labels`` (N,) long; rows with ``labels == ignore_index`` are left out.
    Mean over the remaining rows (0 when none remain).
    """
    if logits.ndim != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(
            f"hard_ce: need logits (N, C) and labels (N,), got {tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    valid = labels != ignore_index  # (N,)
    logp = F.log_softmax(logits.float(), dim=-1)  # (N, C)
    picked = logp.gather(1, labels.masked_fill(~valid, 0).long()[:, None])[:, 0]  # (N,)
    return _masked_mean(-picked, valid)


def _kl(p: torch.Tensor, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """sum_c p_c (log p_c - log q_c) over the last axis, with 0 log 0 = 0 (a teacher bucket of no mass)."""
    return (torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))).sum(dim=-1)


def soft_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Hinton soft-target loss, T^2 scaled (CMOW L_soft = sum_i t_i log s_i; WaLDORf eq. (6)), as KL.

    ``T^2 * mean_rows( KL(softmax(t/T) || softmax(s/T)) )`` for ``student_logits`` and ``teacher_logits``
    (N, C). The papers write the cross-entropy; KL differs from it by the teacher's entropy, a constant,
    so the gradients are the same, and its value reaches 0 when the student matches the teacher (a
    logged curve shows how far it is). The T^2 factor keeps gradient magnitudes comparable across
    temperatures (the soft gradient scales as 1/T^2).
    """
    _check_same(student_logits, teacher_logits, "soft_kl")
    if temperature <= 0:
        raise ValueError(f"soft_kl: temperature must be > 0, got {temperature}")
    T = float(temperature)
    logp_t = F.log_softmax(teacher_logits.float() / T, dim=-1)  # (N, C)
    logp_s = F.log_softmax(student_logits.float() / T, dim=-1)  # (N, C)
    per_row = _kl(logp_t.exp(), logp_t, logp_s)  # (N,)
    return T * T * _masked_mean(per_row, torch.ones_like(per_row, dtype=torch.bool))


def topk_kd(
    student_logits: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logits: torch.Tensor,
    logsumexp: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """KD against a teacher known by its top-k logits and its full-vocabulary logsumexp (MLM KD).

    ``student_logits`` (N, V), ``topk_ids`` (N, k) long, ``topk_logits`` (N, k), ``logsumexp`` (N,).

    The teacher distribution is reduced to k + 1 buckets: its top-k tokens with probabilities
    ``p_i = exp(l_i - lse)`` and ONE tail bucket with the remaining mass ``1 - sum_i p_i`` (clamped
    to [0, 1] against fp16 rounding). The student is reduced to the same buckets: its probabilities
    at ``topk_ids`` and its remaining mass (a logsumexp over the other V - k logits, so it stays
    finite however small). The loss is the soft cross-entropy between the bucket distributions.
    When k == V there is no tail bucket.

    Temperature: the tail's tempered mass is unknown (it needs every tail logit), so both bucket
    distributions are tempered as if each bucket were one token: ``softmax(log(bucket probs) / T)``
    over the k + 1 buckets, then ``T^2 * KL`` as in :func:`soft_kl`. Consequences:
    exact at T = 1 (KL of the bucketed full distributions); for k == V equal to
    ``soft_kl(student_logits, teacher_full_logits, T)`` at every T (log p_i = l_i - lse, and the
    shift cancels in the softmax); for k < V and T != 1 an approximation that treats the tail as
    one token of log-probability ``log(tail mass)``.
    """
    N, V = student_logits.shape
    k = topk_ids.shape[-1]
    if topk_ids.shape != (N, k) or topk_logits.shape != (N, k) or logsumexp.shape != (N,):
        raise ValueError(
            f"topk_kd: need student (N, V), topk_ids/topk_logits (N, k) and logsumexp (N,); got "
            f"{tuple(student_logits.shape)}, {tuple(topk_ids.shape)}, {tuple(topk_logits.shape)}, "
            f"{tuple(logsumexp.shape)}"
        )
    if k > V:
        raise ValueError(f"topk_kd: k={k} exceeds the student's vocabulary V={V}")
    if temperature <= 0:
        raise ValueError(f"topk_kd: temperature must be > 0, got {temperature}")
    T = float(temperature)
    ids = topk_ids.long()
    with torch.no_grad():
        logp_top = topk_logits.float() - logsumexp.float()[:, None]  # (N, k) teacher log-probs
    s = student_logits.float()
    lse_s = torch.logsumexp(s, dim=-1, keepdim=True)  # (N, 1)
    logq_top = s.gather(1, ids) - lse_s  # (N, k) student log-probs of the teacher's top-k
    if k < V:
        with torch.no_grad():
            tail = (1.0 - logp_top.exp().sum(dim=-1, keepdim=True)).clamp(0.0, 1.0)  # (N, 1)
            logp = torch.cat([logp_top, tail.log()], dim=-1)  # (N, k+1); log(0) = -inf is fine: no grad
        in_top = torch.zeros_like(s, dtype=torch.bool).scatter_(1, ids, True)  # (N, V)
        # the tail holds >= 1 logit (k < V), so this logsumexp is finite and its gradient too
        logq_tail = torch.logsumexp(s.masked_fill(in_top, float("-inf")), dim=-1, keepdim=True) - lse_s
        logq = torch.cat([logq_top, logq_tail], dim=-1)  # (N, k+1)
    else:
        logp, logq = logp_top, logq_top
    logp_t = F.log_softmax(logp / T, dim=-1)  # (N, k[+1]) tempered teacher buckets (tail 0 stays 0)
    logq_t = F.log_softmax(logq / T, dim=-1)  # (N, k[+1])
    per_row = _kl(logp_t.exp(), logp_t, logq_t)  # (N,)
    return T * T * _masked_mean(per_row, torch.ones_like(per_row, dtype=torch.bool))


def span_ce(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    start_positions: torch.Tensor,
    end_positions: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """QA ground-truth loss, WaLDORf eq. (7): mean of the start and the end cross-entropy.

    ``start_logits``/``end_logits`` (B, L), positions (B,) long, ``mask`` (B, L) bool. The softmax
    runs over the valid positions only (others get a large negative logit); position 0 ([CLS]) is
    the no-answer target and must be valid. A target outside the mask gives a huge loss, on purpose.
    """
    _check_mask(start_logits, mask, 2, "span_ce")
    _check_same(start_logits, end_logits, "span_ce (start vs end)")
    if start_positions.shape != start_logits.shape[:1] or end_positions.shape != start_logits.shape[:1]:
        raise ValueError(
            f"span_ce: positions must be (B,) = {tuple(start_logits.shape[:1])}, got "
            f"{tuple(start_positions.shape)} and {tuple(end_positions.shape)}"
        )

    def one(logits: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        logp = F.log_softmax(logits.float().masked_fill(~mask, NEG), dim=-1)  # (B, L)
        return -logp.gather(1, pos.long()[:, None])[:, 0].mean()

    return 0.5 * (one(start_logits, start_positions) + one(end_logits, end_positions))


def span_kd(
    s_start: torch.Tensor,
    s_end: torch.Tensor,
    t_start: torch.Tensor,
    t_end: torch.Tensor,
    mask: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """QA soft-target KD, WaLDORf eq. (6) for the start and the end softmax, averaged.

    All logits (B, L), ``mask`` (B, L) bool. Each softmax runs over the valid positions only, for
    the teacher and the student, and each term is a ``T^2``-scaled KL as in :func:`soft_kl`.
    """
    _check_mask(s_start, mask, 2, "span_kd")
    for a, b, what in ((s_start, t_start, "start"), (s_end, t_end, "end"), (s_start, s_end, "student")):
        _check_same(a, b, f"span_kd ({what})")
    if temperature <= 0:
        raise ValueError(f"span_kd: temperature must be > 0, got {temperature}")
    T = float(temperature)

    def one(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logp_t = F.log_softmax((t.float() / T).masked_fill(~mask, NEG), dim=-1)  # (B, L), exp is 0 off-mask
        logp_s = F.log_softmax((s.float() / T).masked_fill(~mask, NEG), dim=-1)  # (B, L)
        p_t = logp_t.exp().masked_fill(~mask, 0.0)
        return _kl(p_t, logp_t, logp_s).mean()

    return T * T * 0.5 * (one(s_start, t_start) + one(s_end, t_end))


def continuous_cosine(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """ELMo-C continuous-output loss, eq. (2) with the cosine distance: mean of ``1 - cos(c, w)``.

    ``pred`` (N, e) (the student's output, projected to the embedding size by the caller),
    ``target`` (N, e) the fixed pre-trained embedding of each target word. Mean over rows.
    """
    _check_same(pred, target, "continuous_cosine")
    cos = F.cosine_similarity(pred.float(), target.float(), dim=-1)  # (N,)
    return (1.0 - cos).mean() if cos.numel() else cos.sum()


def lm_nll(logprob: torch.Tensor) -> torch.Tensor:
    """Language-model loss, ELMo-C eq. (1): the mean of ``-log p(w | c)`` over the predictions.

    ``logprob`` (N,) the log-probability of each target under the model's (full or adaptive) softmax.
    """
    if logprob.dim() != 1:
        raise ValueError(f"lm_nll: logprob must be (N,), got {tuple(logprob.shape)}")
    return -logprob.float().mean() if logprob.numel() else logprob.sum()


# ------------------------------------------------------------------------------------------------
# intermediate-layer losses
# ------------------------------------------------------------------------------------------------


def hidden_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Hidden-state MSE, WaLDORf eqs. (2)-(3): mean of (s - t)^2 over valid positions and features.

    ``student`` (B, Lp, d) already projected by W_h and pooled like the teacher
    (:func:`pool_student_hidden`), ``teacher`` (B, Lp, d) the cached AVG-pooled states, ``mask``
    (B, Lp) bool validity of the pooled positions.
    """
    _check_same(student, teacher, "hidden_mse")
    _check_mask(student, mask, 2, "hidden_mse")
    m = mask[..., None]
    diff = student.float().masked_fill(~m, 0.0) - teacher.float().masked_fill(~m, 0.0)  # (B, Lp, d)
    return _masked_mean(diff.square(), m.expand_as(diff))


def embedding_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Embedding-layer MSE, WaLDORf eq. (1): ``student`` (B, L, e) = E^s W^E (projected by the
    caller), ``teacher`` (B, L, e), ``mask`` (B, L) bool; mean over valid positions and features."""
    return hidden_mse(student, teacher, mask)


def hidden_cosine(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MiniALBERT hidden loss, eq. (8): mean of ``1 - cos(h^s_n, h^t_n)`` over valid positions n.

    ``student`` (B, Lp, d) (projected/pooled by the caller), ``teacher`` (B, Lp, d), ``mask`` (B, Lp).
    """
    _check_same(student, teacher, "hidden_cosine")
    _check_mask(student, mask, 2, "hidden_cosine")
    m = mask[..., None]
    cos = F.cosine_similarity(
        student.float().masked_fill(~m, 0.0), teacher.float().masked_fill(~m, 0.0), dim=-1
    )  # (B, Lp)
    return _masked_mean(1.0 - cos, mask)


def subspace_mse(student: torch.Tensor, coords: torch.Tensor, mean: torch.Tensor, basis: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
    """WaLDORf eqs. (2)-(3) against a teacher cached in its principal subspace: ``||U^T (s - mu) - c||^2`` summed over
    the r coordinates, divided by the teacher's width d, mean over valid positions.

    ``student`` (B, Lp, d) projected by W_h and pooled, ``coords`` (B, Lp, r) the cached ``c = U^T (t - mu)``,
    ``mean`` (d,), ``basis`` (d, r) orthonormal columns, ``mask`` (B, Lp). With ``t = mu + U c + e`` (``e`` the part of
    the state outside the subspace, orthogonal to it), ``||s - t||^2 = ||U^T (s - mu) - c||^2 + ||(I - U U^T)(s - mu)
    - e||^2``: this is :func:`hidden_mse`'s value less the second term, on the same scale (divided by d, not r), so
    loss weights keep their meaning. The student's part outside the subspace is left free: a reconstructed target
    (``mu + U c``) in the full MSE would push it to zero, which the teacher never asked for."""
    _check_mask(student, mask, 2, "subspace_mse")
    d, r = basis.shape
    if student.shape[-1] != d or coords.shape != (*student.shape[:-1], r) or mean.shape != (d,):
        raise ValueError(f"subspace_mse: student {tuple(student.shape)}, coords {tuple(coords.shape)}, mean "
                         f"{tuple(mean.shape)}, basis {tuple(basis.shape)} do not fit together")
    m = mask[..., None]
    diff = (student.float() - mean.float()) @ basis.float() - coords.float()  # (B, Lp, r)
    sq = diff.masked_fill(~m, 0.0).square().sum(dim=-1) / d  # (B, Lp)
    return _masked_mean(sq, mask)


def subspace_cosine(student: torch.Tensor, coords: torch.Tensor, mean: torch.Tensor, basis: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """MiniALBERT eq. (8) against a teacher cached in its principal subspace: mean over valid positions of
    ``1 - cos(mu + U U^T (s - mu), mu + U c)``, the cosine of the student and the teacher both seen in the affine
    subspace ``mu + span(U)`` (the student's part outside it left free, as in :func:`subspace_mse`). Computed in
    the r coordinates: with ``a = U^T (s - mu)``, ``m = U^T mu``, ``(mu + U a) . (mu + U c) = |mu|^2 + m . (a + c) +
    a . c``. Shapes as :func:`subspace_mse`."""
    _check_mask(student, mask, 2, "subspace_cosine")
    d, r = basis.shape
    if student.shape[-1] != d or coords.shape != (*student.shape[:-1], r) or mean.shape != (d,):
        raise ValueError(f"subspace_cosine: student {tuple(student.shape)}, coords {tuple(coords.shape)}, mean "
                         f"{tuple(mean.shape)}, basis {tuple(basis.shape)} do not fit together")
    mu, u = mean.float(), basis.float()
    a = (student.float() - mu) @ u  # (B, Lp, r)
    c = coords.float().masked_fill(~mask[..., None], 0.0)
    m, mu2 = mu @ u, mu.square().sum()
    dot = mu2 + (a + c) @ m + (a * c).sum(dim=-1)  # (B, Lp)
    na = (mu2 + 2 * (a @ m) + a.square().sum(dim=-1)).clamp(min=0.0).sqrt()
    nc = (mu2 + 2 * (c @ m) + c.square().sum(dim=-1)).clamp(min=0.0).sqrt()
    cos = dot / (na * nc).clamp(min=1e-8)  # F.cosine_similarity's eps
    return _masked_mean((1.0 - cos).masked_fill(~mask, 0.0), mask)


def pool_student_hidden(h: torch.Tensor, mask: torch.Tensor, p: int) -> torch.Tensor:
    """The teacher's hidden-state pooling applied to a student layer, WaLDORf eq. (3).

    ``h`` (B, L, d), ``mask`` (B, L) bool -> (B, ceil(L/p), d): each group of p positions averaged
    over its valid positions (:func:`distillpipe.pooling.avg_pool_seq`, the very function
    the teacher capture used). Validity of the result is ``pooled_mask(mask, p)``.
    """
    return avg_pool_seq(h, mask, p)[0]


def pool_student_scores(scores: torch.Tensor, mask: torch.Tensor, p: int) -> torch.Tensor:
    """The teacher's attention-score pooling applied to a student layer, WaLDORf eq. (5).

    ``scores`` (B, H, L, L) pre-softmax, ``mask`` (B, L) bool -> (B, H, ceil(L/p), ceil(L/p)):
    max over the valid (query, key) pairs of each p x p block, ``-inf`` on blocks without one
    (:func:`distillpipe.pooling.max_pool_scores`, not in place: the student's scores are
    part of the graph). :func:`attn_score_mse` never lets those ``-inf`` into its arithmetic.
    """
    return max_pool_scores(scores, mask, p)[0]


def _pair_mask(mask: torch.Tensor) -> torch.Tensor:
    """(B, L) position validity -> (B, 1, L, L) validity of (query, key) pairs."""
    return (mask[:, :, None] & mask[:, None, :])[:, None]


def attn_score_mse(student_scores: torch.Tensor, teacher_scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention-score MSE, WaLDORf eqs. (4)-(5), with the masking the paper asks for.

    ``student_scores`` (B, H, Lq, Lk) and ``teacher_scores`` (B, H, Lq, Lk) pre-softmax (pooled),
    ``mask`` (B, L) bool validity of the (pooled) positions, L = Lq = Lk. Mean of (s - t)^2 over the
    entries whose query AND key are valid. Both sides are zero-filled off the mask before the
    subtraction, so the teacher's ``-inf`` (and the student's) never reach the arithmetic and the
    gradients stay finite (``torch.where(valid, (s - t) ** 2, 0)`` would give nan gradients).
    """
    _check_same(student_scores, teacher_scores, "attn_score_mse")
    B, _, Lq, Lk = student_scores.shape
    if Lq != Lk or mask.shape != (B, Lq):
        raise ValueError(
            f"attn_score_mse: need square (B, H, L, L) scores and a (B, L) mask, got "
            f"{tuple(student_scores.shape)} and {tuple(mask.shape)}"
        )
    valid = _pair_mask(mask)  # (B, 1, L, L)
    diff = student_scores.float().masked_fill(~valid, 0.0) - teacher_scores.float().masked_fill(~valid, 0.0)
    return _masked_mean(diff.square(), valid.expand_as(diff))


def attn_kl(student_scores: torch.Tensor, teacher_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MiniALBERT attention loss, eq. (7): ``1/(H N) sum_h sum_n KL(A^t_{h,n} || A^s_{h,n})``.

    ``student_scores`` (B, H, L, L) pre-softmax, ``teacher_probs`` (B, H, L, L) attention
    probabilities (cached ``attn_probs``), ``mask`` (B, L) bool. Rows n are the valid queries; each
    row is a distribution over the valid keys only: the student's softmax runs over valid keys,
    and the teacher's row is restricted to valid keys and renormalised (fp16 storage does not sum to
    exactly 1). Direction: KL(teacher || student), as the authors' code (``KLDivLoss(log s, t)``);
    the paper's notation D_KL(Â || A) reads the other way. Mean over (batch, head, valid query).
    """
    _check_same(student_scores, teacher_probs, "attn_kl")
    B, H, L, L2 = student_scores.shape
    if L != L2 or mask.shape != (B, L):
        raise ValueError(
            f"attn_kl: need square (B, H, L, L) maps and a (B, L) mask, got "
            f"{tuple(student_scores.shape)} and {tuple(mask.shape)}"
        )
    keys = mask[:, None, None, :]  # (B, 1, 1, L)
    logq = F.log_softmax(student_scores.float().masked_fill(~keys, NEG), dim=-1)  # (B, H, L, L)
    # zero every invalid pair (padded keys AND padded query rows) before any arithmetic
    t = teacher_probs.float().masked_fill(~_pair_mask(mask), 0.0).clamp(min=0.0)  # (B, H, L, L)
    t = t / t.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)
    # t log t - t log q over valid keys; xlogy makes 0 log 0 = 0, and the fill keeps NEG out
    per_entry = torch.special.xlogy(t, t) - t * logq.masked_fill(~keys, 0.0)
    rows = mask[:, None, :].expand(B, H, L)  # (B, H, L) valid queries
    return _masked_mean(per_entry.sum(dim=-1), rows)
