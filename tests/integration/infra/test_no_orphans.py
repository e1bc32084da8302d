"""Whichever way the process that started the servers ends, they end with it; and a pid file never makes
us kill a process that merely reuses a recorded pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.paths import REPO_ROOT
from infra.procs import identity, pid_alive, same_process, stop_recorded, write_state

pytestmark = pytest.mark.timeout(300)

CHILD = """
import json, sys, time
from pathlib import Path
from flywheel.kafka import broker as kafka_broker
from serving import gateway_process
from serving.replica.process import ReplicaConfig, start
model, tmp, threads = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
replica = start(ReplicaConfig(model_path=model, log_dir=tmp / "logs", threads=threads), wait=False)
broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp / "kafka"))
replica.ready()
gateway = gateway_process.start([replica.url], model, tmp / "gw", kafka=broker.bootstrap)
print(json.dumps([broker.pid, replica.pid, gateway.pid, replica.tmp_dir]), flush=True)
time.sleep(600)
"""


def group(pgid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if pid_alive(int(p))]


def sglang_children(pid: int) -> dict[int, bool]:
    """SGLang's scheduler and detokenizer under a replica's launcher -> whether each was spawned: a spawned
    child was exec'd with the environment SGLang set up just before (SGLANG_RUN_ID in /proc/<pid>/environ,
    which is what a process got at exec); a forked one shares the launcher's, from before."""
    out = {}
    for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split():
        if Path(f"/proc/{child}/comm").read_text().startswith("sglang::"):
            out[int(child)] = b"SGLANG_RUN_ID=" in Path(f"/proc/{child}/environ").read_bytes()
    return out


def test_servers_die_with_the_process_that_started_them(test_model, tmp_path):
    """A broker, an SGLang replica (launcher, scheduler, detokenizer) and a gateway (and its shipper),
    started the way the test fixtures and the demo start them; then their parent is killed, with no
    chance to clean up (SIGKILL) or without cleaning up (SIGTERM, as pytest does on a second Ctrl-C). What
    SGLang left in its private temp dir (ipc sockets, metric files) goes with the next look at the replicas.

    Two such parents side by side (they load at once): one whose replica's children were forked (one torch
    thread, as fleets run it) and is killed with SIGKILL, one whose replica's were spawned (torch's default
    threads: serving.replica.cpu_compat keeps "spawn" while OpenMP's workers run) and gets SIGTERM. The signal reaches
    the launcher's parent; the start method decides only how its children began."""
    from serving.replica.process import running

    ways = {signal.SIGKILL: 1, signal.SIGTERM: 0}  # signal -> the replica's torch threads
    procs = {
        how: subprocess.Popen(
            [sys.executable, "-c", CHILD, str(test_model), str(tmp_path / how.name), str(threads)],
            cwd=REPO_ROOT,
            # Torch's default threads where threads=0, whatever this run was given.
            env={**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}, "PYTHONPATH": str(REPO_ROOT)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for how, threads in ways.items()
    }
    started = {}
    try:
        for how, proc in procs.items():
            *pids, tmp_dir = json.loads(proc.stdout.readline())
            started[how] = (pids, tmp_dir)
            assert os.listdir(tmp_dir), "SGLang put nothing in the replica's own temp dir"
            spawned = sglang_children(pids[1])
            assert len(spawned) == 2 and set(spawned.values()) == {ways[how] == 0}, (how.name, spawned)
            groups = {p: group(p) for p in pids}
            assert all(groups.values()) and len(groups[pids[1]]) >= 3, groups  # SGLang's children: its group
    finally:
        for how, proc in procs.items():
            proc.send_signal(how)
            proc.wait()
    pids = [p for ps, _ in started.values() for p in ps]
    deadline = time.monotonic() + 60
    while any(group(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {p: group(p) for p in pids if group(p)}
    for members in left.values():  # do not leak them into the rest of the run, whatever the verdict
        for m in members:
            os.kill(m, signal.SIGKILL)
    assert not left, f"processes outlived their parent: {left}"
    for ps, tmp_dir in started.values():
        assert ps[1] not in [r.pid for r in running()] and not os.path.exists(tmp_dir)


def test_a_pid_file_whose_pid_was_reused_kills_nobody(tmp_path):
    stranger = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        recorded = identity(stranger.pid)
        assert same_process(recorded)
        # The same pid, recorded for a process that started at another time (a reboot, an OOM kill and reuse).
        stale = {**recorded, "start_ticks": recorded["start_ticks"] - 1000}
        state = tmp_path / "server.json"
        write_state(state, stale)
        assert not same_process(stale)
        assert stop_recorded(stranger.pid, state)  # forgotten...
        assert not state.exists() and stranger.poll() is None  # ...and the stranger lives
        write_state(state, {**recorded, "boot_id": "another-boot"})
        assert not same_process(json.loads(state.read_text()))
    finally:
        stranger.kill()
        stranger.wait()


LEADER = """
import subprocess, sys, time
from infra.procs import spawn
# A server whose leader dies on SIGTERM but leaves a child that ignores it (multiprocessing's resource
# tracker does; SGLang leaves it when interrupted while starting).
server = spawn([sys.executable, "-c", "import signal, subprocess, sys, time; subprocess.Popen([sys.executable, "
                "'-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); "
                "time.sleep(600)"])
print(server.pid, flush=True)
time.sleep(600)
"""


def test_a_child_that_ignores_sigterm_dies_with_the_parent_of_its_server(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", LEADER],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pgid = int(proc.stdout.readline())
        deadline = time.monotonic() + 30
        while len(group(pgid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(group(pgid)) == 2
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while group(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = group(pgid)
    for m in left:
        os.kill(m, signal.SIGKILL)
    assert not left, f"left behind: {left}"


def test_the_group_guard_leaves_when_its_server_is_stopped():
    from infra.procs import spawn, stop_pid

    server = spawn(["sleep", "600"])
    assert server.guard.poll() is None
    assert stop_pid(server.pid)
    assert server.guard.wait(timeout=10) == 0
