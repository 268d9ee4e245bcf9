"""Associative scans of matrix products: the O(log n)-depth encoders behind CMOW.

CMOW encodes a sequence by the ordered product of its token matrices (CMOW paper, sec. III-A). Matrix
multiplication is associative but not commutative, so the products can be evaluated as a balanced tree
of ``log2 n`` levels instead of ``n`` sequential steps (paper, sec. V-E). Every level here is one or two batched
``matmul`` over all pairs of the level, so the python loop runs over the ``ceil(log2 n)`` levels only.

- :func:`tree_product`: ``X_1 X_2 ... X_n`` (one reduction tree, n - 1 matmuls, depth ceil(log2 n)),
  or ``X_n ... X_1`` with ``reverse=True``.
- :func:`prefix_products`: inclusive scan ``P_i = X_1 ... X_i`` for every i, work-efficient odd/even
  (Ladner-Fischer/Blelloch-style) recursion: about 2n matmuls, depth about 2 log2 n.
- :func:`suffix_products`: ``S_i = X_n X_{n-1} ... X_i`` (the backward direction), the same recursion
  with the later factor on the left.

All functions take ``X`` of shape (B, L, d, d), keep the order of the factors, and run on any device and
dtype. Padding is the caller's business: identity matrices at pad positions leave every product unchanged.
"""

from __future__ import annotations

import torch


def _identity_like(X: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` identity matrices shaped like one position of ``X``: (B, n, d, d)."""
    B, _, d, _ = X.shape
    return torch.eye(d, dtype=X.dtype, device=X.device).expand(B, n, d, d)


def _check(X: torch.Tensor) -> None:
    if X.dim() != 4 or X.shape[-1] != X.shape[-2] or X.shape[1] < 1:
        raise ValueError(f"expected square matrices shaped (B, L >= 1, d, d), got {tuple(X.shape)}")


def _mm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Batched product of (B, n, d, d) stacks. Through bmm on (B*n, d, d) views: the strided every-other-position
    slices of the scans fold into one batch dimension without the copy a 4-D matmul makes."""
    b, n, d, _ = A.shape
    return torch.bmm(A.reshape(b * n, d, d), B.reshape(b * n, d, d)).view(b, n, d, d)


def tree_product(X: torch.Tensor, *, reverse: bool = False) -> torch.Tensor:
    """Ordered product ``X[:, 0] @ X[:, 1] @ ... @ X[:, L-1]`` by pairwise tree reduction; with ``reverse``
    the backward product ``X[:, L-1] @ ... @ X[:, 0]`` (no reversal copy).

    X: (B, L, d, d) -> (B, d, d). Depth ceil(log2 L) batched matmuls.
    """
    _check(X)
    while X.shape[1] > 1:
        if X.shape[1] % 2:  # odd: an identity partner for the last factor keeps the order
            X = torch.cat([X, _identity_like(X, 1)], dim=1)
        even, odd = X[:, 0::2], X[:, 1::2]
        X = _mm(odd, even) if reverse else _mm(even, odd)  # (B, ceil(L/2), d, d): neighbours, in order
    return X[:, 0]


def _scan(X: torch.Tensor, reverse: bool) -> torch.Tensor:
    """Odd/even recursion. Forward: P_i = X_0 ... X_i. Reverse: S_i = X_{L-1} ... X_i (later factors left)."""
    L = X.shape[1]
    if L == 1:
        return X
    Xe = torch.cat([X, _identity_like(X, 1)], dim=1) if L % 2 else X  # (B, 2m, d, d); an identity changes nothing
    even, odd = Xe[:, 0::2], Xe[:, 1::2]  # (B, m, d, d) each
    # Multiply neighbours, scan the half-length sequence of pair products, fill in the other half.
    Q = _scan(_mm(odd, even) if reverse else _mm(even, odd), reverse)  # (B, m, d, d)
    out = torch.empty_like(Xe)
    if reverse:  # Q[j] = S_{2j};  S_{2j+1} = S_{2j+2} X_{2j+1};  S_{2m-1} = X_{2m-1}
        out[:, 0::2] = Q
        out[:, 1:-1:2] = _mm(Q[:, 1:], odd[:, :-1])
        out[:, -1] = Xe[:, -1]
    else:  # Q[j] = P_{2j+1};  P_{2j} = P_{2j-1} X_{2j};  P_0 = X_0
        out[:, 1::2] = Q
        out[:, 2::2] = _mm(Q[:, :-1], even[:, 1:])
        out[:, 0] = Xe[:, 0]
    return out[:, :L]


def prefix_products(X: torch.Tensor) -> torch.Tensor:
    """Inclusive scan ``P[:, i] = X[:, 0] @ X[:, 1] @ ... @ X[:, i]`` for every i.

    X: (B, L, d, d) -> (B, L, d, d). Odd/even recursion: multiply neighbouring pairs, scan the (half as long)
    sequence of pair products recursively, then fill in the even positions with one more matmul. Recursion
    depth ceil(log2 L); about 2L matmuls in all, each level two batched matmuls.
    """
    _check(X)
    return _scan(X, reverse=False)


def suffix_products(X: torch.Tensor) -> torch.Tensor:
    """Backward scan ``S[:, i] = X[:, L-1] @ X[:, L-2] @ ... @ X[:, i]`` for every i, aligned to position i.

    X: (B, L, d, d) -> (B, L, d, d). The same recursion with the later factor on the left (no reversal copies).
    """
    _check(X)
    return _scan(X, reverse=True)
