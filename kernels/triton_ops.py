"""Triton kernels: the batch-invariant ops and the delta-coding loops.

Batch invariance by construction: tile sizes are constants (never tuned per batch shape), there is no
split-K, and row-wise ops run one program per row with a block size set by the row length alone, so a
row's reduction order is the same whatever else is in the batch. Matmuls use IEEE fp32 (no TF32).
On a machine without a GPU these run under Triton's interpreter (TRITON_INTERPRET=1, set before import)
on CPU tensors; that is how `make test` checks them.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

BM, BN, BK = 32, 64, 32  # matmul tiles: constants, whatever the batch
ELEMS = 1024  # elements per program in the delta kernels
ROW_BLOCK = 1024  # chunk of a row in softmax / log-softmax


# ---------------------------------------------------------------------------------------------- linear
@triton.jit
def _linear_kernel(x_ptr, w_ptr, o_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # one fixed order over K for every output tile
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., K) @ w (N, K)^T -> (..., N), fp32."""
    lead, K = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, K).float().contiguous()
    w = w.float().contiguous()
    M, N = flat.shape[0], w.shape[0]
    out = torch.empty(M, N, dtype=torch.float32, device=x.device)
    _linear_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](flat, w, out, M, N, K, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK)
    return out.reshape(*lead, N)


# ---------------------------------------------------------------------------------------------- rows
@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, o_ptr, D, eps, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    m = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=m, other=0.0)
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    ms = tl.sum(x * x, axis=0) / D
    tl.store(o_ptr + row * D + cols, w * tl.div_rn(x, tl.sqrt_rn(ms + eps)), mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    D = x.shape[-1]
    flat = x.reshape(-1, D).float().contiguous()
    out = torch.empty_like(flat)
    _rms_norm_kernel[(flat.shape[0],)](
        flat, weight.float().contiguous(), out, D, eps, BLOCK_D=triton.next_power_of_2(D)
    )
    return out.reshape(x.shape)


@triton.jit
def _softmax_kernel(x_ptr, o_ptr, V, LOG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row * V
    m = tl.max(tl.load(base + tl.arange(0, BLOCK), mask=tl.arange(0, BLOCK) < V, other=-float("inf")), axis=0)
    for start in range(BLOCK, V, BLOCK):  # pass 1: the row's max, chunk by chunk in a fixed order
        cols = start + tl.arange(0, BLOCK)
        m = tl.maximum(m, tl.max(tl.load(base + cols, mask=cols < V, other=-float("inf")), axis=0))
    s = 0.0
    for start in range(0, V, BLOCK):  # pass 2: sum of exp
        cols = start + tl.arange(0, BLOCK)
        v = tl.load(base + cols, mask=cols < V, other=-float("inf"))
        s += tl.sum(tl.exp(v - m), axis=0)
    for start in range(0, V, BLOCK):  # pass 3: write
        cols = start + tl.arange(0, BLOCK)
        v = tl.load(base + cols, mask=cols < V, other=0.0)
        if LOG:
            y = v - m - tl.log(s)
        else:
            y = tl.exp(v - m) / s
        tl.store(o_ptr + row * V + cols, y, mask=cols < V)


def _rowwise(x: torch.Tensor, log: bool) -> torch.Tensor:
    V = x.shape[-1]
    flat = x.reshape(-1, V).float().contiguous()
    out = torch.empty_like(flat)
    _softmax_kernel[(flat.shape[0],)](flat, out, V, LOG=log, BLOCK=min(ROW_BLOCK, triton.next_power_of_2(V)))
    return out.reshape(x.shape)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return _rowwise(x, False)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    return _rowwise(x, True)


@triton.jit
def _topk_kernel(x_ptr, v_ptr, i_ptr, E, K: tl.constexpr, BLOCK_E: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_E)
    v = tl.load(x_ptr + row * E + cols, mask=cols < E, other=-float("inf"))
    for j in tl.static_range(K):
        best = tl.max(v, axis=0)
        idx = tl.min(tl.where(v == best, cols, BLOCK_E), axis=0)  # ties: the lower index
        tl.store(v_ptr + row * K + j, best)
        tl.store(i_ptr + row * K + j, idx.to(tl.int64))
        v = tl.where(cols == idx, -float("inf"), v)


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    E = x.shape[-1]
    flat = x.reshape(-1, E).float().contiguous()
    vals = torch.empty(flat.shape[0], k, dtype=torch.float32, device=x.device)
    ids = torch.empty(flat.shape[0], k, dtype=torch.int64, device=x.device)
    _topk_kernel[(flat.shape[0],)](flat, vals, ids, E, K=k, BLOCK_E=triton.next_power_of_2(E))
    return vals.reshape(*x.shape[:-1], k), ids.reshape(*x.shape[:-1], k)


# ---------------------------------------------------------------------------------------------- delta
@triton.jit
def _xor_kernel(a_ptr, b_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, tl.load(a_ptr + offs, mask=m) ^ tl.load(b_ptr + offs, mask=m), mask=m)


@triton.jit
def _split_kernel(x_ptr, o_ptr, n, ITEMSIZE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0).to(tl.int32)
    for k in tl.static_range(ITEMSIZE):
        tl.store(o_ptr + k * n + offs, ((x >> (8 * k)) & 0xFF).to(tl.uint8), mask=m)


@triton.jit
def _join_kernel(p_ptr, o_ptr, n, ITEMSIZE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for k in tl.static_range(ITEMSIZE):  # & 0xFF: on_host hands planes over as int8, whose cast sign-extends
        acc = acc | ((tl.load(p_ptr + k * n + offs, mask=m, other=0).to(tl.int32) & 0xFF) << (8 * k))
    tl.store(o_ptr + offs, acc.to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def _count_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(partial_ptr + pid, tl.sum((x != 0).to(tl.int32), axis=0))


_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A signed integer view of the same bits (Triton and torch agree on those for every width)."""
    return t.view(_SIGNED[t.element_size()]) if t.dtype.is_floating_point or t.dtype == torch.uint8 else t


def xor(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = _bits(a.contiguous().reshape(-1)), _bits(b.contiguous().reshape(-1))
    out = torch.empty_like(a)
    _xor_kernel[(triton.cdiv(a.numel(), ELEMS),)](a, b, out, a.numel(), BLOCK=ELEMS)
    return out


def split_planes(x: torch.Tensor) -> torch.Tensor:
    x = _bits(x.contiguous().reshape(-1))
    out = torch.empty(x.numel() * x.element_size(), dtype=torch.uint8, device=x.device)
    _split_kernel[(triton.cdiv(x.numel(), ELEMS),)](x, out, x.numel(), ITEMSIZE=x.element_size(), BLOCK=ELEMS)
    return out


def join_planes(planes: torch.Tensor, itemsize: int, n: int) -> torch.Tensor:
    out = torch.empty(n, dtype=_SIGNED[itemsize], device=planes.device)
    _join_kernel[(triton.cdiv(n, ELEMS),)](planes.contiguous(), out, n, ITEMSIZE=itemsize, BLOCK=ELEMS)
    return out


def count_nonzero(x: torch.Tensor) -> int:
    x = _bits(x.contiguous().reshape(-1))
    grid = triton.cdiv(x.numel(), ELEMS)
    partial = torch.empty(grid, dtype=torch.int32, device=x.device)
    _count_kernel[(grid,)](x, partial, x.numel(), BLOCK=ELEMS)
    return int(partial.sum().item())


# ---------------------------------------------------------------------------------------------- numpy glue
def _to_device(a: np.ndarray) -> torch.Tensor:
    signed = a.view({1: np.int8, 2: np.int16, 4: np.int32}[a.itemsize])
    t = torch.from_numpy(np.ascontiguousarray(signed))
    return t.cuda() if torch.cuda.is_available() else t


def on_host(fn, *arrays_and_args):
    """Run a delta kernel on numpy arrays (uint views) and return numpy (the same unsigned view)."""
    if fn is join_planes:
        planes, view, n = arrays_and_args
        out = join_planes(_to_device(planes), view.itemsize, n)
        return out.cpu().numpy().view(view)
    tensors = [_to_device(a) for a in arrays_and_args]
    out = fn(*tensors)
    if isinstance(out, int):
        return out
    first = arrays_and_args[0]
    result = out.cpu().numpy()
    return result.view(np.uint8) if fn is split_planes else result.view(first.dtype)
