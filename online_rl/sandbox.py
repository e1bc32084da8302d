"""Run model-written code against hidden tests, isolated and resource-limited.

One sandbox process (`python -I -S`, empty environment, no network when `unshare` allows it) takes a
batch of candidates on stdin. For each it forks a child with CPU-time, address-space, file-size and
open-file limits, in a throwaway working directory; the child runs the code, calls the function on
each test input and sends back the repr of every result. The expected outputs never enter the
sandbox: the caller compares, so the code under test can neither read nor change its tests.
"""
from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass

_RUNNER = r'''
import json, os, resource, select, shutil, signal, sys, tempfile, time
job = json.loads(sys.stdin.read())
lim = job["limits"]
out = []
for cand in job["candidates"]:
    r, w = os.pipe()
    work = tempfile.mkdtemp(prefix="sbx-")
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.chdir(work)
            os.setsid()
            mem = lim["memory_mb"] << 20
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_seconds"], lim["cpu_seconds"]))
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
            resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            results = []
            ns = {"__name__": "candidate"}
            try:
                exec(compile(cand["code"], "<candidate>", "exec"), ns)
                fn = ns[cand["fn"]]
            except BaseException as e:
                payload = {"error": "does not load: " + type(e).__name__ + ": " + str(e)[:200]}
            else:
                for x in cand["inputs"]:
                    try:
                        results.append(repr(fn(x))[:2000])
                    except BaseException as e:
                        results.append("<raises " + type(e).__name__ + ">")
                payload = {"outputs": results}
            data = json.dumps(payload).encode()[: 1 << 20]
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    chunks, deadline, error = [], time.monotonic() + lim["wall_seconds"], None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            error = "wall time limit"
            break
        ready, _, _ = select.select([r], [], [], left)
        if not ready:
            continue
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    _, status = os.waitpid(pid, 0)
    os.close(r)
    shutil.rmtree(work, ignore_errors=True)
    if error is None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        error = "cpu time limit" if sig in (signal.SIGXCPU, signal.SIGKILL) else "killed by signal %d" % sig
    if error is None:
        try:
            out.append(json.loads(b"".join(chunks)))
            continue
        except ValueError:
            error = "no result (memory limit or crash)"
    out.append({"error": error})
sys.stdout.write(json.dumps(out))
'''


@dataclass
class SandboxConfig:
    cpu_seconds: int = 2
    memory_mb: int = 256
    wall_seconds: float = 4.0
    isolate_network: bool = True  # run inside `unshare -rn` (a fresh, empty network namespace)


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

    @property
    def reward(self) -> float:
        """Share of tests passed."""
        return self.passed / self.total if self.total else 0.0

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total


@functools.lru_cache(maxsize=1)
def _netns_prefix() -> tuple[str, ...]:
    """`unshare -rn` when this kernel lets us make a user+network namespace, else nothing."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    try:
        ok = subprocess.run([exe, "-rn", sys.executable, "-I", "-S", "-c", "pass"], capture_output=True,
                            timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return (exe, "-rn") if ok else ()


def network_isolated() -> bool:
    return bool(_netns_prefix())


def run(candidates: list[Candidate], cfg: SandboxConfig | None = None) -> list[Verdict]:
    """Judge a batch of candidates; one verdict each, in order."""
    cfg = cfg or SandboxConfig()
    if not candidates:
        return []
    job = {"limits": {"cpu_seconds": cfg.cpu_seconds, "memory_mb": cfg.memory_mb,
                      "wall_seconds": cfg.wall_seconds},
           "candidates": [{"code": c.code, "fn": c.fn, "inputs": c.inputs} for c in candidates]}
    prefix = _netns_prefix() if cfg.isolate_network else ()
    cmd = [*prefix, sys.executable, "-I", "-S", "-c", _RUNNER]
    proc = subprocess.run(cmd, input=json.dumps(job), capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
                          timeout=len(candidates) * (cfg.wall_seconds + 1) + 30)
    if proc.returncode != 0:
        raise RuntimeError(f"sandbox runner failed ({proc.returncode}): {proc.stderr[-2000:]}")
    raw = json.loads(proc.stdout)
    verdicts = []
    for c, r in zip(candidates, raw):
        if "error" in r:
            verdicts.append(Verdict(0, len(c.expected), r["error"]))
            continue
        outs = r["outputs"]
        verdicts.append(Verdict(sum(o == e for o, e in zip(outs, c.expected)), len(c.expected)))
    return verdicts


def candidate_for(task, completion: str) -> Candidate:
    """A candidate that judges `completion` (the body) as the implementation of a tasks.Task."""
    return Candidate(code=task.prompt + completion, fn=task.name, inputs=task.test_inputs(),
                     expected=[repr(y) for y in task.expected_outputs()])
