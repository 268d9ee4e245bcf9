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

Exporting (torch.export, ONNX): the tree's number of levels depends on L, which an exported graph with a dynamic
sequence length cannot have, so while a model is being exported :func:`tree_product` is spelled with a fixed
number of operations for every L up to the caller's ``max_len`` (:func:`_static_tree_product`), the same grouping
of the factors and therefore bitwise the same product (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

EXPORT_CHUNK = 16
"""Positions per chunk of the exported spelling of :func:`tree_product`: an exported graph takes sequence lengths
that are multiples of it (pad with identities, i.e. masked positions, to get there)."""


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


def tree_product(X: torch.Tensor, *, reverse: bool = False, max_len: int | None = None) -> torch.Tensor:
    """Ordered product ``X[:, 0] @ X[:, 1] @ ... @ X[:, L-1]`` by pairwise tree reduction; with ``reverse``
    the backward product ``X[:, L-1] @ ... @ X[:, 0]`` (no reversal copy).

    X: (B, L, d, d) -> (B, d, d). Depth ceil(log2 L) batched matmuls. ``max_len``: the longest L the caller
    passes, needed only while the model is exported (see the module docstring).
    """
    _check(X)
    if torch.compiler.is_exporting():
        if max_len is None:
            raise ValueError("tree_product: exporting a model needs max_len (the longest sequence it will take)")
        return _static_tree_product(X, reverse, max_len)
    while X.shape[1] > 1:
        if X.shape[1] % 2:  # odd: an identity partner for the last factor keeps the order
            X = torch.cat([X, _identity_like(X, 1)], dim=1)
        even, odd = X[:, 0::2], X[:, 1::2]
        X = _mm(odd, even) if reverse else _mm(even, odd)  # (B, ceil(L/2), d, d): neighbours, in order
    return X[:, 0]


def _pad_identities(X: torch.Tensor, n) -> torch.Tensor:
    """(B, L, d, d) -> (B, L + n, d, d): ``n`` identities appended (zeros, plus ones on their diagonals: exact).
    ``n`` may be symbolic (exporting): then the padding is in the graph even where it comes to 0 rows."""
    if statically_known_true(n == 0):
        return X
    B, L, d, _ = X.shape
    is_pad = (torch.arange(L + n, device=X.device) >= L).to(X.dtype)  # (L + n,)
    return F.pad(X, (0, 0, 0, 0, 0, n)) + is_pad[:, None, None] * torch.eye(d, dtype=X.dtype, device=X.device)


def _halve(X: torch.Tensor, reverse: bool) -> torch.Tensor:
    """Neighbouring pairs along dim -3 multiplied, in order: (..., 2m, d, d) -> (..., m, d, d)."""
    even, odd = X.unflatten(-3, (-1, 2)).unbind(-3)  # (..., m, d, d) each (an ONNX Split, not two strided Slices)
    first, second = (odd, even) if reverse else (even, odd)
    d = X.shape[-1]
    return torch.bmm(first.reshape(-1, d, d), second.reshape(-1, d, d)).view(first.shape)


def _static_tree_product(X: torch.Tensor, reverse: bool, max_len: int) -> torch.Tensor:
    """:func:`tree_product` with a fixed number of operations for every L <= ``max_len``: the sequence is cut into
    chunks of :data:`EXPORT_CHUNK` (identities appended), each chunk reduced by a fixed tree, and the chunk products
    (identities appended up to a fixed power-of-two count) by another. Both trees group aligned power-of-two runs
    of factors, as :func:`tree_product` does, and a product with an identity is exact: the same bits. Traced with
    a symbolic L, L must be a multiple of the chunk (then no identities are appended to it)."""
    B, L, d, _ = X.shape
    c = EXPORT_CHUNK
    X = _pad_identities(X, -L % c).view(B, -1, c, d, d)  # (B, K, c, d, d)
    for _ in range(c.bit_length() - 1):
        X = _halve(X, reverse)  # (B, K, c / 2^j, d, d)
    X = X[:, :, 0]  # (B, K, d, d): each chunk's product
    k_max = 1 << (-(-max_len // c) - 1).bit_length()  # chunks of the longest sequence, up to a power of two
    if X.shape[1] > k_max:
        raise ValueError(f"tree_product: {L} factors, but max_len is {max_len}")
    X = _pad_identities(X, k_max - X.shape[1])  # (B, k_max, d, d)
    while X.shape[1] > 1:  # k_max is a constant: a fixed number of levels
        X = _halve(X, reverse)
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
