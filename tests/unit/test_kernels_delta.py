"""Delta kernels (numpy path): bit-exact against the element-by-element reference, special values included."""

import numpy as np
import pytest

from kernels import delta, reference as ref

SPECIAL_BF16 = np.array(
    [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFFF, 0x0001, 0x8001, 0x007F, 0x3F80, 0xBF80], np.uint16
)  # +-0, +-inf, NaN, all ones, denormals, +-1.0
SPECIAL_F32 = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 1, 0x3F800000], np.uint32)


def cases(view, special, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(view)
    base = rng.integers(0, info.max, 3000, dtype=view, endpoint=True)
    new = base.copy()
    flip = rng.random(base.size) < 0.1
    new[flip] ^= rng.integers(1, info.max, flip.sum(), dtype=view, endpoint=True)
    yield new, base
    yield np.concatenate([special, special[::-1]]), np.concatenate([special[::-1], special])
    yield special, special  # nothing changed
    yield new[:1], base[:1]


@pytest.mark.parametrize("view, special", [(np.uint16, SPECIAL_BF16), (np.uint32, SPECIAL_F32)])
def test_xor_split_join_count_against_the_reference(view, special):
    for new, base in cases(view, special, seed=np.dtype(view).itemsize):
        x, planes, changed = delta.xor_split(new, base)
        want_planes, want_changed = ref.xor_split(new, base)
        assert np.array_equal(planes, want_planes) and changed == want_changed
        assert np.array_equal(x, new ^ base)
        assert np.array_equal(delta.join_planes(planes, view, new.size), x)
        assert np.array_equal(delta.xor(x, base), new)  # XOR again: the new bits back


def test_full_snapshot_has_no_base():
    new = SPECIAL_BF16
    x, planes, changed = delta.xor_split(new, None)
    assert changed == new.size and np.array_equal(delta.join_planes(planes, np.uint16, new.size), new)


def test_mismatches_are_clear_errors():
    with pytest.raises(ValueError, match="equal dtypes"):
        delta.xor(SPECIAL_BF16, SPECIAL_F32)
    with pytest.raises(ValueError, match="plane bytes"):
        delta.join_planes(np.zeros(5, np.uint8), np.uint16, 3)


def test_backend_follows_the_machine():
    import torch

    assert delta.backend() == ("triton" if torch.cuda.is_available() else "numpy")
