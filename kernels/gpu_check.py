"""The Triton kernels' section of the prepared GPU check (online_rl.gpu_check.check runs it, with the trainer's
FSDP2 step, the delta codec's GPU path and the batch-invariant forward): correctness of every Triton kernel
against the numpy / float64 references on the device, batch invariance on the device, and timings against
the ceilings measured in the same run (device-to-device copy bandwidth; cuBLAS fp32 matmul without TF32).

The entry point lives in online_rl because kernels import nothing of ours (tests/unit/repo/test_import_layers.py);
this module is kernels-only. Needs CUDA and compiled Triton (not TRITON_INTERPRET).
"""

from __future__ import annotations

import os

import numpy as np
import torch


def cuda_bench(fn, reps: int = 20) -> float:
    """Median seconds of fn() on the GPU (CUDA events; warm-up first)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1000)
    return float(np.median(times))


def triton_kernels(log=print) -> dict:
    """The section: {"ok": every check passed, "checks": name -> bool, "timings": name -> number}."""
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        raise RuntimeError("the Triton kernels' check needs a CUDA device and compiled Triton (not TRITON_INTERPRET)")
    from kernels import reference as ref, triton_ops as T

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    checks: dict = {}
    timings: dict = {}

    # ---- ceilings, measured here
    n_bytes = 1 << 30
    src = torch.empty(n_bytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_s = cuda_bench(lambda: dst.copy_(src))
    bandwidth = 2 * n_bytes / copy_s / 1e9  # read + write
    timings["copy_bandwidth_gbps"] = round(bandwidth, 1)
    M = N = K = 8192
    a, b = torch.randn(M, K, device=dev), torch.randn(K, N, device=dev)
    mm_s = cuda_bench(lambda: a @ b, reps=10)
    timings["cublas_fp32_tflops"] = round(2 * M * N * K / mm_s / 1e12, 1)
    log(f"  ceilings: copy {timings['copy_bandwidth_gbps']} GB/s, cuBLAS fp32 {timings['cublas_fp32_tflops']} TFLOP/s")

    # ---- delta kernels: bit-exact against numpy, then GB/s against the copy bandwidth
    rng = np.random.default_rng(0)
    n = 256 * 2**20 // 2
    base = rng.integers(0, 2**16, n, dtype=np.uint16)
    new = base.copy()
    new[rng.random(n) < 0.1] ^= np.uint16(1)
    special = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFFF, 0x0001], np.uint16)
    new[:7], base[:7] = special, special[::-1]
    gn, gb = torch.from_numpy(new.view(np.int16)).to(dev), torch.from_numpy(base.view(np.int16)).to(dev)
    x = T.xor(gn, gb)
    planes = T.split_planes(x)
    want_x = new ^ base
    checks["xor_bit_exact"] = bool(np.array_equal(x.cpu().numpy().view(np.uint16), want_x))
    want_planes = np.ascontiguousarray(want_x.view(np.uint8).reshape(-1, 2).T).reshape(-1)
    checks["split_bit_exact"] = bool(np.array_equal(planes.cpu().numpy(), want_planes))
    checks["join_bit_exact"] = bool(np.array_equal(T.join_planes(planes, 2, n).cpu().numpy().view(np.uint16), want_x))
    checks["count_exact"] = T.count_nonzero(x) == int(np.count_nonzero(want_x))
    nb = new.nbytes
    for name, fn, moved in (
        ("xor", lambda: T.xor(gn, gb), 3 * nb),
        ("split_planes", lambda: T.split_planes(x), 2 * nb),
        ("join_planes", lambda: T.join_planes(planes, 2, n), 2 * nb),
        ("count_nonzero", lambda: T.count_nonzero(x), nb),
    ):
        s = cuda_bench(fn)
        timings[f"{name}_gbps"] = round(moved / s / 1e9, 1)
        timings[f"{name}_share_of_copy_bandwidth"] = round(moved / s / 1e9 / bandwidth, 3)

    log(f"  delta kernels: bit-exact {all(checks.values())}, xor {timings['xor_gbps']} GB/s")

    # ---- batch-invariant ops: reference tolerance and invariance on the device
    g = torch.Generator(device="cpu").manual_seed(0)
    w = torch.randn(1000, 512, generator=g)
    xs = torch.randn(257, 512, generator=g)
    full = T.linear(xs.to(dev), w.to(dev)).cpu()
    checks["linear_vs_float64"] = bool(torch.allclose(full.double(), ref.linear(xs, w), rtol=1e-4, atol=1e-4))
    checks["linear_batch_invariant"] = all(
        torch.equal(T.linear(xs[i : i + k].to(dev), w.to(dev)).cpu()[0], full[i])
        for i, k in ((0, 1), (100, 1), (100, 7), (250, 3))
    )
    logits = torch.randn(33, 50_000, generator=g) * 5
    for name, op, r in (("softmax", T.softmax, ref.softmax), ("log_softmax", T.log_softmax, ref.log_softmax)):
        out = op(logits.to(dev)).cpu()
        checks[f"{name}_vs_float64"] = bool(torch.allclose(out.double(), r(logits), rtol=1e-4, atol=1e-6))
        checks[f"{name}_batch_invariant"] = all(
            torch.equal(op(logits[i : i + 1].to(dev)).cpu()[0], out[i]) for i in (0, 17)
        )
    hidden = torch.randn(65, 2048, generator=g)
    weight = torch.rand(2048, generator=g) + 0.5
    out = T.rms_norm(hidden.to(dev), weight.to(dev), 1e-6).cpu()
    checks["rms_norm_vs_float64"] = bool(
        torch.allclose(out.double(), ref.rms_norm(hidden, weight, 1e-6), rtol=1e-4, atol=1e-5)
    )
    checks["rms_norm_batch_invariant"] = torch.equal(
        T.rms_norm(hidden[5:6].to(dev), weight.to(dev), 1e-6).cpu()[0], out[5]
    )
    probs = torch.softmax(torch.randn(4096, 64, generator=g), -1)
    probs[0, 3] = probs[0, 9] = probs[0].max() + 0.1  # a tie: the lower index must win
    v, i = T.topk(probs.to(dev), 8)
    rv, ri = ref.topk(probs, 8)
    checks["topk_matches_reference"] = bool(torch.equal(i.cpu(), ri) and torch.equal(v.cpu(), rv))

    Mb, Kb, Nb = 8192, 4096, 4096
    xa, wb = torch.randn(Mb, Kb, device=dev), torch.randn(Nb, Kb, device=dev)
    lin_s = cuda_bench(lambda: T.linear(xa, wb), reps=10)
    timings["linear_tflops"] = round(2 * Mb * Nb * Kb / lin_s / 1e12, 2)
    timings["linear_share_of_cublas_fp32"] = round(timings["linear_tflops"] / timings["cublas_fp32_tflops"], 3)
    big = torch.randn(8192, 32768, device=dev)
    sm_s = cuda_bench(lambda: T.log_softmax(big))
    timings["log_softmax_gbps"] = round(2 * big.numel() * 4 / sm_s / 1e9, 1)
    timings["log_softmax_share_of_copy_bandwidth"] = round(timings["log_softmax_gbps"] / bandwidth, 3)

    log(f"  row ops: linear {timings['linear_tflops']} TFLOP/s, log_softmax {timings['log_softmax_gbps']} GB/s")
    return {"ok": all(checks.values()), "checks": checks, "timings": timings}
