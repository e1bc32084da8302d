"""Delta-coding hot loops over weight bits (uint views of bf16/fp16/fp32): XOR against the base, byte-plane
split and its inverse, changed-element count. numpy on CPU (vectorised: each step is one or two whole-array
operations), Triton on a GPU when one is present (`backend()`); weight_sync.codec calls these.
"""

from __future__ import annotations

import functools

import numpy as np

MIN_GPU_BYTES = 8 * 2**20  # below this the host<->device copies cost more than the work


@functools.lru_cache(maxsize=1)
def backend() -> str:
    """The backend: "triton" when a CUDA device and Triton are usable, else "numpy"."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "numpy"
        import triton  # noqa: F401
    except Exception:
        return "numpy"
    return "triton"


def _gpu(x: np.ndarray) -> bool:
    return backend() == "triton" and x.nbytes >= MIN_GPU_BYTES


def xor(new: np.ndarray, base: np.ndarray) -> np.ndarray:
    if new.dtype != base.dtype or new.shape != base.shape:
        raise ValueError(f"xor needs equal dtypes and shapes, got {new.dtype}{new.shape} and {base.dtype}{base.shape}")
    if _gpu(new):
        from kernels import triton_ops

        return triton_ops.on_host(triton_ops.xor, new, base)
    return np.bitwise_xor(new, base)


def split_planes(x: np.ndarray) -> np.ndarray:
    """(n,) uint -> (itemsize * n,) uint8: byte k of every element, plane after plane (little-endian)."""
    if _gpu(x):
        from kernels import triton_ops

        return triton_ops.on_host(triton_ops.split_planes, x)
    n = x.size
    out = np.empty(n * x.itemsize, np.uint8)
    for k in range(x.itemsize):  # one whole-array shift and narrowing per byte (2-3x a strided transpose)
        np.copyto(out[k * n : (k + 1) * n], x >> (8 * k) if k else x, casting="unsafe")
    return out


def join_planes(planes: np.ndarray, view: type, n: int) -> np.ndarray:
    """The inverse of split_planes: (itemsize * n,) uint8 -> (n,) `view`."""
    itemsize = np.dtype(view).itemsize
    if planes.size != itemsize * n:
        raise ValueError(f"{planes.size} plane bytes for {n} elements of {itemsize} bytes")
    if _gpu(planes):
        from kernels import triton_ops

        return triton_ops.on_host(triton_ops.join_planes, planes, np.dtype(view), n)
    return np.ascontiguousarray(planes.reshape(itemsize, n).T).reshape(-1).view(view)


def count_changed(x: np.ndarray) -> int:
    """Nonzero elements of an XOR: the elements that changed."""
    if _gpu(x):
        from kernels import triton_ops

        return int(triton_ops.on_host(triton_ops.count_nonzero, x))
    return int(np.count_nonzero(x))


def xor_split(new: np.ndarray, base: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, int]:
    """XOR (or the raw bits without a base), its byte planes, and how many elements changed."""
    x = new if base is None else xor(new, base)
    return x, split_planes(x), (x.size if base is None else count_changed(x))
