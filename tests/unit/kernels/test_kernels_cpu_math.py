"""kernels.cpu_math: float32 exp/log/silu/softmax whose every element runs the same steps, so its bits do not
depend on the tensor's length or the element's position, and within 2 ulp of the float64 result."""

import math

import numpy as np
import pytest
import torch

from kernels import cpu_math as cm

SPECIAL = [0.0, -0.0, 1.0, -1.0, 88.0, 88.72, 89.0, -87.0, -87.3, -88.0, -1e-30, 1e-30]


def ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in units of the float32 spacing at want."""
    spacing = torch.from_numpy(np.spacing(np.abs(want.float().numpy()))).double()
    return (got.double() - want).abs() / spacing


def test_exp_is_within_two_ulp_of_float64_over_its_range():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.linspace(-87.3, 88.7, 200_001), torch.randn(100_000, generator=g) * 5, torch.tensor(SPECIAL)])
    want = torch.exp(x.double())
    normal = (want > 1.18e-38) & (want < 3.4e38)
    assert float(ulps(cm.exp(x), want)[normal].max()) <= 2.0


def test_exp_edges():
    x = torch.tensor([float("-inf"), -1000.0, -88.0, 0.0, 89.0, 1000.0, float("inf"), float("nan")])
    y = cm.exp(x)
    assert y[:3].tolist() == [0.0, 0.0, 0.0]  # exp(-inf) = 0 exactly: masked attention keys weigh nothing
    assert y[3] == 1.0 and y[4:7].tolist() == [math.inf] * 3 and math.isnan(y[7])


def test_log_is_within_two_ulp_of_float64():
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.rand(100_000, generator=g) * 1e4, torch.logspace(-44, 38, 10_001), torch.tensor([1.0, 2.0])])
    want = torch.log(x.double())
    ok = want.abs() > 1e-3  # near 1 the absolute error is what matters
    assert float(ulps(cm.log(x), want)[ok].max()) <= 2.0
    assert float((cm.log(x).double() - want)[~ok].abs().max()) < 1e-7
    edges = cm.log(torch.tensor([0.0, float("inf"), -1.0, float("nan")]))
    assert edges[0] == -math.inf and edges[1] == math.inf and edges[2:].isnan().all()


@pytest.mark.parametrize("fn", [cm.exp, cm.log, cm.silu])
def test_an_elements_bits_do_not_depend_on_the_tensor_around_it(fn):
    g = torch.Generator().manual_seed(2)
    x = torch.rand(3000, generator=g) * 40 - (0 if fn is cm.log else 20)
    whole = fn(x)
    for start, length in ((0, 1), (1, 7), (3, 17), (5, 1000), (1000, 999), (13, 2987)):
        assert torch.equal(fn(x[start : start + length].clone()), whole[start : start + length])
    big = torch.cat([x] * 200)  # cut into slices on threads
    assert torch.equal(fn(big)[:3000], whole)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_rows_match_float64_and_each_other(log):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(50, 301, generator=g) * 4
    y = cm.softmax(x, log=log)
    want = torch.log_softmax(x.double(), -1) if log else torch.softmax(x.double(), -1)
    assert torch.allclose(y.double(), want, rtol=1e-5, atol=1e-6)
    for i in (0, 17, 49):
        assert torch.equal(cm.softmax(x[i : i + 1].clone(), log=log)[0], y[i])
    assert torch.equal(cm.softmax(x.repeat(1000, 1), log=log)[-50:], y)  # cut into slices on threads


def test_silu_matches_torch():
    x = torch.linspace(-100, 100, 20_001)
    assert torch.allclose(cm.silu(x), torch.nn.functional.silu(x), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (cm.exp, torch.exp),
        (lambda x: cm.log(x.abs() + 0.1), lambda x: torch.log(x.abs() + 0.1)),
        (cm.silu, torch.nn.functional.silu),
        (cm.softmax, lambda x: torch.softmax(x, -1)),
        (lambda x: cm.softmax(x, log=True), lambda x: torch.log_softmax(x, -1)),
        (
            lambda x: cm.rms_normalize(x, 1e-6),
            lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
        ),
    ],
)
def test_gradients_are_the_functions(ours, theirs):
    x = torch.randn(6, 9, generator=torch.Generator().manual_seed(4))
    w = torch.randn(6, 9, generator=torch.Generator().manual_seed(5))
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    (ours(a) * w).sum().backward()
    (theirs(b) * w).sum().backward()
    assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_refuses_what_it_does_not_compute():
    with pytest.raises(TypeError, match="float32"):
        cm.exp(torch.zeros(3, dtype=torch.float64))
