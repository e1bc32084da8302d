"""kernels/ on this CPU, side by side in one run.

(a) delta coding of a 64 MB bf16 tensor against its base (10% of elements changed), in GB/s of the tensor's
    bytes against a plain memory copy (np.copyto, one thread) of the same bytes: RUNS runs of the best of 5
    rounds that run every candidate in turn (a burst of load on a shared machine then hits all alike); each
    figure is the median of the runs' (scan_vs_memcpy_runs: every run's scan ratio), `cpu` the CPU the
    kernels were compiled for (LLVM's name: what a figure depends on, see kernels.simd):
      xor_split, xor, join_xor   today's whole-array numpy steps (the fallback without numba): the XOR +
                                 byte planes + changed count, the XOR alone, and the inverse (join + XOR);
      scan                       the encoder's one pass as weight_sync.codec runs it (codec.scan_chunk, chunk
                                 by chunk into its per-thread scratch): byte planes of the XOR, the count and
                                 the changed positions up to the sparse cap;
      scatter                    the decoder's dense pass (delta.join_xor into the output, chunk by chunk),
                                 in bytes written;
      sparse_scatter             the decoder's sparse pass (delta.sparse_patch: the base copied into the
                                 output with the chunk's changes XORed in), in bytes written.
    The fused kernels are single-threaded (the codec runs chunks on a thread pool), so one thread each;
(b) the batch-invariant mode's cost: the trainer-shaped forward in batch-invariant mode against the default
    ops, alternating, best of 7: the demo model size (16 sequences of 60 tokens) and a larger one
    (online_rl.gpu_check.batch_invariant's 0.11 B-parameter shape, 8 sequences of 128 tokens), router replay off;
(c) whether the default ops are batch-variant here: the largest difference between a sequence's logprobs
    alone and inside that batch, for both modes (0 for the batch-invariant one, by construction).
Prints one JSON object as the last line, with the machine's load average at its start and end.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np
import torch

from kernels import batch_invariant as bi, delta
from weight_sync import codec

N_BYTES = 64 * 2**20
RUNS = 5  # runs of the delta candidates: their median is the figure


def _best(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _side_by_side(fns: dict, rounds: int) -> dict:
    """Best seconds of each candidate over rounds that run every one in turn."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def _codec_chunks(new: np.ndarray, base: np.ndarray) -> list[tuple[slice, np.ndarray, np.ndarray, int]]:
    """Per chunk of codec's size: its slice, the byte planes of its XOR and its sparse payload (and count)."""
    out = []
    for o in range(0, new.size, codec.DEFAULT_CHUNK_ELEMS):
        sl = slice(o, min(o + codec.DEFAULT_CHUNK_ELEMS, new.size))
        x = new[sl] ^ base[sl]
        positions = np.flatnonzero(x).astype(np.uint32)
        body = np.empty((4 + x.itemsize) * positions.size, np.uint8)
        delta.sparse_payload(positions, delta.split_planes(x), x.size, body)
        out.append((sl, delta.split_planes(x), body, positions.size))
    return out


def delta_throughput() -> dict:
    rng = np.random.default_rng(0)
    n = N_BYTES // 2
    base = rng.integers(0, 2**16, n, dtype=np.uint16)
    new = base.copy()
    idx = rng.choice(n, n // 10, replace=False)
    new[idx] ^= np.uint16(1)
    dst, out = np.empty_like(new), np.empty_like(new)
    _, planes, _ = delta.xor_split(new, base)
    chunks = _codec_chunks(new, base)

    def scan():
        for sl, _, _, _ in chunks:
            codec.scan_chunk(new[sl], base[sl])

    def scatter():
        for sl, chunk_planes, _, _ in chunks:
            delta.join_xor(chunk_planes, base[sl], out[sl])

    def sparse_scatter():
        for sl, _, body, k in chunks:
            delta.sparse_patch(body, k, base[sl], out[sl])

    fns = {
        "memcpy": lambda: np.copyto(dst, new),
        "xor_split": lambda: delta.xor_split(new, base),
        "xor": lambda: delta.xor(new, base),
        "join_xor": lambda: delta.xor(delta.join_planes(planes, np.uint16, n), base),
        "scan": scan,
        "scatter": scatter,
        "sparse_scatter": sparse_scatter,
    }
    scan()  # compile or load the kernels, fill the scratch's pages
    for fn in (scatter, sparse_scatter):
        out[:] = 0
        fn()
        assert np.array_equal(out, new), f"{fn.__name__} did not rebuild the new bits"
    runs = [_side_by_side(fns, 5) for _ in range(RUNS)]
    gbps = lambda name: round(statistics.median(N_BYTES / r[name] / 1e9 for r in runs), 2)  # noqa: E731
    ratios = lambda name: [round(r["memcpy"] / r[name], 3) for r in runs]  # noqa: E731
    vs_memcpy = lambda name: round(statistics.median(ratios(name)), 3)  # noqa: E731
    return {
        "memcpy_gbps": gbps("memcpy"),
        "xor_split_gbps": gbps("xor_split"),
        "xor_gbps": gbps("xor"),
        "join_xor_gbps": gbps("join_xor"),
        "xor_split_vs_memcpy": vs_memcpy("xor_split"),
        "scan_gbps": gbps("scan"),
        "scan_vs_memcpy": vs_memcpy("scan"),
        "scan_vs_memcpy_median": vs_memcpy("scan"),
        "scan_vs_memcpy_runs": ratios("scan"),
        "delta_runs": RUNS,
        "scatter_gbps": gbps("scatter"),
        "scatter_vs_memcpy": vs_memcpy("scatter"),
        "sparse_scatter_gbps": gbps("sparse_scatter"),
        "sparse_scatter_vs_memcpy": vs_memcpy("sparse_scatter"),
        "delta_backend": delta.backend(),
        "delta_cpu_kernels": "numba" if delta.cpu_ops() is not None else "numpy",
        "cpu": _cpu_name(),
    }


def _cpu_name() -> str:
    """The CPU LLVM compiles the kernels for (e.g. znver4, sapphirerapids), "unknown" without llvmlite."""
    try:
        from llvmlite import binding
    except ImportError:
        return "unknown"
    return binding.get_host_cpu_name()


def _forward_slowdown(cfg, batch_size: int, seq_len: int, reps: int) -> tuple[float, float]:
    """Best-of-`reps` seconds of the trainer-shaped forward (logits, then the tokens' logprobs), default ops
    and batch-invariant mode alternating so both see the same machine."""
    from online_rl.model.transformer import MoECoder, token_logprobs

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
    from online_rl.gpu_check.batch_invariant import BI_CFG
    from online_rl.model.bootstrap import preset
    from online_rl.model.transformer import MoECoder, token_logprobs

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
    load = os.getloadavg()[0]
    out = {**delta_throughput(), **batch_invariance(), "threads": torch.get_num_threads()}
    # how busy the machine was (runnable processes, 1-minute average, at the start and the end): on a
    # shared machine the figures above are only as steady as this
    return {**out, "load_avg_1min": [round(load, 1), round(os.getloadavg()[0], 1)]}


if __name__ == "__main__":
    print(json.dumps(main()))
