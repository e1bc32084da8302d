"""Fused CPU loops (numba) for what numpy can only do as a chain of whole-array passes. Each is one pass
over its elements, releases the GIL (threads run them side by side) and checks every position it writes.
Compiled on first use and cached next to this file (`cache=True`); `warm()` compiles them ahead, off any
hot path. kernels.delta picks these when numba imports (SGLang brings it), numpy otherwise.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _sparse_xor(body, k, itemsize, n, offset, idx_out, xor_out):  # pragma: no cover - compiled
    # body: uint8 (4 + itemsize) * k: the zero-based gaps between changed positions as 4 byte planes, then
    # the XOR of each changed element as `itemsize` byte planes (weight_sync.codec's sparse chunk).
    pos = -1
    for j in range(k):
        gap = np.int64(body[j]) | (np.int64(body[k + j]) << 8)
        gap |= (np.int64(body[2 * k + j]) << 16) | (np.int64(body[3 * k + j]) << 24)
        pos += gap + 1
        if pos >= n:
            return -1
        x = np.uint64(0)
        for b in range(itemsize):
            x |= np.uint64(body[(4 + b) * k + j]) << np.uint64(8 * b)
        idx_out[j] = pos + offset
        xor_out[j] = x
    return k


def sparse_xor(body: np.ndarray, k: int, n: int, offset: int, idx_out: np.ndarray, xor_out: np.ndarray) -> None:
    """See kernels.delta.sparse_xor."""
    if _sparse_xor(body, k, xor_out.dtype.itemsize, n, offset, idx_out, xor_out) < 0:
        raise ValueError("sparse chunk points past its end")


@njit(cache=True, nogil=True)
def _xor_scatter(target, idx, x, shift):  # pragma: no cover - compiled
    n = target.size
    for j in range(idx.size):
        i = idx[j]
        if i < 0 or i >= n:
            return j
        target[i] ^= np.uint64(x[j]) << np.uint64(shift)  # stored back at the target's width
    return -1


def xor_scatter(target: np.ndarray, idx: np.ndarray, x: np.ndarray, shift: int = 0) -> None:
    """See kernels.delta.xor_scatter."""
    if (j := _xor_scatter(target, idx, x, shift)) >= 0:
        raise ValueError(f"position {idx[j]} is outside a tensor of {target.size} ({j} written before it)")


def warm() -> None:
    """Compile (or load from the cache) the specialisations the weight path uses: bits as unsigned integers
    of 2 or 4 bytes (and 2-byte XORs into 4-byte bits: bf16 into a float32 replica), positions as int32 or
    int64."""

    def readonly(a: np.ndarray) -> np.ndarray:  # numba types read-only arrays apart (bytes, mapped files)
        a = a.copy()
        a.flags.writeable = False
        return a

    for idx_dtype in (np.int32, np.int64):
        for idx in (np.zeros(1, idx_dtype), readonly(np.zeros(1, idx_dtype))):
            for view in (np.uint16, np.uint32):
                x = np.zeros(1, view)
                for body in (np.zeros(4 + x.itemsize, np.uint8), readonly(np.zeros(4 + x.itemsize, np.uint8))):
                    sparse_xor(body, 1, 1, 0, np.zeros(1, idx_dtype), x)
                for xs in (x, readonly(x)):
                    xor_scatter(np.zeros(1, view), idx, xs)
            for xs in (np.zeros(1, np.uint16), readonly(np.zeros(1, np.uint16))):
                xor_scatter(np.zeros(1, np.uint32), idx, xs, 16)
