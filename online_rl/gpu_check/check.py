"""The prepared GPU check: one run on a lent GPU (an H200: about 2-3 minutes, at most ~6 by the budgets),
one JSON report. Sections, each under its own time budget, an error recorded and the next one run:
    fsdp_step         an FSDP2 training step of the trainer's model (~0.7 B parameters, 16 experts,
                      16k tokens a step): tokens/s, step seconds, peak memory, the loss going down
                      (online_rl.gpu_check.fsdp)
    triton_kernels    every Triton kernel against its reference, timed against the copy bandwidth and
                      cuBLAS measured in the same run (kernels.gpu_check)
    delta_codec       the delta codec's GPU path bit for bit against its numpy path, and its throughput
                      against its own host<->device transfers (online_rl.gpu_check.codec)
    batch_invariance  a row's logits alone and in batches, batch-invariant on and off, and the slowdown
                      (online_rl.gpu_check.batch_invariant)

    python -m online_rl.gpu_check.check [REPORT.json] [--cpu-smoke] [--sections a,b]
        (default $OUT/gpu_check.json, else ./gpu_check.json)

Refuses to run without CUDA (exit 2). --cpu-smoke runs the FSDP2 step on the CPU (gloo, a tiny preset) and
reports the GPU-only sections as skipped: a dry run of the script, not a measurement. Exit 0 when every
section that ran passed, 1 otherwise, 3 when the watchdog stopped a run stuck past WATCHDOG_S (the report
is rewritten after every section, so what finished is kept). The entry point is here, not in kernels,
because kernels import nothing of ours (tests/unit/repo/test_import_layers.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from infra.config import add_flags, build, option
from online_rl.gpu_check.sections import SKIPPED_NO_CUDA, run_section, skipped

BUDGETS_S = {"fsdp_step": 150, "triton_kernels": 90, "delta_codec": 60, "batch_invariance": 60}
SECTIONS = tuple(BUDGETS_S)
WATCHDOG_S = 450  # the lent machine's call is 8 minutes: stop well before it, keeping the report so far


def environment() -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except Exception as e:  # the CPU smoke run does not need it
        triton_version = f"unavailable ({type(e).__name__})"
    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def section_fn(name: str, cpu_smoke: bool, log):
    """The function of a Budget that runs section `name` (imports on call: each section's own)."""
    if name == "fsdp_step":
        from online_rl.gpu_check import fsdp as m

        preset = m.PRESETS["tiny" if cpu_smoke else "h200"]
        device = torch.device("cpu") if cpu_smoke else torch.device("cuda", 0)
        return lambda budget: m.fsdp_step(budget, device, preset, log)
    if name == "triton_kernels":
        from kernels import gpu_check

        return lambda budget: gpu_check.triton_kernels(log)
    if name == "delta_codec":
        from online_rl.gpu_check import codec

        return lambda budget: codec.codec_gpu_path(budget, log)
    if name == "batch_invariance":
        from online_rl.gpu_check import batch_invariant

        return lambda budget: batch_invariant.batch_invariance(budget, torch.device("cuda", 0), log=log)
    raise ValueError(f"unknown section {name!r}; the sections are {', '.join(SECTIONS)}")


def main(report_path: Path, cpu_smoke: bool = False, sections: tuple[str, ...] = SECTIONS, log=print) -> int:
    cuda = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    if not cuda and not cpu_smoke:
        print(
            "gpu_check needs a CUDA device and compiled Triton (not TRITON_INTERPRET); "
            "--cpu-smoke runs a dry run of the script on the CPU",
            file=sys.stderr,
        )
        return 2
    if unknown := set(sections) - set(SECTIONS):
        raise ValueError(f"unknown sections {sorted(unknown)}; the sections are {', '.join(SECTIONS)}")
    t0 = time.monotonic()
    report: dict = {"mode": "cpu-smoke" if cpu_smoke else "gpu", **environment(), "ok": None, "complete": False}
    report["sections"] = {}
    log(f"[gpu_check] {report['mode']} on {report['device']}, torch {report['torch']}, triton {report['triton']}")
    watchdog = threading.Timer(WATCHDOG_S, _give_up, (report, report_path, t0, log))
    watchdog.daemon = True
    watchdog.start()
    try:
        reason = "--cpu-smoke: not run" if cuda else SKIPPED_NO_CUDA
        for name in sections:
            if cpu_smoke and name != "fsdp_step":
                report["sections"][name] = skipped(reason)
                log(f"[gpu_check] {name}: skipped ({reason})")
                continue
            report["sections"][name] = run_section(name, section_fn(name, cpu_smoke, log), BUDGETS_S[name], log)
            _write(report, report_path, t0)  # what is done so far survives a kill
    finally:
        watchdog.cancel()
    ran = [s["ok"] for s in report["sections"].values() if s["ok"] is not None]
    report["ok"] = bool(ran) and all(ran)
    report["complete"] = True
    _write(report, report_path, t0)
    log(json.dumps(report))  # the whole report on the output too, in case the file does not come back
    log(f"[gpu_check] {'ok' if report['ok'] else 'FAILED'} in {report['seconds']} s; report: {report_path}")
    return 0 if report["ok"] else 1


def _write(report: dict, path: Path, t0: float) -> None:
    report["seconds"] = round(time.monotonic() - t0, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(path)


def _give_up(report: dict, path: Path, t0: float, log) -> None:
    """The watchdog: a section stuck where its alarm cannot reach (a CUDA or NCCL call) ends the run here,
    with the sections done so far written, before the lent machine's limit ends it without a report."""
    report["ok"] = False
    report["error"] = f"watchdog: the run passed {WATCHDOG_S} s; stopped during the section after the last one"
    try:
        _write(report, path, t0)
        log(f"[gpu_check] {report['error']}; report: {path}")
    finally:
        os._exit(3)


@dataclass
class CheckArgs:
    cpu_smoke: bool = option(False, help="dry run on the CPU: the FSDP2 step only (gloo, tiny)")
    sections: str = option(",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")


def cli(argv: list[str] | None = None) -> int:
    default = Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else Path("gpu_check.json")
    p = argparse.ArgumentParser(prog="python -m online_rl.gpu_check.check", description=__doc__.split("\n")[0])
    p.add_argument("report", nargs="?", type=Path, default=default)
    add_flags(p, CheckArgs)
    args = p.parse_args(argv)
    what = build(CheckArgs, args)
    return main(args.report, what.cpu_smoke, tuple(s for s in what.sections.split(",") if s))


if __name__ == "__main__":
    sys.exit(cli())
