"""runtime.adamw: torch's fused AdamW where it applies, with the same updates as the reference loop."""

import torch

from distillpipe.runtime import adamw


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Flatten(), torch.nn.Linear(24, 3))


def test_fused_adamw_matches_the_reference_loop():
    a, b = _model(0), _model(0)

    def groups(m):
        return [{"params": [m[2].weight], "weight_decay": 0.1}, {"params": [m[0].weight, m[2].bias],
                                                                  "weight_decay": 0.0}]

    fused = adamw(groups(a), lr=1e-2)
    ref = torch.optim.AdamW(groups(b), lr=1e-2, foreach=False)
    assert fused.defaults["fused"] is True and [len(g["params"]) for g in fused.param_groups] == [1, 2]
    x = torch.randint(0, 50, (16, 3))
    y = torch.randint(0, 3, (16,))
    for _ in range(5):
        for m, opt in ((a, fused), (b, ref)):
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    for p, q, p0 in zip(a.parameters(), b.parameters(), _model(0).parameters(), strict=True):
        assert not torch.equal(p, p0)  # it did train
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_non_float_parameters_fall_back_to_the_default_implementation():
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))
    opt = adamw([p], lr=1e-3)
    assert not opt.defaults["fused"]
