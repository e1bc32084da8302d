"""Run a repository's tests in the sandbox: the second job kind, beside judge's one function against inputs.

A job is a repository's files (one of them with a body deleted, or a model's body in its place), the test module to
run and the tests to keep. It runs in the same bubblewrap jail as a candidate (online_rl.sandbox.jail: own
namespaces, read-only root with only the interpreter and its standard library, resource limits, a wall-clock kill
of the whole PID namespace), with online_rl.sandbox.suite_runner inside instead of the one-function runner, and with
limits sized for a test suite (SuiteConfig). The files travel on stdin into the sandbox's private tmpfs work dir,
so the jail still binds nothing of the host but the interpreter; nothing it writes comes back but the capped result
lines. Outcomes per test and per repeat come back; what they mean (flaky, broken, slow) is for the caller to say.
"""

from __future__ import annotations

import functools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from online_rl.sandbox.jail import WORK_DIR, interpreter
from online_rl.sandbox.judge import check
from online_rl.sandbox.process import SandboxConfig, exchange, limits_for_runner, outer_uid

SUITE_RUNNER = Path(__file__).with_name("suite_runner.py")


@functools.lru_cache(maxsize=1)
def suite_runner_source() -> str:
    return SUITE_RUNNER.read_text()


@dataclass
class SuiteConfig(SandboxConfig):
    """The one-function sandbox's settings (limits, workers, outer uids), sized for a repository's test module."""

    cpu_seconds: int = 60
    memory_mb: int = 2048  # address space
    wall_seconds: float = 60.0  # the whole run (every repeat), start-up included
    file_bytes: int = 16 << 20
    open_files: int = 256
    processes: int = 32
    tmpfs_mb: int = 256  # the repository's files live in the work dir's tmpfs
    result_bytes: int = 4 << 20
    workers: int = 1  # jobs run at once


@dataclass
class SuiteJob:
    files: dict[str, str]  # relative path -> text, written into the work dir
    module: str  # the test module to import (dotted, from one of `paths`)
    paths: list[str] = field(default_factory=lambda: [""])  # folders (relative) put first on sys.path
    select: list[str] | None = None  # the test ids to run (None: all the module has)
    fresh: list[str] = field(default_factory=list)  # modules imported afresh from the work dir
    repeats: int = 1  # runs of the selected tests in the one process


@dataclass
class SuiteRun:
    tests: list[str]  # ids collected (after `select`)
    outcomes: dict[str, list[str]]  # id -> outcome of each finished repeat (a test missing from a repeat: error)
    seconds: dict[str, float]  # id -> its longest time over the repeats
    error: str | None = None  # the module did not import, or the jail reported nothing
    timed_out: bool = False  # killed at the wall-clock limit (the repeats finished before are in outcomes)
    wall_s: float = 0.0

    def stable(self, outcome: str = "pass") -> set[str]:
        """Tests with this outcome in every repeat (and at least one repeat finished)."""
        return {t for t, seen in self.outcomes.items() if seen and all(o == outcome for o in seen)}

    def flaky(self) -> set[str]:
        """Tests whose outcome differed between repeats."""
        return {t for t, seen in self.outcomes.items() if len(set(seen)) > 1}


def _parse(out: bytes, why: str | None, wall: float) -> SuiteRun:
    """The runner's lines, strictly: anything else on the channel (a line that is not one of its messages, a second
    list of tests) makes the run a `bad_output` error that no test passes, as the one-function judge treats a
    result it did not expect. Only a last line cut by a kill (`why`) is left out."""
    tests: list[str] | None = None
    repeats: list[dict[str, Any]] = []
    error = None
    lines = out.splitlines()
    for n, line in enumerate(lines):
        try:
            msg = json.loads(line)
        except ValueError:
            if why is not None and n == len(lines) - 1 and not out.endswith(b"\n"):
                break
            msg = None
        if isinstance(msg, dict) and isinstance(msg.get("tests"), list) and tests is None and not repeats:
            tests = [str(t) for t in msg["tests"]]
        elif isinstance(msg, dict) and isinstance(msg.get("outcomes"), dict) and tests is not None:
            repeats.append(msg["outcomes"])
        elif isinstance(msg, dict) and isinstance(msg.get("error"), str) and error is None:
            error = msg["error"][:500]
        else:
            return SuiteRun([], {}, {}, "bad_output: the jail wrote a line its runner does not", False, round(wall, 3))
    tests = tests or []
    outcomes: dict[str, list[str]] = {t: [] for t in tests}
    seconds: dict[str, float] = {t: 0.0 for t in tests}
    for rep in repeats:
        for t in tests:
            got = rep.get(t)
            if isinstance(got, list) and len(got) == 2 and got[0] in ("pass", "fail", "error", "skip"):
                outcomes[t].append(got[0])
                if isinstance(got[1], (int, float)):
                    seconds[t] = max(seconds[t], float(got[1]))
            else:
                outcomes[t].append("error")
    if error is None and not tests and not repeats and why != "wall_time":
        error = "the sandbox reported nothing" + (f" ({why})" if why else "")
    return SuiteRun(tests, outcomes, seconds, error, why == "wall_time", round(wall, 3))


def _run_one(job: SuiteJob, cfg: SuiteConfig, uid: int | None) -> SuiteRun:
    payload = {
        "files": job.files,
        "module": job.module,
        "paths": job.paths,
        "select": job.select,
        "fresh": job.fresh,
        "repeats": job.repeats,
        "work_dir": WORK_DIR,
        "readable": [interpreter()[1]],
        "limits": limits_for_runner(cfg),
    }
    start = time.monotonic()
    out, _, why = exchange(cfg, uid, json.dumps(payload).encode(), program=suite_runner_source())
    return _parse(out, why, time.monotonic() - start)


def run(jobs: list[SuiteJob], cfg: SuiteConfig | None = None) -> list[SuiteRun]:
    """Run each job in its own fresh sandbox, cfg.workers at once; one SuiteRun each, in order."""
    cfg = cfg or SuiteConfig()
    if not jobs:
        return []
    check()

    def one(job: SuiteJob) -> SuiteRun:
        with outer_uid(cfg) as uid:
            return _run_one(job, cfg, uid)

    if cfg.workers <= 1 or len(jobs) == 1:
        return [one(j) for j in jobs]
    with ThreadPoolExecutor(min(cfg.workers, len(jobs)), thread_name_prefix="suite") as pool:
        return list(pool.map(one, jobs))
