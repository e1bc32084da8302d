"""The scan's SIMD step (kernels.simd): positions packed in a register and stored whole, inside the slack the
scan's callers leave; never a compress-store to memory (microcode on AMD Zen 4: the scan ran at 0.1x a memcpy)."""

import re

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from kernels import cpu_ops  # noqa: E402
from kernels.simd import LANES, store_changed_positions  # noqa: E402


@numba.njit(nogil=True)  # not cached: its code is read back below
def _positions(new, base, idx):
    k, j = 0, 0
    while j + LANES <= new.size:
        k += store_changed_positions(new, base, j, idx, k)
        j += LANES
    return k


@pytest.mark.parametrize("view", [np.uint16, np.uint32])
@pytest.mark.parametrize("share", [0.0, 0.02, 0.3, 1.0])
def test_the_step_packs_the_changed_positions_in_order(view, share):
    rng = np.random.default_rng(int(share * 100))
    base = rng.integers(0, np.iinfo(view).max, 64 * LANES, dtype=view)
    new = base.copy()
    new[rng.random(new.size) < share] ^= view(1)
    idx = np.zeros(new.size + LANES, np.uint32)
    k = _positions(new, base, idx)
    assert k == np.count_nonzero(new != base)
    assert np.array_equal(idx[:k], np.flatnonzero(new != base))


def test_the_step_compresses_in_a_register_not_into_memory():
    a = np.zeros(4 * LANES, np.uint16)
    _positions(a, a, np.zeros(a.size + LANES, np.uint32))
    llvm = "".join(_positions.inspect_llvm().values())  # every width compiled so far
    assert "llvm.experimental.vector.compress" in llvm and "compressstore" not in llvm
    asm = "".join(_positions.inspect_asm().values())
    # on an AVX-512 CPU: vpcompressd into a register only (the memory form is microcode on Zen 4)
    assert not re.search(r"vpcompress[dq]\s+%[xyz]mm\d+, [^%]*\(", asm)


@pytest.mark.parametrize("view", [np.uint16, np.uint32])
def test_the_scan_writes_no_position_past_its_slack(view):
    """Whole 16-lane stores past the last changed position: still inside cap + POSITIONS_SLACK, at any cap."""
    rng = np.random.default_rng(1)
    n = 3 * cpu_ops.BLOCK + 5
    base = rng.integers(0, np.iinfo(view).max, n, dtype=view)
    new = base.copy()
    new[rng.random(n) < 0.5] ^= view(1)
    planes = np.empty(new.nbytes, np.uint8)
    for cap in (0, 100, n // 2, n):
        guard = np.full(cap + cpu_ops.POSITIONS_SLACK + 64, 0xDEADBEEF, np.uint32)
        positions = guard[: cap + cpu_ops.POSITIONS_SLACK]
        changed = cpu_ops.scan(new, base, cap, planes, positions)
        assert changed == np.count_nonzero(new != base)
        assert (guard[positions.size :] == 0xDEADBEEF).all()
        if changed <= cap:
            assert np.array_equal(positions[:changed], np.flatnonzero(new != base))
