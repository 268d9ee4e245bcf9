"""The compressed stored forms of teacher signals (:data:`distillpipe.store.schema.FORMULAS`): encode in the shard
writer, decode in the reader, with numpy only.

* ``int8_rows`` (hidden states, embeddings) and ``int8_scores`` (attention scores): symmetric int8 with a float16
  scale per row vector (the last axis: a position's features, a (head, query) row's keys). The scale is
  ``max|x| / 127`` rounded *up* to float16 (at least 2^-24, so never 0), so ``|x| / scale <= 127`` and no code is
  clipped; the error of a value
  is at most half a step, ``scale / 2`` (plus the float16 rounding of the decoded value); only values within half a
  step of float16's largest (65504) lose up to a whole step, so that no code decodes past it to ``inf``. Scores keep
  the ``-inf`` of masked positions as the code -128, decoded back to exactly ``-inf``.
* ``uint8_steps`` (MLM top-k logits): steps of 1/16 nat below the slot's top-1 logit, and a float32 anchor placed
  so that the decoded top-k probability mass equals the teacher's, to float32 precision (the tail mass then stays
  what the float32 ``mlm/logsumexp`` says it is).

Decoding writes straight into the caller's float16 array, so a reader's output has the float16 layout's dtype and
shape whatever the precision.
"""

from __future__ import annotations

import numpy as np
import torch

from distillpipe.store.schema import INT8_ROWS, INT8_SCORES, MLM_STEP, SCORES_MASKED_Q, UINT8_STEPS

_F16_NEG_INF = float("-inf")
_F16_MAX = float(np.finfo(np.float16).max)
_SCALE_TINY = torch.tensor(2**-24, dtype=torch.float16)
"""The smallest float16 (subnormal): the scale of an all-zero or fully masked vector."""


def encode(kind: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, scales) of the float16 array ``x`` (..., n) in the stored form ``kind``; scales have shape (...)."""
    if kind == UINT8_STEPS:
        return _encode_steps(x)
    return _encode_int8(x, masked=kind == INT8_SCORES)


def decode(kind: str, values: np.ndarray, scales: np.ndarray, out: np.ndarray) -> None:
    """Decode (values, scales) of the stored form ``kind`` into the float16 array ``out`` (values' shape).

    With torch's CPU kernels, in place, and without an int8 -> float16 conversion kernel: numpy has no vectorised
    float16 conversion, and torch's is several times slower than its float16 arithmetic (6.3 M scores: numpy 41 ms,
    torch's conversion and masked fill 18 ms, this 2-3 ms on one core). Each formula is exact arithmetic followed by
    one rounding to float16, so torch and a plain numpy reader give the same bits."""
    o, s = torch.from_numpy(out), torch.from_numpy(scales)
    if kind == UINT8_STEPS:
        # float16(float32(anchor) - float32(steps) / 16): steps / 16 is exact, one float32 rounding, one float16
        o.copy_(torch.sub(s[..., None], torch.from_numpy(values).to(torch.float32).div_(1 / MLM_STEP)))
        return
    if kind not in (INT8_ROWS, INT8_SCORES):
        raise ValueError(f"unknown stored form {kind!r}")
    # q as float16 from its bits: 0x6480 + q is the float16 1152 + q (exponent 10: steps of 1), so subtracting 1152
    # gives q exactly. A score's code -128 gets the bits of -inf instead (0x6400 - 0x6800 = 0xFC00), which the
    # subtraction keeps, and so does the product: a scale is never 0.
    w = torch.from_numpy(values).to(torch.int16)
    if kind == INT8_SCORES:
        masked = (w + 127).bitwise_right_shift_(15)  # -1 where q == -128, else 0
        w.add_(0x6480).add_(masked.bitwise_and_(-0x6800))
    else:
        w.add_(0x6480)
    torch.sub(w.view(torch.float16), 1152, out=o)
    # float16(q * scale): the product of an int8 and a float16 is exact in float32, so one rounding
    o.mul_(s[..., None])


def _encode_int8(x: np.ndarray, *, masked: bool) -> tuple[np.ndarray, np.ndarray]:
    """The int8 codes and float16 scales of float16 ``x``, with torch's CPU kernels (numpy has no vectorised float16
    arithmetic: its version of these steps ran at a quarter of this speed, and gave the same bits)."""
    if x.dtype != np.float16:
        raise TypeError(f"int8 encoding takes the float16 values a float16 store would hold, got {x.dtype}")
    t = torch.from_numpy(np.ascontiguousarray(x))
    xf = t.float()
    finite = None
    if masked:
        finite = t != _F16_NEG_INF
        m = xf.abs().masked_fill_(~finite, 0.0).amax(dim=-1)  # (...) the largest finite magnitude of each row vector
    else:
        m = xf.abs().amax(dim=-1)
    scale = torch.maximum((m / 127).half(), _SCALE_TINY)  # never 0 (see decode)
    low = scale.float() * 127 < m  # rounded down: one float16 step up (exact products; a scale is positive)
    if bool(low.any()):
        scale.view(torch.int16)[low] += 1
    sf = scale.float()
    q = torch.round(xf.div_(sf[..., None]))  # round half to even, as numpy's rint
    if finite is not None:
        q.masked_fill_(~finite, 0.0)  # (masked scores: set to -128 below)
    q.clamp_(-127, 127)
    big = sf * 127 > _F16_MAX  # 127 * scale would decode past float16's range
    if bool(big.any()):  # (|x| near 65504 only): the codes of those rows stop at the largest that decodes finite
        lim = torch.floor(_F16_MAX / sf[big])[..., None]
        q[big] = torch.minimum(torch.maximum(q[big], -lim), lim)
    codes = q.to(torch.int8)
    if finite is not None:
        codes.masked_fill_(~finite, SCORES_MASKED_Q)
    return codes.numpy(), scale.numpy()


def _encode_steps(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = x.astype(np.float64)
    top = v.max(axis=-1, keepdims=True)
    steps = np.clip(np.rint((top - v) / MLM_STEP), 0, 255)
    anchor = _logsumexp(v) - _logsumexp(-steps * MLM_STEP)  # decoded top-k mass = the teacher's
    return steps.astype(np.uint8), anchor.astype(np.float32)


def _logsumexp(v: np.ndarray) -> np.ndarray:
    top = v.max(axis=-1)
    return top + np.log(np.exp(v - top[..., None]).sum(axis=-1))
