"""The Triton kernels, run on the CPU by Triton's interpreter on small shapes (run by test_kernels_triton.py
in a process of its own, TRITON_INTERPRET=1 from the start): the same answers as the
CPU path / references, bit-exact for the delta kernels, batch-invariant for the row ops."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before Triton compiles anything: kernels run on CPU tensors

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from kernels import reference as ref  # noqa: E402

triton_ops = pytest.importorskip("kernels.triton_ops")


def test_linear_batch_invariant_and_accurate():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(70, 50, generator=g)
    x = torch.randn(37, 50, generator=g)
    full = triton_ops.linear(x, w)
    for i in (0, 5, 36):
        assert torch.equal(triton_ops.linear(x[i : i + 1], w)[0], full[i])
        assert torch.equal(triton_ops.linear(x[i : i + 3], w)[0], full[i])
    assert torch.allclose(full.double(), ref.linear(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, D", [("softmax", 300), ("log_softmax", 300), ("log_softmax", 2500), ("rms", 64)])
def test_rowwise(name, D):
    g = torch.Generator().manual_seed(D)
    x = torch.randn(9, D, generator=g) * 4
    weight = torch.linspace(0.5, 2, D)
    op, reference = {
        "softmax": (triton_ops.softmax, ref.softmax),
        "log_softmax": (triton_ops.log_softmax, ref.log_softmax),
        "rms": (lambda t: triton_ops.rms_norm(t, weight, 1e-6), lambda t: ref.rms_norm(t, weight, 1e-6)),
    }[name]
    full = op(x)
    for i in (0, 4, 8):
        assert torch.equal(op(x[i : i + 1])[0], full[i])
    assert torch.allclose(full.double(), reference(x), rtol=1e-5, atol=1e-6)


def test_topk_ties_and_reference():
    x = torch.tensor([[0.1, 0.3, 0.3, 0.05, 0.3], [0.2, 0.2, 0.2, 0.2, 0.2]])
    values, ids = triton_ops.topk(x, 2)
    assert ids.tolist() == [[1, 2], [0, 1]]
    probs = torch.softmax(torch.randn(20, 8, generator=torch.Generator().manual_seed(1)), -1)
    v, i = triton_ops.topk(probs, 2)
    rv, ri = ref.topk(probs, 2)
    assert torch.equal(i, ri) and torch.equal(v, rv)


@pytest.mark.parametrize("view", [np.uint16, np.uint32])
def test_delta_kernels_bit_exact(view):
    rng = np.random.default_rng(0)
    info = np.iinfo(view)
    base = rng.integers(0, info.max, 2500, dtype=view, endpoint=True)
    new = base.copy()
    new[rng.random(base.size) < 0.3] ^= view(0x8001 if view == np.uint16 else 0x80000001)
    special = np.array([0, info.max, 1, info.max // 2 + 1], view)
    zeros = np.zeros_like(base)  # a full snapshot: every byte of random bits, 0x80 and over included
    for a, b in ((new, base), (special, special[::-1].copy()), (base, zeros)):
        x = triton_ops.on_host(triton_ops.xor, a, b)
        assert x.dtype == view and np.array_equal(x, a ^ b)
        planes = triton_ops.on_host(triton_ops.split_planes, x)
        want, changed = ref.xor_split(a, b)
        assert np.array_equal(planes, want)
        assert triton_ops.on_host(triton_ops.count_nonzero, x) == changed
        assert np.array_equal(triton_ops.on_host(triton_ops.join_planes, planes, np.dtype(view), a.size), x)


def test_the_gpu_checks_codec_section_on_the_interpreter(monkeypatch):
    """online_rl.gpu_check.check's codec section, its kernels interpreted on CPU tensors (small, its timings
    meaningless): the codec's Triton path gives the numpy path's frames and decodes bit for bit."""
    from kernels import delta
    from online_rl.gpu_check import codec as gpu_check_codec
    from online_rl.gpu_check.sections import Budget

    monkeypatch.setattr(delta, "backend", lambda: "triton")
    monkeypatch.setattr(delta, "MIN_GPU_BYTES", 4096)
    result = gpu_check_codec.codec_gpu_path(Budget(100), log=lambda line: None, n=1 << 14, dev=torch.device("cpu"))
    assert result["ok"] and all(result["checks"].values()) and len(result["checks"]) == 13, result["checks"]
