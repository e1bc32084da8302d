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
import contextlib
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from online_rl.sandbox.jail import WORK_DIR, Limits, SandboxUnavailable, bare_command, bwrap_command, interpreter

__all__ = ["SandboxConfig", "Candidate", "Verdict", "SandboxUnavailable", "run", "check", "candidate_for", "CONTAINED"]
log = logging.getLogger(__name__)

CONTAINED = Counter(
    "flywheel_sandbox_contained", "Hostile candidate attempts the sandbox contained, by kind", ["kind"], registry=None
)  # registered by whoever serves /metrics (the trainer)
STDERR_CAP = 64 << 10
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
UID_SPAN = 4096 * 64  # outer uids: 64 concurrent slots for each of 4096 process ids (pid mod 4096)


@dataclass
class SandboxConfig:
    cpu_seconds: int = 2
    memory_mb: int = 256  # address space
    wall_seconds: float = 4.0  # the whole run, start-up included; then the PID namespace is killed
    file_bytes: int = 1 << 20  # largest file it may write (in its tmpfs)
    open_files: int = 32
    processes: int = 16  # per sandbox (RLIMIT_NPROC of its own outer uid)
    tmpfs_mb: int = 16  # size of each of its tmpfs mounts (work dir, /tmp)
    result_bytes: int = 1 << 20  # the result channel's cap: past it the run is killed
    workers: int = 0  # candidates judged at once (0: one per core)
    outer_uid_base: int = 3_000_000  # as root: bwrap runs as an unprivileged uid of [base, base + UID_SPAN)

    def limits(self) -> Limits:
        return Limits(
            cpu_seconds=self.cpu_seconds,
            memory_mb=self.memory_mb,
            file_bytes=self.file_bytes,
            open_files=self.open_files,
            processes=self.processes,
            tmpfs_bytes=self.tmpfs_mb << 20,
        )


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


def _exchange(proc: subprocess.Popen, job: bytes, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Feed the job, read stdout up to `cap` and stderr up to STDERR_CAP until EOF, the cap or the deadline."""
    assert proc.stdin and proc.stdout and proc.stderr, "started with three pipes"
    sel = selectors.DefaultSelector()
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin, selectors.EVENT_WRITE)
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(proc.stderr, selectors.EVENT_READ)
    out, err, view, why = bytearray(), bytearray(), memoryview(job), None
    try:
        while any(k.fileobj is proc.stdout for k in sel.get_map().values()):
            left = deadline - time.monotonic()
            if left <= 0:
                why = "wall_time"
                break
            for key, _ in sel.select(left):
                f = key.fileobj
                assert not isinstance(f, int), "registered as file objects"
                if f is proc.stdin:
                    try:
                        view = view[os.write(f.fileno(), view[:65536]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # it stopped reading: what it read is all it gets
                        view = view[:0]
                    if not view:
                        sel.unregister(f)
                        f.close()
                    continue
                chunk = os.read(f.fileno(), 65536)
                if not chunk:
                    sel.unregister(f)
                    continue
                if f is proc.stdout:
                    out += chunk
                    if len(out) > cap:
                        why = "output_flood"
                        return bytes(out[:cap]), bytes(err), why
                elif len(err) < STDERR_CAP:
                    err += chunk[: STDERR_CAP - len(err)]
    finally:
        sel.close()
    return bytes(out), bytes(err), why


def _sandbox_pidfd(info: int, deadline: float) -> int | None:
    """A pidfd of the sandbox's PID 1, from bwrap's --info-fd. Opened before the job is sent (PID 1 is
    then alive, waiting for it), so the pid cannot have been reused."""
    sel = selectors.DefaultSelector()
    sel.register(info, selectors.EVENT_READ)
    data = b""
    try:
        while time.monotonic() < deadline and sel.select(max(0.0, deadline - time.monotonic())):
            chunk = os.read(info, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        sel.close()
        os.close(info)
    try:
        return os.pidfd_open(int(json.loads(data)["child-pid"]))
    except (ValueError, KeyError, TypeError, OSError):
        return None


def _end(proc: subprocess.Popen, pidfd: int | None) -> int:
    """Kill the sandbox's PID 1, which ends its PID namespace and every process in it, then reap bwrap
    (bwrap reaps PID 1, so nothing is left as a zombie)."""
    if proc.poll() is None:
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            else:
                os.killpg(proc.pid, signal.SIGKILL)  # --die-with-parent takes the sandbox along
        except OSError:
            pass
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None and not f.closed:
            f.close()
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    if pidfd is not None:
        os.close(pidfd)
    return code


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


def limits_for_runner(cfg: SandboxConfig) -> dict:
    """The limits a runner sets on itself inside the jail (the jail sets its own too)."""
    return {
        "cpu_seconds": cfg.cpu_seconds,
        "memory_mb": cfg.memory_mb,
        "file_bytes": cfg.file_bytes,
        "open_files": cfg.open_files,
        "processes": cfg.processes,
    }


def exchange(
    cfg: SandboxConfig, uid: int | None, payload: bytes, program: str | None = None, bare: bool = False
) -> tuple[bytes, int, str | None]:
    """Start a runner in a fresh jail (`program`: its source, else the one-function runner; `bare`: no jail, the
    sandbox benchmark's baseline) as `uid`, write `payload` on its stdin and read its capped stdout until it ends or
    the wall clock does; the whole PID namespace ends with it. (stdout, exit code, why it was stopped or None.)"""
    info_r: int | None = None
    info_w: int | None = None
    if bare:
        argv = bare_command()
    else:
        info_r, info_w = os.pipe()
        argv = bwrap_command(cfg.limits(), info_fd=info_w, program=program)
    kw: dict[str, Any] = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={},
            close_fds=True,
            pass_fds=() if info_w is None else (info_w,),
            start_new_session=True,
            cwd="/",
            **kw,
        )
    except OSError as e:
        if info_r is not None:
            os.close(info_r)
        raise SandboxUnavailable(f"cannot start {argv[0]} as uid {uid}: {e}") from e
    finally:
        if info_w is not None:
            os.close(info_w)
    pidfd = None
    try:
        if info_r is not None:
            pidfd = _sandbox_pidfd(info_r, start + cfg.wall_seconds)
        out, err, why = _exchange(proc, payload, start + cfg.wall_seconds, cfg.result_bytes)
    finally:
        code = _end(proc, pidfd)
    if err.startswith(b"bwrap:"):
        raise SandboxUnavailable(f"bwrap could not set up the sandbox: {err.decode(errors='replace').strip()}")
    return out, code, why


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


_slots_lock = threading.Lock()
_slots_busy: set[int] = set()


@contextlib.contextmanager
def outer_uid(cfg: SandboxConfig):
    """The uid bwrap runs as (when we are root): distinct for every sandbox running at once in this
    process, and apart from other processes' (by pid), so each has its own process limit."""
    if os.geteuid() != 0:
        yield None
        return
    with _slots_lock:
        slot = next(i for i in range(len(_slots_busy) + 1) if i not in _slots_busy)
        _slots_busy.add(slot)
    try:
        yield cfg.outer_uid_base + (os.getpid() % 4096) * 64 + slot % 64
    finally:
        with _slots_lock:
            _slots_busy.discard(slot)


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
