"""Batch-invariant ops for the trainer's forward: a row's result never depends on how many other rows
share its batch, or where it sits.

Why it is not automatic: a library matmul or reduction picks its blocking, vector width and thread split
from the whole tensor's shape, so one row's sum is added in a different order alone than inside a batch;
the last-bit differences flip near-tied MoE routing decisions and skew logprobs between serving and
training. Here every reduction has an order fixed by the reduced length alone:
    linear      products x_k * w_k, then a pairwise tree over K (padded with zeros to a power of two)
    rms_norm    the same tree over the hidden size
    softmax     max (exact), exp, the tree over the row; log_softmax likewise
    attention   scores by the tree over the head dim; keys accumulated left to right, so the zero
                contributions of padding and of future positions change nothing
    topk        a stable descending sort: ties go to the lower expert index
Transcendentals (exp, log, sigmoid, cos/sin) are evaluated in float64 and rounded to float32: a CPU
library computes vector lanes and scalar tails with different code, which can differ in the last bit of
a float32 but (after rounding from float64) essentially never. Only elementwise IEEE operations (+, *,
/, sqrt) touch float32 data otherwise, and those are exactly rounded wherever they run.

CUDA tensors go to the Triton kernels (kernels.triton_ops), which are batch-invariant by construction:
fixed tiles, no split-K, one program per row. `enabled()` / `mode(True)` switch the model over
(online_rl.model reads it at every forward).
"""

from __future__ import annotations

import contextlib
import math
import threading

import torch

_state = threading.local()
ROW_CHUNK_BYTES = 32 * 2**20  # bound on the (rows, N, K) products linear materialises at once


def enabled() -> bool:
    return getattr(_state, "on", False)


def set_enabled(on: bool) -> None:
    _state.on = bool(on)


@contextlib.contextmanager
def mode(on: bool = True):
    before = enabled()
    set_enabled(on)
    try:
        yield
    finally:
        set_enabled(before)


def _triton(x: torch.Tensor) -> bool:
    return x.is_cuda


def tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim by a pairwise tree whose shape depends only on that dim's length."""
    n = x.shape[-1]
    width = 1 << max(0, math.ceil(math.log2(max(n, 1))))
    if width != n:
        x = torch.nn.functional.pad(x, (0, width - n))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x.double()).to(x.dtype)


def log(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x.double()).to(x.dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x.double()).to(x.dtype)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., K) @ w (N, K)^T -> (..., N)."""
    if _triton(x):
        from kernels import triton_ops

        return triton_ops.linear(x, w)
    lead, K = x.shape[:-1], x.shape[-1]
    N = w.shape[0]
    flat = x.reshape(-1, K)
    rows = max(1, ROW_CHUNK_BYTES // max(1, N * K * x.element_size()))
    out = [tree_sum(flat[i : i + rows, None, :] * w[None, :, :]) for i in range(0, flat.shape[0], rows)]
    return (torch.cat(out) if out else flat.new_zeros(0, N)).reshape(*lead, N)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _triton(x):
        from kernels import triton_ops

        return triton_ops.rms_norm(x, weight, eps)
    dtype = x.dtype
    x = x.float()
    ms = tree_sum(x * x) / x.shape[-1]
    return weight * (x / torch.sqrt(ms + eps)[..., None]).to(dtype)


def softmax(x: torch.Tensor) -> torch.Tensor:
    if _triton(x):
        from kernels import triton_ops

        return triton_ops.softmax(x)
    e = exp(x - x.amax(-1, keepdim=True))
    return e / tree_sum(e)[..., None]


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    if _triton(x):
        from kernels import triton_ops

        return triton_ops.log_softmax(x)
    shifted = x - x.amax(-1, keepdim=True)
    return shifted - log(tree_sum(exp(shifted)))[..., None]


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest k along the last dim, ties to the lower index (torch.topk leaves ties unspecified)."""
    if _triton(x):
        from kernels import triton_ops

        return triton_ops.topk(x, k)
    values, ids = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], ids[..., :k]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q (B, H, T, Dh), k/v (B, G, T, Dh) with H a multiple of G -> (B, H, T, Dh)."""
    B, H, T, Dh = q.shape
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = tree_sum(q[:, :, :, None, :] * k[:, :, None, :, :]) * (1.0 / math.sqrt(Dh))  # (B, H, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    e = exp(scores - scores.amax(-1, keepdim=True))  # exp(-inf) = 0: future keys add exact zeros
    num = torch.zeros_like(q)
    den = torch.zeros(B, H, T, 1, dtype=q.dtype, device=q.device)
    for j in range(T):  # left to right over keys: trailing zero terms (padding) change nothing
        num = num + e[..., j, None] * v[:, :, None, j, :]
        den = den + e[..., j, None]
    return num / den
