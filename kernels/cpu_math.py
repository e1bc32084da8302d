"""exp, log, silu, (log-)softmax and RMS normalisation in float32 whose result for an element never depends
on where it sits (numba, CPU): kernels.batch_invariant's transcendentals and row kernels.

Why not torch.exp: PyTorch evaluates a contiguous run's vector body with SLEEF and its tail (and each
thread's chunk tail) with the scalar libm call, which can differ in the last bit, so an element's exp
depends on the tensor's length and its position in it. Here every element runs the same fixed sequence
of float32 operations (+, -, *, /, floor, sqrt: each exactly rounded wherever it runs; no FMA contraction,
which numba leaves off without fastmath: the compiled loop is AVX vmulps/vaddps for the body and
vmulss/vaddss for the tail, the same arithmetic), so the two agree bit for bit. A row's sum is the pairwise
tree of kernels.batch_invariant.tree_sum, its shape fixed by the row's length. One pass over memory, GIL
released (big tensors are cut into one slice per torch thread); autograd wraps each.

    exp(x)  x = n ln2 + r, |r| <= ln2 / 2 (Cody-Waite: ln2 in two parts, so n ln2 is exact to ~2^-40),
            exp(r) by its degree-7 Taylor polynomial (error < r^8 / 8! ~ 5e-9 relative), times 2^n built
            from the exponent bits. Below -87.3 (where float32 goes subnormal) it is 0, -inf included;
            above 88.7 it is inf. Within 2 ulp of float64's (tests/unit/kernels/test_kernels_cpu_math.py).
    log(x)  x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s), s = (m - 1) / (m + 1), by its
            series to s^11 (|s| < 0.172: error < 1e-10), plus e ln2. 0 -> -inf, inf -> inf, < 0 -> nan.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from numba import njit

from kernels import jit_cache

jit_cache.install()  # before the first @njit: the machine code kept by content (kernels.jit_cache)

_F = np.float32
_LOG2E = _F(1.4426950408889634)
_LN2_HI = _F(0.693145751953125)  # ln2's leading 16 bits: n * _LN2_HI is exact for |n| < 2^8
_LN2_LO = _F(1.4286068203094172e-06)
_LO, _HI = _F(-87.33654), _F(88.72283)  # exp underflows to subnormals below, overflows above
_E = tuple(_F(1 / f) for f in (1, 2, 6, 24, 120, 720, 5040))  # 1/k!
_ATANH = tuple(_F(1 / k) for k in (3, 5, 7, 9, 11))
_SQRT_HALF = _F(0.70710677)
_MIN_NORMAL = _F(1.1754944e-38)
_SUBNORMAL_SCALE = _F(2.0**23)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _exp1(v):  # pragma: no cover - compiled
    c1, c2, c3, c4, c5, c6, c7 = _E
    c = v if _LO <= v <= _HI else _F(0.0)  # out of range (NaN too): replaced below
    n = np.floor(c * _LOG2E + _F(0.5))
    r = (c - n * _LN2_HI) - n * _LN2_LO
    p = _F(1.0) + r * (c1 + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * (c6 + r * c7))))))
    # 2^n as two factors: n reaches 128 at the top of the range, one past float32's largest exponent
    k = np.int32(n)
    h = k >> 1
    y = p * np.int32((h + 127) << 23).view(np.float32) * np.int32((k - h + 127) << 23).view(np.float32)
    if v < _LO:
        y = _F(0.0)
    elif v > _HI:
        y = _F(np.inf)
    elif v != v:
        y = v
    return y


@njit(cache=True, nogil=True, error_model="numpy")
def _exp(x, out):  # pragma: no cover - compiled
    # x, out: float32 (n,), contiguous
    for i in range(x.size):
        out[i] = _exp1(x[i])


@njit(cache=True, nogil=True, error_model="numpy")
def _silu(x, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = x[i] / (_F(1.0) + _exp1(-x[i]))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _pow2_at_least(n):  # pragma: no cover - compiled
    w = 1
    while w < n:
        w *= 2
    return w


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _tree_total(buf, n):  # pragma: no cover - compiled
    # The sum of buf[:n] by kernels.batch_invariant.tree_sum's pairwise tree: zeros up to a power of two, then
    # each half added onto the first (the same adds in the same order). Overwrites buf.
    for j in range(n, buf.size):
        buf[j] = _F(0.0)
    w = buf.size
    while w > 1:
        w //= 2
        for j in range(w):
            buf[j] = buf[j] + buf[j + w]
    return buf[0]


@njit(cache=True, nogil=True, error_model="numpy")
def _softmax_rows(x, out, log):  # pragma: no cover - compiled
    # x, out: float32 (R, D), contiguous. Per row: the max, exp(x - max), their sum by the pairwise tree, then
    # divide by it or subtract its log.
    R, D = x.shape
    buf = np.zeros(_pow2_at_least(D), np.float32)
    for i in range(R):
        top = x[i, 0]
        for j in range(1, D):
            top = max(top, x[i, j])
        for j in range(D):
            buf[j] = _exp1(x[i, j] - top)
        total = _tree_total(buf, D)
        if log:
            lse = _log1(total)
            for j in range(D):
                out[i, j] = (x[i, j] - top) - lse
        else:
            for j in range(D):
                out[i, j] = _exp1(x[i, j] - top) / total


@njit(cache=True, nogil=True, error_model="numpy")
def _rms_rows(x, out, eps):  # pragma: no cover - compiled
    # x, out: float32 (R, D). Per row: x / sqrt(mean(x^2) + eps), the squares summed by the pairwise tree.
    R, D = x.shape
    buf = np.zeros(_pow2_at_least(D), np.float32)
    for i in range(R):
        for j in range(D):
            buf[j] = x[i, j] * x[i, j]
        den = np.sqrt(_tree_total(buf, D) / _F(D) + eps)
        for j in range(D):
            out[i, j] = x[i, j] / den


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _log1(v):  # pragma: no cover - compiled
    a3, a5, a7, a9, a11 = _ATANH
    sub = _F(0.0) < v < _MIN_NORMAL  # subnormal: scaled into the normal range, 23 taken off after
    u = v * _SUBNORMAL_SCALE if sub else v
    bits = np.float32(u).view(np.int32)
    e = ((bits >> 23) & 0xFF) - 126  # u = m 2^e, m in [0.5, 1)
    m = np.int32((bits & 0x007FFFFF) | 0x3F000000).view(np.float32)
    if m < _SQRT_HALF:
        m = m * _F(2.0)
        e -= 1
    if sub:
        e -= 23
    s = (m - _F(1.0)) / (m + _F(1.0))
    z = s * s
    t = _F(1.0) + z * (a3 + z * (a5 + z * (a7 + z * (a9 + z * a11))))
    fe = _F(e)
    y = fe * _LN2_HI + (_F(2.0) * s * t + fe * _LN2_LO)
    if v != v or v < 0:
        y = _F(np.nan)
    elif v == 0:
        y = _F(-np.inf)
    elif v == np.inf:
        y = v
    return y


@njit(cache=True, nogil=True, error_model="numpy")
def _log(x, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = _log1(x[i])


PARALLEL_MIN = 1 << 18  # elements: below this one thread is faster than handing out the halves


@functools.lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, torch.get_num_threads()), thread_name_prefix="cpu-math")


def _apply(kernel, x: torch.Tensor, *args, rows: int = 0) -> torch.Tensor:
    """kernel(src, out, *args) over x's elements (rows=0) or its rows of length `rows`, in float32."""
    src = x.detach().contiguous().numpy().reshape(-1, rows) if rows else x.detach().contiguous().view(-1).numpy()
    out = np.empty_like(src)
    parts = min(torch.get_num_threads(), src.size // PARALLEL_MIN, len(src))
    if parts <= 1:
        kernel(src, out, *args)
    else:  # the kernels release the GIL: slices side by side (each element's steps are the same either way)
        cut = np.linspace(0, len(src), parts + 1).astype(np.int64)
        list(_pool().map(lambda i: kernel(src[cut[i] : cut[i + 1]], out[cut[i] : cut[i + 1]], *args), range(parts)))
    return torch.from_numpy(out).view(x.shape)


class _Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = _apply(_exp, x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


class _Log(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _apply(_log, x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad / x


def exp(x: torch.Tensor) -> torch.Tensor:
    """exp of a float32 CPU tensor, each element by the same float32 steps."""
    _check(x, "exp")
    return _Exp.apply(x)


def log(x: torch.Tensor) -> torch.Tensor:
    """log of a float32 CPU tensor, each element by the same float32 steps."""
    _check(x, "log")
    return _Log.apply(x)


class _Silu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _apply(_silu, x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * s * (1 + x * (1 - s))


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log):
        y = _apply(_softmax_rows, x, log, rows=x.shape[-1])
        ctx.save_for_backward(y)
        ctx.log = log
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        if ctx.log:
            return grad - y.exp() * grad.sum(-1, keepdim=True), None
        return y * (grad - (grad * y).sum(-1, keepdim=True)), None


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x) = x / (1 + exp(-x)), each element by the same float32 steps."""
    _check(x, "silu")
    return _Silu.apply(x)


def softmax(x: torch.Tensor, log: bool = False) -> torch.Tensor:
    """(log-)softmax over the last dim: max, exp, the fixed pairwise tree over the row (one pass per row)."""
    _check(x, "softmax")
    if x.numel() == 0 or x.shape[-1] == 0:
        return x.clone()
    return _Softmax.apply(x, log)


def _check(x: torch.Tensor, name: str) -> None:
    if x.dtype != torch.float32 or x.is_cuda:
        raise TypeError(f"cpu_math.{name} takes a float32 CPU tensor, got {x.dtype} on {x.device}")


class _RmsNormalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, eps):
        y = _apply(_rms_rows, x, np.float32(eps), rows=x.shape[-1])
        ctx.save_for_backward(x, y)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps)
        return r * (grad - y * (grad * y).mean(-1, keepdim=True)), None


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, the squares summed by the fixed pairwise tree."""
    _check(x, "rms_normalize")
    if x.numel() == 0:
        return x.clone()
    return _RmsNormalize.apply(x, eps)
