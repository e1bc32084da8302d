"""kernels/ on this CPU, side by side in one run.

(a) delta coding of a 64 MB bf16 tensor against its base (10% of elements changed): the fused XOR + byte
    planes + changed count of kernels.delta, XOR alone, and the inverse (join + XOR), in GB/s of input
    bytes, against a plain memory copy (np.copyto) of the same bytes, best of 5 each;
(b) the batch-invariant mode's cost: the trainer-shaped forward in batch-invariant mode against the default
    ops, alternating, best of 7: the demo model size (16 sequences of 60 tokens) and a larger one
    (online_rl.gpu_check_bi's 0.11 B-parameter shape, 8 sequences of 128 tokens), router replay off;
(c) whether the default ops are batch-variant here: the largest difference between a sequence's logprobs
    alone and inside that batch, for both modes (0 for the batch-invariant one, by construction).
Prints one JSON object as the last line.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import torch

from kernels import batch_invariant as bi, delta

N_BYTES = 64 * 2**20


def _best(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def delta_throughput() -> dict:
    rng = np.random.default_rng(0)
    n = N_BYTES // 2
    base = rng.integers(0, 2**16, n, dtype=np.uint16)
    new = base.copy()
    idx = rng.choice(n, n // 10, replace=False)
    new[idx] ^= np.uint16(1)
    dst = np.empty_like(new)
    memcpy = _best(lambda: np.copyto(dst, new), 5)
    xor_split = _best(lambda: delta.xor_split(new, base), 5)
    xor_only = _best(lambda: delta.xor(new, base), 5)
    x, planes, _ = delta.xor_split(new, base)
    join = _best(lambda: delta.xor(delta.join_planes(planes, np.uint16, n), base), 5)
    gbps = lambda s: round(N_BYTES / s / 1e9, 2)  # noqa: E731
    return {
        "memcpy_gbps": gbps(memcpy),
        "xor_split_gbps": gbps(xor_split),
        "xor_gbps": gbps(xor_only),
        "join_xor_gbps": gbps(join),
        "xor_split_vs_memcpy": round(memcpy / xor_split, 3),
        "delta_backend": delta.backend(),
    }


def _forward_slowdown(cfg, batch_size: int, seq_len: int, reps: int) -> tuple[float, float]:
    """Best-of-`reps` seconds of the trainer-shaped forward (logits, then the tokens' logprobs), default ops
    and batch-invariant mode alternating so both see the same machine."""
    from online_rl.model import MoECoder, token_logprobs

    model = MoECoder(cfg).eval()
    model.init_weights(0)
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(4, cfg.vocab_size, (batch_size, seq_len + 1), generator=g)

    def forward():
        with torch.no_grad():
            return token_logprobs(model(batch[:, :-1]).logits, batch[:, 1:])

    default_s = bi_s = float("inf")
    for _ in range(reps + 1):  # the first round warms both (numba's compile cache, allocator)
        default_s = min(default_s, _best(forward, 1))
        with bi.mode(True):
            bi_s = min(bi_s, _best(forward, 1))
    return default_s, bi_s


def batch_invariance() -> dict:
    from online_rl.bootstrap import preset
    from online_rl.gpu_check_bi import BI_CFG
    from online_rl.model import MoECoder, token_logprobs

    cfg = preset("demo", 0).model
    default_s, bi_s = _forward_slowdown(cfg, 16, 59, reps=7)
    large_default_s, large_bi_s = _forward_slowdown(BI_CFG, 8, 128, reps=3)
    out = {
        "forward_default_s": round(default_s, 4),
        "forward_batch_invariant_s": round(bi_s, 4),
        "batch_invariant_slowdown": round(bi_s / default_s, 2),
        "forward_default_large_s": round(large_default_s, 4),
        "forward_batch_invariant_large_s": round(large_bi_s, 4),
        "batch_invariant_slowdown_large": round(large_bi_s / large_default_s, 2),
    }
    model = MoECoder(cfg).eval()
    model.init_weights(0)
    batch = torch.randint(4, cfg.vocab_size, (16, 60), generator=torch.Generator().manual_seed(0))
    for name, on in (("default", False), ("batch_invariant", True)):
        with bi.mode(on), torch.no_grad():
            full = token_logprobs(model(batch[:, :-1]).logits, batch[:, 1:])[3]
            alone = token_logprobs(model(batch[3:4, :-1]).logits, batch[3:4, 1:])[0]
        out[f"row_alone_vs_batch_max_diff_{name}"] = float((full - alone).abs().max())
    return out


def main() -> dict:
    torch.set_num_threads(os.cpu_count() or 1)
    return {**delta_throughput(), **batch_invariance(), "threads": torch.get_num_threads()}


if __name__ == "__main__":
    print(json.dumps(main()))
