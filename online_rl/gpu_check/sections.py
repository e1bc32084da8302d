"""The section runner of the prepared GPU check (online_rl.gpu_check.check): each section runs under its own time
budget and records its result or its error, so one failure or overrun does not lose the others.

A section is a function of its Budget returning a dict with "ok"; what it raises (its budget's alarm
included) becomes {"ok": false, "error": ..., "traceback": ...}. The alarm is SIGALRM, so it interrupts
Python code only (a long CUDA call finishes first); sections also look at `budget.left()` between steps.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import threading
import time
import traceback

import numpy as np
import torch

SKIPPED_NO_CUDA = "no CUDA"


class SectionTimeout(Exception):
    """A section ran past its budget."""


class Budget:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()


@contextlib.contextmanager
def alarm(seconds: float):
    """Raise SectionTimeout in this (main) thread after `seconds`; a no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise SectionTimeout(f"over its budget of {seconds:g} s")

    before = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def run_section(name: str, fn, budget_s: float, log=print) -> dict:
    """fn(budget) -> dict with "ok"; returns it with "seconds" and "budget_s", or the error it raised."""
    log(f"[gpu_check] {name}: start (budget {budget_s:g} s)")
    budget = Budget(budget_s)
    try:
        with alarm(budget_s):
            out = fn(budget)
        result = {"ok": bool(out.pop("ok")), **out}
    except Exception as e:  # recorded, and the next section runs
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    result["seconds"] = round(budget.elapsed(), 2)
    result["budget_s"] = budget_s
    state = "ok" if result["ok"] else f"FAILED ({result.get('error', 'a check did not pass')})"
    log(f"[gpu_check] {name}: {state} in {result['seconds']} s")
    return result


def skipped(reason: str) -> dict:
    return {"ok": None, "skipped": reason}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_bench(fn, device: torch.device, reps: int = 5, warmup: int = 1) -> float:
    """Median wall seconds of fn() (the device synchronised around each call)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))
