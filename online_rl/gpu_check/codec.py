"""Section 3 of the prepared GPU check: the delta codec's GPU path.

The codec (weight_sync.codec) calls kernels.delta, which sends arrays of MIN_GPU_BYTES or more through
triton_ops.on_host when a GPU is present: numpy in, copied to the device, the Triton kernel, copied back.
Checked here: each of those calls and whole encode_tensor / decode_tensor runs give the same bits (frames
included) as the numpy path, for bf16 deltas (sparse and planes chunks) and an fp32 full snapshot; and the
GPU path's throughput, host to host, against the ceiling of its own transfers (pageable host-to-device and
device-to-host copies of the same bytes, measured here) and against the numpy path.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from kernels import delta, triton_ops
from online_rl.gpu_check.sections import Budget, wall_bench
from weight_sync import codec

SPECIAL_BF16 = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFFF, 0x0001, 0x8001], np.uint16)


@contextlib.contextmanager
def numpy_path():
    """kernels.delta on numpy whatever the size (the reference the GPU path must match)."""
    before = delta.MIN_GPU_BYTES
    delta.MIN_GPU_BYTES = 1 << 62
    try:
        yield
    finally:
        delta.MIN_GPU_BYTES = before


@contextlib.contextmanager
def counting_gpu_calls():
    """Counts triton_ops.on_host calls (kernels.delta looks it up at each call): proof the GPU path ran."""
    calls = [0]
    real = triton_ops.on_host

    def counted(*args):
        calls[0] += 1
        return real(*args)

    triton_ops.on_host = counted
    try:
        yield calls
    finally:
        triton_ops.on_host = real


def deltas(n: int, share: float, view=np.uint16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """base bits and new bits with `share` of the elements moved by one ULP-ish bit flip, specials at the head."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, np.iinfo(view).max, n, dtype=view, endpoint=True)
    new = base.copy()
    new[rng.random(n) < share] ^= view(1)
    if view is np.uint16:
        new[: SPECIAL_BF16.size], base[: SPECIAL_BF16.size] = SPECIAL_BF16, SPECIAL_BF16[::-1]
    return new, base


def same_chunks(a: list, b: list) -> bool:
    return len(a) == len(b) and all(ma == mb and fa == fb for (ma, fa), (mb, fb) in zip(a, b))


def codec_gpu_path(budget: Budget, log=print, n: int = 32 << 20, dev: torch.device | None = None) -> dict:
    """n bf16 elements a case (default 64 MiB: eight default chunks of 4 Mi elements, each over MIN_GPU_BYTES)."""
    if delta.backend() != "triton":
        raise RuntimeError(f"kernels.delta.backend() is {delta.backend()!r} here, not 'triton'")
    checks: dict = {}
    timings: dict = {}
    cases = {
        "bf16_2pct": (*deltas(n, 0.02), np.uint16),  # sparse chunks: XOR and count on the GPU
        "bf16_50pct": (*deltas(n, 0.5, seed=1), np.uint16),  # planes chunks: split and join on the GPU too
        "f32_snapshot": (deltas(n // 2, 0.0, np.uint32, seed=2)[0], None, np.uint32),  # no base: planes only
    }
    for name, (new, base, view) in cases.items():
        with numpy_path():
            want = codec.encode_tensor(new, base)
        with counting_gpu_calls() as calls:
            got = codec.encode_tensor(new, base)
            back = codec.decode_tensor(got, view, new.size, base)
        checks[f"{name}_gpu_path_ran"] = calls[0] > 0
        checks[f"{name}_frames_equal_numpy"] = same_chunks(got, want)
        checks[f"{name}_decodes_bit_exact"] = bool(np.array_equal(back, new))
        log(f"  {name}: {calls[0]} GPU calls, frames equal {checks[f'{name}_frames_equal_numpy']}")

    new, base, _ = cases["bf16_50pct"]
    assert base is not None
    noise = deltas(n, 0.0, seed=3)[0]  # random bits: an XOR with every byte value, 0x80 and over included
    x_np = np.bitwise_xor(new, noise)
    planes_np = np.ascontiguousarray(x_np.view(np.uint8).reshape(-1, 2).T).reshape(-1)  # byte k of all, k = 0, 1
    count_np = int(np.count_nonzero(x_np))
    x = delta.xor(new, noise)
    planes = delta.split_planes(x)
    checks["xor_bit_exact"] = bool(np.array_equal(x, x_np))
    checks["split_planes_bit_exact"] = bool(np.array_equal(planes, planes_np))
    checks["join_planes_bit_exact"] = bool(np.array_equal(delta.join_planes(planes, np.uint16, n), x_np))
    checks["count_changed_exact"] = delta.count_changed(x) == count_np

    # the ceiling of a host-to-host kernel call: its own transfers (pageable, as on_host makes them)
    dev = dev or torch.device("cuda")
    on_dev = torch.from_numpy(new.view(np.int16)).to(dev)
    h2d_s = wall_bench(lambda: torch.from_numpy(new.view(np.int16)).to(dev), dev)
    d2h_s = wall_bench(lambda: on_dev.cpu(), dev)
    timings["h2d_pageable_gbps"] = round(new.nbytes / h2d_s / 1e9, 2)
    timings["d2h_pageable_gbps"] = round(new.nbytes / d2h_s / 1e9, 2)
    nb = new.nbytes
    ops = {  # name: (fn, bytes in, bytes out)
        "xor": (lambda: delta.xor(new, base), 2 * nb, nb),
        "split_planes": (lambda: delta.split_planes(x), nb, nb),
        "join_planes": (lambda: delta.join_planes(planes, np.uint16, n), nb, nb),
        "count_changed": (lambda: delta.count_changed(x), nb, 0),
    }
    for name, (fn, b_in, b_out) in ops.items():
        gpu_s = wall_bench(fn, dev, reps=3)
        with numpy_path():
            np_s = wall_bench(fn, dev, reps=3)
        ceiling_s = b_in / nb * h2d_s + b_out / nb * d2h_s
        timings[f"{name}_gpu_path_gbps"] = round((b_in + b_out) / gpu_s / 1e9, 2)
        timings[f"{name}_numpy_gbps"] = round((b_in + b_out) / np_s / 1e9, 2)
        timings[f"{name}_share_of_transfer_ceiling"] = round(ceiling_s / gpu_s, 3)
        timings[f"{name}_speedup_vs_numpy"] = round(np_s / gpu_s, 2)
    for label, ctx in (("gpu_path", contextlib.nullcontext()), ("numpy", numpy_path())):
        with ctx:
            t = time.perf_counter()
            codec.encode_tensor(new, base)
            timings[f"encode_tensor_bf16_50pct_{label}_mbps"] = round(nb / (time.perf_counter() - t) / 1e6, 1)
    log(f"  xor host-to-host {timings['xor_gpu_path_gbps']} GB/s ({timings['xor_speedup_vs_numpy']}x numpy)")
    return {
        "ok": all(checks.values()),
        "path": "kernels.delta -> triton_ops.on_host (numpy in and out, kernels on the device)",
        "min_gpu_bytes": delta.MIN_GPU_BYTES,
        "checks": checks,
        "timings": timings,
    }
