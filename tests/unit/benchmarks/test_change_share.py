"""The per-version change figures of benchmarks/_change_vs_learning.py: the share of bf16 weights bit-identical
between two versions (from their bits, as publish's changed_share counts them) and the codec's delta ratio."""

from __future__ import annotations

import pytest
import torch

from benchmarks._change_vs_learning import bits, delta_ratio, identical_share


def _next_up(t: torch.Tensor) -> torch.Tensor:
    """Each bf16 element one ulp away (its bit pattern plus one)."""
    return (t.view(torch.int16) + 1).view(torch.bfloat16)


def test_identical_share_counts_elements_whose_bf16_bits_are_the_same():
    torch.manual_seed(0)
    a = torch.randn(1000).to(torch.bfloat16)
    b = a.clone()
    b[:30] = _next_up(a[:30])
    old, new = (
        {"w": a, "x": torch.ones(1000, dtype=torch.bfloat16)},
        {"w": b, "x": torch.ones(1000, dtype=torch.bfloat16)},
    )
    assert identical_share(old, new) == pytest.approx(1970 / 2000)
    assert identical_share(old, old) == 1.0


def test_an_update_under_half_an_ulp_leaves_the_published_bits_as_they_were():
    w = torch.full((4,), 1.0)  # bf16 ulp at 1.0: 2**-7
    small = (w + 2**-9).to(torch.bfloat16)  # a quarter ulp: rounds back to 1.0
    large = (w + 2**-7).to(torch.bfloat16)
    assert identical_share({"w": w.to(torch.bfloat16)}, {"w": small}) == 1.0
    assert identical_share({"w": w.to(torch.bfloat16)}, {"w": large}) == 0.0


def test_the_delta_of_few_changes_is_far_smaller_than_the_weights():
    torch.manual_seed(0)
    a = torch.randn(100_000).to(torch.bfloat16)
    b = a.clone()
    b[::50] = _next_up(a[::50])  # 2% changed
    few = delta_ratio({"w": a}, {"w": b})
    c = _next_up(a)  # every element changed
    assert few > 10 and few > 5 * delta_ratio({"w": a}, {"w": c})


def test_only_bf16_tensors_and_the_same_tensors_are_compared():
    with pytest.raises(ValueError, match="bf16"):
        bits(torch.zeros(3))
    z = torch.zeros(3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="different tensors"):
        identical_share({"a": z}, {"b": z})
