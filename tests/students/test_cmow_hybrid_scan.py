"""The associative scans against sequential python-loop products."""

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from distillpipe.students.cmow_hybrid import _static_tree_product, prefix_products, suffix_products, tree_product


def naive_prefix(X: torch.Tensor) -> torch.Tensor:
    out, acc = [], None
    for i in range(X.shape[1]):
        acc = X[:, i] if acc is None else acc @ X[:, i]
        out.append(acc)
    return torch.stack(out, dim=1)


def naive_suffix(X: torch.Tensor) -> torch.Tensor:
    """S_i = X_{L-1} X_{L-2} ... X_i, built from the end."""
    L = X.shape[1]
    out = [None] * L
    acc = None
    for i in reversed(range(L)):
        acc = X[:, i] if acc is None else acc @ X[:, i]
        out[i] = acc
    return torch.stack(out, dim=1)


def random_matrices(B, L, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    # I + noise: far from commuting, yet products of 128 factors stay in a comparable range.
    return torch.eye(d, dtype=dtype) + 0.3 * torch.randn(B, L, d, d, generator=g, dtype=dtype)


def rel_err(a, b):
    return ((a - b).norm(dim=(-2, -1)) / b.norm(dim=(-2, -1))).max().item()


@pytest.mark.parametrize("L", [1, 2, 3, 7, 64, 100, 128])
def test_scans_equal_naive_loops(L):
    X = random_matrices(3, L, 4, torch.float64, seed=L)
    assert rel_err(prefix_products(X), naive_prefix(X)) < 1e-12
    assert rel_err(suffix_products(X), naive_suffix(X)) < 1e-12
    assert rel_err(tree_product(X), naive_prefix(X)[:, -1]) < 1e-12
    assert rel_err(tree_product(X, reverse=True), naive_suffix(X)[:, 0]) < 1e-12
    # fp32, the dtype the student runs in
    X32 = X.float()
    assert rel_err(prefix_products(X32), naive_prefix(X).float()) < 1e-4
    assert rel_err(suffix_products(X32), naive_suffix(X).float()) < 1e-4
    assert rel_err(tree_product(X32), naive_prefix(X)[:, -1].float()) < 1e-4
    assert rel_err(tree_product(X32, reverse=True), naive_suffix(X)[:, 0].float()) < 1e-4


def test_order_matters_so_the_test_can_fail():
    X = random_matrices(2, 7, 4, torch.float64)
    forward, backward = naive_prefix(X)[:, -1], naive_suffix(X)[:, 0]
    assert rel_err(forward, backward) > 0.1
    assert rel_err(tree_product(X), backward) > 0.1
    assert rel_err(tree_product(X, reverse=True), forward) > 0.1


class _CountMatmuls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm):
            self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("L", [64, 100, 128])
def test_logarithmic_depth(L):
    """Each level is one batched matmul: O(log L) calls, not one per position."""
    X = random_matrices(2, L, 3, torch.float32)
    levels = math.ceil(math.log2(L))
    with _CountMatmuls() as c:
        tree_product(X)
    assert c.calls == levels
    with _CountMatmuls() as c:
        prefix_products(X)
    assert c.calls <= 2 * levels


def test_gradients_match_naive():
    X = random_matrices(2, 11, 3, torch.float64).requires_grad_()
    w = torch.randn(2, 11, 3, 3, dtype=torch.float64)
    (g_scan,) = torch.autograd.grad((prefix_products(X) * w).sum() + (suffix_products(X) * w).sum(), X)
    (g_naive,) = torch.autograd.grad((naive_prefix(X) * w).sum() + (naive_suffix(X) * w).sum(), X)
    torch.testing.assert_close(g_scan, g_naive)


def test_products_stay_bounded_at_paper_init():
    """I + N(0, 0.01^2), d = 20 (paper sec. III-A): 128-token products neither explode nor vanish.

    To first order P = I + sum of L noise matrices, so ||P||_F^2 / d ~ 1 + L d sigma^2 = 1.26 (scale ~1.12)."""
    torch.manual_seed(0)
    d, L = 20, 128
    X = torch.eye(d) + 0.01 * torch.randn(8, L, d, d)
    for P in (prefix_products(X), suffix_products(X)):
        assert torch.isfinite(P).all()
        scale = P.norm(dim=(-2, -1)) / math.sqrt(d)  # 1 for the identity
        assert 0.8 < scale.min() and scale.max() < 1.5
        assert ((P - torch.eye(d)).norm(dim=(-2, -1)) / math.sqrt(d)).max() < 1.0


def test_rejects_non_square():
    with pytest.raises(ValueError, match="square"):
        prefix_products(torch.zeros(1, 3, 2, 4))


@pytest.mark.parametrize("reverse", [False, True])
def test_static_tree_product_is_bitwise_the_tree(reverse):
    """The spelling used while exporting (a fixed number of operations for every L <= max_len, ONNX) groups the
    factors as the tree does and multiplies by exact identities only: the same bits, at every length."""
    g = torch.Generator().manual_seed(0)
    for max_len in (32, 100, 128):
        for L in [*range(1, min(40, max_len)), max_len - 1, max_len]:
            X = torch.eye(3) + 0.3 * torch.randn(2, L, 3, 3, generator=g)
            assert torch.equal(_static_tree_product(X, reverse, max_len), tree_product(X, reverse=reverse)), (L,
                                                                                                             max_len)
    with pytest.raises(ValueError, match="max_len"):
        _static_tree_product(torch.eye(3).expand(1, 40, 3, 3), reverse, 32)
