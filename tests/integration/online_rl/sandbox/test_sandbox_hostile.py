"""The hostile-candidate corpus against the real bubblewrap sandbox.

For every case: the reward is what an honest evaluator gives, the attempt is counted by kind, and
afterwards nothing outside the sandbox changed (the cache and the repo fingerprinted before and after),
no sandbox process is left, and this process (the harness, standing where the trainer stands) lives on.
The broker and the gateway are the real ones of the test session, so "connect to the broker" means it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

import psutil
import pytest

from infra.paths import REPO_ROOT, flywheel_home
from online_rl.sandbox import judge as sandbox
from tests import hostile_candidates as hc
from tests.hostile_candidates import fingerprint

pytestmark = pytest.mark.timeout(300)
CFG = sandbox.SandboxConfig(cpu_seconds=1, wall_seconds=3.0)


def sandbox_processes(runner: int | None = None) -> list[psutil.Process]:
    """The sandbox processes that `runner` (a pid; this process by default) started: its block of outer uids
    (online_rl.sandbox.process.outer_uid), not another process's, which a test run beside this one may have."""
    low = CFG.outer_uid_base + ((runner or os.getpid()) % 4096) * 64
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        try:
            if low <= p.info["uids"].real < low + 64 and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, TypeError):
            pass
    return found


def wait_no_sandbox_processes(runner: int | None = None, timeout: float = 5.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := sandbox_processes(runner)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    """A signing key on disk (world-readable: only the sandbox's walls keep it out) and a cache file."""
    from weight_sync.manifest import generate_key

    keys = tmp_path_factory.mktemp("keys")
    generate_key(keys / "signing.pem", keys / "signing.pub")
    os.chmod(keys / "signing.pem", 0o644)
    os.chmod(keys, 0o755)
    home = flywheel_home()
    cache_file = next(p for p in (home / "venv" / "pyvenv.cfg", home / "setup.lock") if p.exists())
    return {
        "key": keys / "signing.pem",
        "cache_file": cache_file,
        "cache_dir": home,
        "repo_file": REPO_ROOT / "online_rl" / "tasks.py",
        "repo_dir": REPO_ROOT,
    }


# Alone (tests/README.md): its busy loops must meet the CPU limit before the wall limit, which another test's load
# on the same cores reverses; and it fingerprints $FLYWHEEL_HOME and the repo, which tests beside it write.
@pytest.mark.serial
def test_corpus_is_contained(secrets, kafka_bootstrap, gateway):
    assert len(hc.CASES) + len(hc.LEFTOVER_PAIR) >= 30
    ports = [urlparse(f"//{kafka_bootstrap}").port, urlparse(gateway.url).port]
    for port in ports:  # the servers are really there, from outside the sandbox
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    values = dict(secrets, ports=ports, harness_pid=os.getpid(), stdlib=sandbox.interpreter()[1])
    before = {"cache": fingerprint(flywheel_home()), "repo": fingerprint(REPO_ROOT)}
    counted_before = {k: sandbox.CONTAINED.labels(k)._value.get() for k in {c.kind for c in hc.CASES if c.kind}}

    t0 = time.monotonic()
    verdicts = sandbox.run([hc.render(c, **values) for c in hc.CASES], CFG)
    pair = sandbox.run(
        [hc.render(c, **values) for c in hc.LEFTOVER_PAIR],
        sandbox.SandboxConfig(cpu_seconds=1, wall_seconds=3.0, workers=1),
    )
    elapsed = time.monotonic() - t0

    wrong = [
        (c.name, c.honest, v) for c, v in zip(hc.CASES + hc.LEFTOVER_PAIR, verdicts + pair) if not hc.contained(c, v)
    ]
    assert not wrong, "\n".join(f"{n}: honest reward {h}, got {v}" for n, h, v in wrong)
    assert wait_no_sandbox_processes() == []
    assert fingerprint(flywheel_home()) == before["cache"]
    assert fingerprint(REPO_ROOT) == before["repo"]
    for kind, n in counted_before.items():
        expected = sum(1 for c in hc.CASES if c.kind == kind)
        assert sandbox.CONTAINED.labels(kind)._value.get() - n >= expected, kind
    assert elapsed < 120  # wall limits hold: 6 cases sit out their 3 s, two at a time
    # The harness is alive (this test still runs) and judges an honest candidate as before.
    assert sandbox.run([hc.render(hc.Hostile("honest", None, 1, "return x + 3"))], CFG)[0].ok


def test_harness_killed_mid_run_leaves_nothing(tmp_path):
    """kill -9 of the process running the sandbox: every sandbox process goes with it."""
    import subprocess
    import sys

    script = (
        "from tests import hostile_candidates as hc\nfrom online_rl.sandbox import judge as sandbox\n"
        "c = hc.render(hc.Hostile('sleep', None, 0, 'import time\\ntime.sleep(1000)'))\n"
        "sandbox.run([c, c], sandbox.SandboxConfig(wall_seconds=120, cpu_seconds=60))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    )
    try:
        deadline = time.monotonic() + 60
        while len(sandbox_processes(proc.pid)) < 4 and time.monotonic() < deadline:  # 2 x (bwrap, init, python)
            time.sleep(0.1)
        assert len(sandbox_processes(proc.pid)) >= 4
    finally:
        proc.kill()
        proc.wait()
    assert wait_no_sandbox_processes(proc.pid) == []


def test_refuses_without_bubblewrap(monkeypatch):
    """No silent fallback: without bwrap the sandbox says why and runs nothing."""
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sandbox, "_checked", type(sandbox._checked)())  # a fresh process's first run
    with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap"):
        sandbox.run([hc.render(hc.Hostile("honest", None, 1, "return x + 3"))])


def test_refuses_when_bwrap_cannot_isolate(monkeypatch):
    """A bwrap that cannot create namespaces (as where user namespaces are off) makes the sandbox refuse."""
    import shutil
    import tempfile

    bin_dir = Path(tempfile.mkdtemp(prefix="fake-bwrap-"))
    bin_dir.chmod(0o755)  # the sandbox's unprivileged uid must be able to start it
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(sandbox, "_checked", type(sandbox._checked)())
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="namespace"):
            sandbox.run([hc.render(hc.Hostile("honest", None, 1, "return x + 3"))])
    finally:
        shutil.rmtree(bin_dir)
