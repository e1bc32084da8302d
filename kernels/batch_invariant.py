"""Batch-invariant ops for the trainer's forward: a row's result never depends on how many other rows
share its batch, or where it sits.

Why it is not automatic: a library matmul or reduction picks its blocking, vector width and thread split
from the whole tensor's shape, so one row's sum is added in a different order alone than inside a batch;
the last-bit differences flip near-tied MoE routing decisions and skew logprobs between serving and
training. Here no reduction's order depends on the batch:
    linear      rows go through the library GEMM in tiles of exactly TILE rows (padded with zeros to whole
                tiles, two at least), one batched call: every product this mode asks for has the shape
                (TILE, K) @ (K, N), one per thread, whatever the batch. A shape alone does not fix the
                library's choices (MKL splits K across threads for a lone GEMM, not in a batch of them),
                hence the second tile; inside a batch an output element's sum depends neither on its
                row's position nor on the other rows (tested at every position, and at K = 2048)
    rms_norm    a pairwise tree over the hidden size (its shape depends on that length alone)
    softmax     max (exact), exp, the tree over the row; log_softmax likewise
    attention   queries and keys in blocks of TILE positions (the sequence padded to a whole block): the
                scores and the weighted values are per-block GEMMs of fixed shape, the blocks' partial
                outputs summed by the tree over key blocks. Keys past a query (future or padding) weigh
                exactly 0, and zeros added by a longer padded batch leave the tree's sums unchanged
    topk        a stable descending sort: ties go to the lower expert index
Transcendentals (exp, log; sigmoid in silu) come from kernels.cpu_math: the same float32 steps for every
element, where torch's exp takes a different code path for a run's tail than for its vector body. Only
exactly rounded IEEE operations (+, *, /, sqrt) touch float32 data otherwise, and those agree wherever they
run. (The model's RoPE angles are computed in float64 by online_rl.model.transformer itself, once per forward.)

CUDA tensors go to the Triton kernels (kernels.triton_ops), which are batch-invariant by construction:
fixed tiles, no split-K, one program per row. `enabled()` / `mode(True)` switch the model over
(online_rl.model.transformer reads it at every forward).
"""

from __future__ import annotations

import contextlib
import math
import threading

import torch

_state = threading.local()
TILE = 64  # rows per GEMM (and positions per attention block): big enough for the library's fast path


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


def _cpu_math():
    from kernels import cpu_math  # numba: compiled (or loaded from its cache) on first use

    return cpu_math


def _f32(fn, x: torch.Tensor) -> torch.Tensor:
    """fn evaluated in float32 (on CPU by kernels.cpu_math; other dtypes go through float32 and back)."""
    if x.is_cuda:  # a GPU's exp is one code path for every element; float64 makes its rounding moot
        return getattr(torch, fn)(x.double()).to(x.dtype)
    return getattr(_cpu_math(), fn)(x.float()).to(x.dtype)


def exp(x: torch.Tensor) -> torch.Tensor:
    return _f32("exp", x)


def log(x: torch.Tensor) -> torch.Tensor:
    return _f32("log", x)


def silu(x: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        return torch.nn.functional.silu(x.double()).to(x.dtype)
    return _cpu_math().silu(x.float()).to(x.dtype)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., K) @ w (N, K)^T -> (..., N)."""
    if _triton(x):
        from kernels import triton_ops

        return triton_ops.linear(x, w)
    lead, K = x.shape[:-1], x.shape[-1]
    N = w.shape[0]
    flat = x.reshape(-1, K)  # (M, K)
    M = flat.shape[0]
    # K padded with zeros to whole 16-float vectors (the sum is unchanged: each added term is an exact 0):
    # for a K off that grid MKL's kernel handles the K tail by a row's position in the tile, so a row at
    # position 1 summed differently from one at 0 (measured on an AMD EPYC, AVX-512 MKL, 105 placements per
    # K: K=7 -> 55 differed, K=13 -> 60, K=3, 33, 64, 96 -> none; padded to 16, none for any).
    if K % 16:
        flat = torch.nn.functional.pad(flat, (0, -K % 16))
        w = torch.nn.functional.pad(w, (0, -K % 16))
        K = flat.shape[1]
    # Padded with zeros to whole tiles, and to two at least: MKL runs a batch of one GEMM on all threads,
    # splitting K among them for a large K (a different sum), and a batch of several one GEMM per thread.
    pad = max(2 * TILE, M + (-M) % TILE) - M
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad, K)])
    tiles = flat.reshape(-1, TILE, K)
    out = torch.bmm(tiles, w.t().expand(tiles.shape[0], K, N))  # one (TILE, K) @ (K, N) per tile
    return out.reshape(-1, N)[:M].reshape(*lead, N)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _triton(x):
        from kernels import triton_ops

        return triton_ops.rms_norm(x, weight, eps)
    return weight * _cpu_math().rms_normalize(x.float(), eps).to(x.dtype)


def softmax(x: torch.Tensor) -> torch.Tensor:
    if _triton(x):
        from kernels import triton_ops

        return triton_ops.softmax(x)
    return _cpu_math().softmax(x.float()).to(x.dtype)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    if _triton(x):
        from kernels import triton_ops

        return triton_ops.log_softmax(x)
    return _cpu_math().softmax(x.float(), log=True).to(x.dtype)


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
    if q.is_cuda:
        return _causal_attention_by_key(q, k, v)
    pad = (-T) % TILE
    n = (T + pad) // TILE  # blocks of TILE positions

    def blocks(t: torch.Tensor) -> torch.Tensor:  # (B, H, T, Dh) -> (B * H, n, TILE, Dh)
        return torch.nn.functional.pad(t, (0, 0, 0, pad)).reshape(B * H, n, TILE, Dh)

    qb, kb, vb = blocks(q), blocks(k), blocks(v)
    # scores of query block i against key block j: (B*H, n, n, TILE, TILE), GEMMs of shape (TILE, Dh) @ (Dh, TILE)
    scores = torch.matmul(qb[:, :, None], kb[:, None].transpose(-1, -2)) * (1.0 / math.sqrt(Dh))
    pos = torch.arange(n * TILE, device=q.device).reshape(n, 1, TILE, 1)  # query positions (i, ., a, .)
    future = pos.reshape(1, n, 1, TILE) > pos  # key position (j, b) past query (i, a): (n, n, TILE, TILE)
    scores = scores.masked_fill(future, float("-inf"))
    top = scores.amax(dim=(2, 4), keepdim=True)  # (B*H, n, 1, TILE, 1): each query's largest score
    e = exp(scores - top)  # exp(-inf) = 0: future and padding keys weigh exactly nothing
    den = tree_sum(tree_sum(e).transpose(-1, -2))  # over keys in a block, then over key blocks: (B*H, n, TILE)
    part = torch.matmul(e, vb[:, None])  # (B*H, n, n, TILE, Dh): GEMMs of shape (TILE, TILE) @ (TILE, Dh)
    num = tree_sum(part.permute(0, 1, 3, 4, 2))  # over key blocks: (B*H, n, TILE, Dh)
    out = num / den[..., None]
    return out.reshape(B, H, n * TILE, Dh)[:, :, :T]


def _causal_attention_by_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The GPU's path (no Triton kernel for attention yet; cuBLAS picks its kernels by the batch count too):
    scores by the tree over the head dim, keys accumulated left to right. q/k/v (B, H, T, Dh)."""
    B, H, T, Dh = q.shape
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
