"""Delta-coding hot loops over weight bits (uint views of bf16/fp16/fp32): XOR against the base, byte-plane
split and its inverse, changed-element count. numpy on CPU (vectorised: each step is one or two whole-array
operations), Triton on a GPU when one is present (`backend()`); weight_sync.codec calls these.
What an in-place apply needs of a sparse chunk (its changed positions and their XOR with the base) and the
scatter that applies them are fused loops (kernels.cpu_ops, numba) where numba imports: numpy's version of each is
a chain of whole-array passes, several times slower.
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


@functools.lru_cache(maxsize=1)
def cpu_ops():
    """kernels.cpu_ops when numba imports (SGLang brings it), else None: the numpy paths below."""
    try:
        from kernels import cpu_ops
    except ImportError:
        return None
    return cpu_ops


def sparse_xor(body: np.ndarray, k: int, n: int, offset: int, idx_out: np.ndarray, xor_out: np.ndarray) -> None:
    """A sparse chunk's payload after its header, for a chunk of n elements: k zero-based gaps between changed
    positions (4 byte planes), then each one's XOR with the base (byte planes of xor_out's width). Writes the
    changed positions plus `offset` into idx_out (k) and their XOR into xor_out (k). ValueError for a
    position past the chunk's end."""
    itemsize = xor_out.dtype.itemsize
    if body.size != (4 + itemsize) * k or idx_out.size != k or xor_out.size != k:
        raise ValueError(f"a sparse payload of {body.size} bytes, {idx_out.size} positions for {k} changes")
    if (ops := cpu_ops()) is not None:
        return ops.sparse_xor(body, k, n, offset, idx_out, xor_out)
    idx = np.cumsum(join_planes(body[: 4 * k], np.uint32, k).astype(np.int64) + 1) - 1
    if k and idx[-1] >= n:
        raise ValueError("sparse chunk points past its end")
    np.add(idx, offset, out=idx_out, casting="unsafe")
    xor_out[:] = join_planes(body[4 * k :], xor_out.dtype.type, k)


def xor_scatter(target: np.ndarray, idx: np.ndarray, x: np.ndarray, shift: int = 0) -> None:
    """target[idx] ^= x << shift, on unsigned bits: a flat target, positions inside it, each once (ValueError
    for one outside: the positions before it are written). shift=16 puts a bf16 XOR into float32 bits (a
    bf16 value upcast to float32 is its bits followed by 16 zeros)."""
    if target.ndim != 1 or idx.shape != x.shape or idx.ndim != 1:
        raise ValueError(f"xor_scatter of {idx.shape} positions and {x.shape} values into {target.shape}")
    if target.dtype.kind != "u" or x.dtype.kind != "u" or 8 * x.itemsize + shift > 8 * target.itemsize:
        raise ValueError(f"xor_scatter of {x.dtype} << {shift} into {target.dtype} (unsigned bits, fitting)")
    if (ops := cpu_ops()) is not None:
        return ops.xor_scatter(target, idx, x, shift)
    if idx.size and (idx.min() < 0 or idx.max() >= target.size):
        raise ValueError(f"a position outside a tensor of {target.size}")
    target[idx] ^= x.astype(target.dtype) << target.dtype.type(shift)


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
