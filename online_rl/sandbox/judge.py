"""Run model-written code against hidden tests, in a bubblewrap sandbox it cannot escape or game.

Each candidate runs alone in a fresh sandbox (online_rl.sandbox.jail: its own user, PID, network, IPC
and mount namespaces, a read-only root with only the interpreter and its standard library, resource
limits; online_rl.sandbox.runner inside). The harness writes the job on the sandbox's stdin and reads
one capped result back from its stdout; the wall-clock limit kills bwrap, which ends the whole PID
namespace. The expected outputs never enter the sandbox: each reported value is re-parsed here as a
plain literal and compared with the expected repr outside, so the reward is what an honest evaluator
gives. What a hostile candidate tried (or what limit stopped it) is counted by kind in
`flywheel_sandbox_contained_total{kind}`. If isolation cannot be set up the sandbox refuses to run.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client import Counter

from online_rl.sandbox.jail import WORK_DIR, SandboxUnavailable, interpreter
from online_rl.sandbox.process import SandboxConfig, exchange, limits_for_runner, outer_uid

__all__ = ["SandboxConfig", "Candidate", "Verdict", "SandboxUnavailable", "run", "check", "candidate_for", "CONTAINED"]
log = logging.getLogger(__name__)

CONTAINED = Counter(
    "flywheel_sandbox_contained", "Hostile candidate attempts the sandbox contained, by kind", ["kind"], registry=None
)  # registered by whoever serves /metrics (the trainer)
KINDS = (
    "filesystem",
    "network",
    "process",
    "signal",
    "ctypes",
    "introspection",
    "tamper",
    "early_exit",
    "bad_output",
    "memory",
    "cpu_time",
    "wall_time",
    "output_flood",
    "crash",
)  # what CONTAINED counts


@dataclass
class Candidate:
    code: str  # full source: prompt + completion
    fn: str  # the function the tests call
    inputs: list  # one positional argument per call (JSON-serialisable)
    expected: list[str]  # repr of the reference outputs; stays outside the sandbox


@dataclass
class Verdict:
    passed: int
    total: int
    error: str | None = None
    contained: tuple[str, ...] = field(default=())  # kinds of hostile attempt seen (empty for honest code)

    @property
    def reward(self) -> float:
        """Share of tests passed."""
        return self.passed / self.total if self.total else 0.0

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total


_LITERAL_LOCK = threading.Lock()  # judging threads parse reported values one at a time


def _canonical(output) -> str | None:
    """The repr an honest evaluator compares: a reported value only counts if it parses as a literal."""
    if not isinstance(output, dict):
        return None
    if isinstance(output.get("repr"), str):
        try:
            with _LITERAL_LOCK:  # CPython 3.11's AST recursion counter is not thread-safe (gh-106905)
                return repr(ast.literal_eval(output["repr"]))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    if isinstance(output.get("raises"), str):
        return repr(f"<raises {output['raises'][:100]}>")  # how tasks.expected_outputs records a raise
    return None


def _verdict(cand: Candidate, cfg: SandboxConfig, out: bytes, code: int, why: str | None) -> Verdict:
    """What an honest evaluator makes of what came back: attempt lines, then exactly one result."""
    total = len(cand.expected)
    kinds, results = set(), []
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except Exception:  # ValueError, or RecursionError from a line nested thousands deep
            kinds.add("bad_output")
            continue
        if isinstance(msg, dict) and isinstance(msg.get("attempt"), str):
            # Only the kinds the runner knows: a candidate writing its own must not mint metric labels.
            kinds.add(msg["attempt"] if msg["attempt"] in KINDS else "bad_output")
        elif isinstance(msg, dict) and isinstance(msg.get("result"), dict):
            results.append(msg["result"])
        else:
            kinds.add("bad_output")

    def fail(error: str, *extra: str) -> Verdict:
        return Verdict(0, total, error, tuple(sorted(kinds | set(extra))))

    if why == "wall_time":
        return fail("wall time limit", "wall_time")
    if why == "output_flood":
        return fail(f"result over {cfg.result_bytes} bytes", "output_flood")
    if len(results) > 1:  # forked copies of the runner reported too: whose result is it?
        return fail("more than one result", "process")
    sig = code - 128 if code > 128 else (-code if code < 0 else 0)
    if not results:
        # SIGKILL with no kill of its own in sight: the CPU hard limit (it ignored SIGXCPU at the soft one).
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and not kinds & {"signal", "ctypes"}):
            return fail("cpu time limit", "cpu_time")
        if sig:
            return fail(f"killed by signal {sig}", "crash")
        return fail("exited before reporting", "early_exit")
    result = results[0]
    if "error" in result:
        return fail(str(result["error"])[:300])
    outputs = result.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != total:
        return fail("malformed result", "bad_output")
    passed = sum(_canonical(o) == e for o, e in zip(outputs, cand.expected))
    return Verdict(passed, total, None, tuple(sorted(kinds)))


def _judge(cand: Candidate, cfg: SandboxConfig, uid: int | None, bare: bool) -> Verdict:
    job = {
        "code": cand.code,
        "fn": cand.fn,
        "inputs": json.dumps(cand.inputs),
        "readable": [interpreter()[1]],
        "limits": limits_for_runner(cfg),
    }
    work = tempfile.mkdtemp(prefix="sbx-bare-") if bare else None
    job["work_dir"] = work or WORK_DIR
    try:
        out, code, why = exchange(cfg, uid, json.dumps(job).encode(), bare=bare)
    finally:
        if work:
            shutil.rmtree(work, ignore_errors=True)
    return _verdict(cand, cfg, out, code, why)


_checked = threading.Event()
_check_lock = threading.Lock()


def check(cfg: SandboxConfig | None = None) -> None:
    """Prove once per process that the sandbox starts and judges; raises SandboxUnavailable with why."""
    if _checked.is_set():
        return
    with _check_lock:
        if _checked.is_set():
            return
        probe = Candidate("def f(x):\n    return x + 1\n", "f", [1], ["2"])
        with outer_uid(cfg or SandboxConfig()) as uid:
            v = _judge(probe, SandboxConfig(wall_seconds=30), uid, bare=False)
        if not v.ok:
            raise SandboxUnavailable(f"the sandbox does not judge a trivial candidate ({v.error})")
        _checked.set()


def run(candidates: list[Candidate], cfg: SandboxConfig | None = None, *, bare: bool = False) -> list[Verdict]:
    """Judge a batch of candidates, each in its own sandbox, several at once; one verdict each, in order.

    `bare=True` runs the same runner in a bare subprocess without isolation; only the sandbox benchmark
    uses it, to measure what isolation costs."""
    cfg = cfg or SandboxConfig()
    if not candidates:
        return []
    if not bare:
        check(cfg)
    workers = min(len(candidates), cfg.workers or os.cpu_count() or 1)

    def one(c: Candidate) -> Verdict:
        if bare:
            return _judge(c, cfg, None, bare)
        with outer_uid(cfg) as uid:
            return _judge(c, cfg, uid, bare)

    if workers == 1:
        verdicts = [one(c) for c in candidates]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="sandbox") as pool:
            verdicts = list(pool.map(one, candidates))
    if not bare:
        for v in verdicts:
            for kind in v.contained:
                CONTAINED.labels(kind).inc()
    return verdicts


def candidate_for(task, completion: str) -> Candidate:
    """A candidate that judges `completion` (the body) as the implementation of a tasks.Task."""
    return Candidate(
        code=task.prompt + completion,
        fn=task.name,
        inputs=task.test_inputs(),
        expected=[repr(y) for y in task.expected_outputs()],
    )
