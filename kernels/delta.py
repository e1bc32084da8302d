"""Delta-coding hot loops over weight bits (uint views of bf16/fp16/fp32): XOR against the base, byte-plane
split and its inverse, changed-element count; weight_sync.codec calls these.

The codec's passes over a whole chunk are each one fused loop (kernels.cpu_ops, numba) where numba imports:
  scan          the encoder's pass: the byte planes of new ^ base, how many elements changed and, while few
                enough changed for the sparse form, where (no XOR array, no second pass for the positions);
  join_xor      the decoder's dense pass: planes joined and XORed with the base, straight into the output;
  sparse_patch  the decoder's sparse pass: the base with a sparse payload's changes XORed in;
and what an in-place apply needs of a sparse chunk (sparse_xor, xor_scatter). Without numba each falls back to
its numpy composition (several whole-array passes, several times slower). Triton does the whole-array steps
on a GPU when one is present (`backend()`), for chunks of MIN_GPU_BYTES and more: there the fallbacks below
call it, unchanged. Measured side by side in benchmarks.kernels.
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


class Scratch:
    """Output buffers reused call after call, grown as needed: fresh pages for every 8 MB chunk (page faults)
    cost as much as the scan itself. What a call returns lives in them until the next call with the same
    Scratch, so keep one per thread."""

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}

    def take(self, name: str, size: int, dtype) -> np.ndarray:
        """(size,) of dtype, C-contiguous, contents undefined."""
        buf = self._bufs.get(name)
        if buf is None or buf.dtype != dtype or buf.size < size:
            buf = self._bufs[name] = np.empty(size, dtype)
        return buf[:size]


def _take(scratch: Scratch | None, name: str, size: int, dtype) -> np.ndarray:
    return np.empty(size, dtype) if scratch is None else scratch.take(name, size, dtype)


def scan(
    new: np.ndarray, base: np.ndarray | None, cap: int, scratch: Scratch | None = None
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """The encoder's pass over a chunk. new, base: (n,) flat uint views of equal dtype, n < 2**32.
    Returns (planes, positions, changed): planes (itemsize * n,) uint8 of new ^ base (of new itself without a
    base); changed, the elements that differ (n without a base); positions (changed,) uint32, sorted, where
    they differ, when changed <= cap, else None (and None without a base)."""
    if base is not None and (new.dtype != base.dtype or new.shape != base.shape):
        raise ValueError(f"scan needs equal dtypes and shapes, got {new.dtype}{new.shape} and {base.dtype}{base.shape}")
    if new.ndim != 1 or new.dtype.kind != "u" or new.size >= 2**32:
        raise ValueError(f"scan of {new.dtype}{new.shape}: a flat chunk of unsigned bits, under 2**32 elements")
    cap = max(0, min(int(cap), new.size))
    if (ops := cpu_ops()) is None or _gpu(new):
        x, planes, changed = xor_split(new, base)
        positions = None if base is None or changed > cap else np.flatnonzero(x).astype(np.uint32)
        return planes, positions, changed
    planes = _take(scratch, "planes", new.nbytes, np.uint8)
    positions = _take(scratch, "positions", cap + ops.POSITIONS_SLACK, np.uint32)
    changed = ops.scan(
        np.ascontiguousarray(new), None if base is None else np.ascontiguousarray(base), cap, planes, positions
    )
    return planes, (positions[:changed] if base is not None and changed <= cap else None), changed


def sparse_payload(positions: np.ndarray, planes: np.ndarray, n: int, body: np.ndarray) -> None:
    """The sparse form of a chunk of n elements from what scan returned (positions (k,) uint32 sorted, planes
    of the XOR): into body ((4 + itemsize) * k,) uint8, the zero-based gaps between positions (uint32, 4 byte
    planes), then the XOR at each position (itemsize byte planes)."""
    k = positions.size
    itemsize = planes.size // n if n else 0
    if body.size != (4 + itemsize) * k or planes.size != itemsize * n:
        raise ValueError(f"a sparse payload of {body.size} bytes for {k} changes of {itemsize} bytes")
    if (ops := cpu_ops()) is not None:
        return ops.sparse_payload(positions, planes, n, itemsize, body)
    gaps = np.diff(positions.astype(np.int64), prepend=-1) - 1
    body[: 4 * k] = split_planes(gaps.astype(np.uint32))
    body[4 * k :] = planes.reshape(itemsize, n)[:, positions].reshape(-1)


def join_xor(planes: np.ndarray, base: np.ndarray | None, out: np.ndarray) -> np.ndarray:
    """The decoder's dense pass: into out (n,) uint, the elements whose byte planes are `planes`
    ((itemsize * n,) uint8), XOR base (n,) (as they are without a base). Returns out."""
    n = out.size
    if (
        out.ndim != 1
        or planes.size != out.itemsize * n
        or (base is not None and (base.dtype != out.dtype or base.size != n))
    ):
        raise ValueError(f"join_xor of {planes.size} plane bytes and a base unlike its output {out.dtype}{out.shape}")
    if (ops := cpu_ops()) is None or _gpu(planes) or not out.flags.c_contiguous:
        x = join_planes(planes, out.dtype.type, n)
        out[...] = x if base is None else xor(x, base.reshape(-1))
        return out
    ops.join_xor(planes, None if base is None else np.ascontiguousarray(base), out)
    return out


def sparse_patch(body: np.ndarray, k: int, base: np.ndarray | None, out: np.ndarray) -> np.ndarray:
    """The decoder's sparse pass: into out (n,) uint, base (n,) with the k changes of a sparse payload
    (see sparse_payload) XORed in; base None: out already holds the base (in place). ValueError for a
    position past the end (out is then partly written). Returns out."""
    itemsize = out.itemsize
    if (
        out.ndim != 1
        or body.size != (4 + itemsize) * k
        or (base is not None and (base.dtype != out.dtype or base.size != out.size))
    ):
        raise ValueError(f"a sparse payload of {body.size} bytes for {k} changes into {out.dtype}{out.shape}")
    if (ops := cpu_ops()) is not None and out.flags.c_contiguous:
        ops.sparse_patch(body, k, None if base is None else np.ascontiguousarray(base), out)
        return out
    idx = np.cumsum(join_planes(body[: 4 * k], np.uint32, k).astype(np.int64) + 1) - 1
    if k and idx[-1] >= out.size:
        raise ValueError("sparse chunk points past its end")
    if base is not None:
        out[...] = base
    out[idx] ^= join_planes(body[4 * k :], out.dtype.type, k)
    return out


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
