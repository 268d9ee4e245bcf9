"""The compressed stored forms of teacher signals (:data:`distillpipe.store.schema.FORMULAS`): encode in the shard
writer, decode in the reader, with numpy only.

* ``int8_rows`` (hidden states, embeddings) and ``int8_scores`` (attention scores): symmetric int8 with a float16
  scale per row vector (the last axis: a position's features, a (head, query) row's keys). The scale is
  ``max|x| / 127`` rounded *up* to float16, so ``|x| / scale <= 127`` and no code is clipped; the error of a value
  is at most half a step, ``scale / 2`` (plus the float16 rounding of the decoded value); only values within half a
  step of float16's largest (65504) lose up to a whole step, so that no code decodes past it to ``inf``. Scores keep
  the ``-inf`` of masked positions as the code -128, decoded back to exactly ``-inf``.
* ``uint8_steps`` (MLM top-k logits): steps of 1/16 nat below the slot's top-1 logit, and a float32 anchor placed
  so that the decoded top-k probability mass equals the teacher's (the tail mass then stays what the float32
  ``mlm/logsumexp`` says it is).

Decoding writes straight into the caller's float16 array (one fused ufunc with a float32 loop: no temporary of the
row's size), so a reader's output has the float16 layout's dtype and shape whatever the precision.
"""

from __future__ import annotations

import numpy as np

from distillpipe.store.schema import INT8_ROWS, INT8_SCORES, MLM_STEP, SCORES_MASKED_Q, UINT8_STEPS

_F16_INF = np.float16(np.inf)
_F16_MAX = np.float32(np.finfo(np.float16).max)


def encode(kind: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, scales) of the float16 array ``x`` (..., n) in the stored form ``kind``; scales have shape (...)."""
    if kind == UINT8_STEPS:
        return _encode_steps(x)
    return _encode_int8(x, masked=kind == INT8_SCORES)


def decode(kind: str, values: np.ndarray, scales: np.ndarray, out: np.ndarray) -> None:
    """Decode (values, scales) of the stored form ``kind`` into the float16 array ``out`` (values' shape)."""
    if kind == UINT8_STEPS:
        # float16(anchor - steps / 16) evaluated in float64: exact before the one rounding to float16
        np.subtract(scales.astype(np.float64)[..., None], values * MLM_STEP, out=out, dtype=np.float64,
                    casting="same_kind")
        return
    if kind not in (INT8_ROWS, INT8_SCORES):
        raise ValueError(f"unknown stored form {kind!r}")
    # float16(q * scale): the int8 x float16 product is exact in float32, so the float32 loop rounds once
    np.multiply(values, scales[..., None], out=out, dtype=np.float32, casting="same_kind")
    if kind == INT8_SCORES:
        np.copyto(out, np.float16(-np.inf), where=values == SCORES_MASKED_Q)


def _encode_int8(x: np.ndarray, *, masked: bool) -> tuple[np.ndarray, np.ndarray]:
    if x.dtype != np.float16:
        raise TypeError(f"int8 encoding takes the float16 values a float16 store would hold, got {x.dtype}")
    finite = x != -_F16_INF if masked else None
    ax = np.abs(x)
    if masked:
        ax = np.where(finite, ax, np.float16(0))
    m = ax.max(axis=-1).astype(np.float32)  # (...) largest magnitude of each row vector
    scale = (m / np.float32(127)).astype(np.float16)
    low = scale.astype(np.float32) * np.float32(127) < m  # rounded down: one float16 step up (exact products)
    scale[low] = np.nextafter(scale[low], _F16_INF)
    s = scale.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(x.astype(np.float32) / s)  # an all-zero row: 0 / 0 = nan, set to 0 below
    q[~np.isfinite(q)] = 0
    q = np.clip(q, -127, 127)
    big = scale.astype(np.float32) * np.float32(127) > _F16_MAX  # 127 * scale would decode past float16's range
    if big.any():  # (|x| near 65504 only): the codes of those rows stop at the largest that decodes finite
        lim = np.floor(_F16_MAX / scale[big].astype(np.float32))[..., None]
        q[big] = np.clip(q[big], -lim, lim)
    q = q.astype(np.int8)
    if masked:
        q[~finite] = SCORES_MASKED_Q
    return q, scale


def _encode_steps(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = x.astype(np.float64)
    top = v.max(axis=-1, keepdims=True)
    steps = np.clip(np.rint((top - v) / MLM_STEP), 0, 255)
    anchor = _logsumexp(v) - _logsumexp(-steps * MLM_STEP)  # decoded top-k mass = the teacher's
    return steps.astype(np.uint8), anchor.astype(np.float32)


def _logsumexp(v: np.ndarray) -> np.ndarray:
    top = v.max(axis=-1)
    return top + np.log(np.exp(v - top[..., None]).sum(axis=-1))
