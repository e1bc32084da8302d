"""The prepared GPU script (online_rl.gpu_check.check, its Triton section in kernels.gpu_check): it refuses clearly
without CUDA; its CPU dry run really runs the FSDP2 step (gloo, tiny preset) and reports the GPU-only
sections as skipped; the section runner records errors and overruns instead of raising; the parts of the
batch-invariance and codec sections that have a CPU path are checked on it."""

import json
import signal
import time

import numpy as np
import pytest
import torch

from online_rl.gpu_check import check as gpu_check, codec as gpu_check_codec
from online_rl.gpu_check.batch_invariant import batch_invariance
from online_rl.gpu_check.sections import Budget, run_section
from online_rl.model.transformer import ModelConfig
from weight_sync import codec

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="what the script does without CUDA")


@cpu_only
def test_refuses_without_a_gpu(tmp_path, capsys):
    assert gpu_check.main(tmp_path / "r.json") == 2
    assert gpu_check.cli([str(tmp_path / "r.json")]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


@cpu_only
def test_cpu_smoke_runs_the_fsdp2_step_and_skips_the_gpu_sections(tmp_path):
    lines = []
    assert gpu_check.main(tmp_path / "r.json", cpu_smoke=True, log=lines.append) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert {"ok", "complete", "mode", "device", "torch", "triton", "cuda", "python", "sections", "seconds"} <= set(
        report
    )
    assert report["ok"] is True and report["complete"] is True and report["mode"] == "cpu-smoke"
    assert report["device"].startswith("cpu") and not (tmp_path / "r.json.tmp").exists()
    assert list(report["sections"]) == list(gpu_check.SECTIONS)
    fsdp = report["sections"]["fsdp_step"]
    assert fsdp["ok"] is True and fsdp["backend"] == "gloo" and fsdp["world_size"] == 1
    assert fsdp["tokens_per_s"] > 0 and fsdp["timed_steps"] == 3 and len(fsdp["losses"]) == 5
    assert fsdp["loss_decreased"] and fsdp["losses"][-1] < fsdp["losses"][0]
    assert fsdp["params"] > fsdp["active_params_per_token"] > 0
    for name in gpu_check.SECTIONS[1:]:
        assert report["sections"][name] == {"ok": None, "skipped": "no CUDA"}
    assert any("fsdp_step: ok" in line for line in lines) and json.loads(lines[-2]) == report
    assert not torch.distributed.is_initialized()  # the section's own process group is gone


def test_unknown_sections_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown sections"):
        gpu_check.main(tmp_path / "r.json", cpu_smoke=True, sections=("fsdp_step", "nope"))


def test_a_failing_section_is_recorded_and_the_next_one_runs():
    lines = []

    def boom(budget):
        raise ValueError("bad shape")

    failed = run_section("boom", boom, 10, log=lines.append)
    assert failed["ok"] is False and failed["error"] == "ValueError: bad shape"
    assert "boom" in failed["traceback"] and failed["budget_s"] == 10 and failed["seconds"] >= 0
    assert run_section("no_ok", lambda budget: {}, 10, log=lines.append)["ok"] is False
    passed = run_section("fine", lambda budget: {"ok": True, "value": 1}, 10, log=lines.append)
    assert passed["ok"] is True and passed["value"] == 1
    assert any("boom: FAILED (ValueError: bad shape)" in line for line in lines)


def test_a_section_past_its_budget_is_stopped_and_recorded():
    before = signal.getsignal(signal.SIGALRM)

    def forever(budget: Budget):
        while True:
            time.sleep(0.01)

    t0 = time.monotonic()
    result = run_section("forever", forever, 0.3, log=lambda line: None)
    assert result["ok"] is False and result["error"].startswith("SectionTimeout: over its budget of 0.3 s")
    assert time.monotonic() - t0 < 5
    assert signal.getsignal(signal.SIGALRM) is before  # and the alarm is off again
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_batch_invariance_section_on_the_cpu_path():
    """The section's comparison, on the CPU ops (the report itself skips it without CUDA)."""
    r = batch_invariance(Budget(60), torch.device("cpu"), ModelConfig(), batch=6, seq=12, log=lambda line: None)
    assert r["ok"] is True
    assert r["batch_invariant"]["logits_identical"] and r["batch_invariant"]["max_abs_diff"] == 0.0
    assert set(r["default"]) == {"logits_identical", "experts_identical", "max_abs_diff", "forward_s"}
    assert r["slowdown"] > 0 and r["modes_max_abs_diff"] < 1e-3 * r["modes_logit_scale"]


def test_codec_section_helpers():
    new, base = gpu_check_codec.deltas(50_000, 0.02)
    changed = np.count_nonzero(new != base)
    assert 0.01 * new.size < changed < 0.03 * new.size
    before = gpu_check_codec.delta.MIN_GPU_BYTES
    with gpu_check_codec.numpy_path():
        a = codec.encode_tensor(new, base, chunk_elems=20_000)
        assert gpu_check_codec.delta.MIN_GPU_BYTES > new.nbytes
    assert gpu_check_codec.delta.MIN_GPU_BYTES == before
    assert gpu_check_codec.same_chunks(a, codec.encode_tensor(new, base, chunk_elems=20_000))
    new[-1] ^= 2
    assert not gpu_check_codec.same_chunks(a, codec.encode_tensor(new, base, chunk_elems=20_000))
    real = gpu_check_codec.triton_ops.on_host
    with gpu_check_codec.counting_gpu_calls() as calls:  # kernels.delta looks on_host up at each call
        out = gpu_check_codec.triton_ops.on_host(torch.bitwise_xor, new, base)  # CPU tensors without CUDA
    assert calls == [1] and np.array_equal(out, new ^ base) and gpu_check_codec.triton_ops.on_host is real
