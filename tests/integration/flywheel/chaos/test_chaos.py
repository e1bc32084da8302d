"""A short chaos run in the suite (the full one is `python -m benchmarks.chaos`): a fleet, the trainer and
simulated users, with kill -9 of the gateway, the shipper, an agent, the trainer and the broker, and a
full event-spool disk, on a seeded schedule. Nothing lost, nothing trained twice, nothing stuck, nothing
left running, no user request failed outside a gateway kill."""

from __future__ import annotations

import pytest

from flywheel.chaos.run import ChaosConfig, run

pytestmark = pytest.mark.timeout(900)


def test_a_short_chaos_run_loses_nothing(tmp_path):
    r = run(
        ChaosConfig(
            duration_s=30.0,
            min_faults=5,  # one of each kind but one, however long their recoveries take
            seed=3,
            out_dir=tmp_path / "chaos",
            users=3,
            gap_s=(3.0, 6.0),
            publish_interval_s=20.0,
            settle_s=150.0,
            full_s=8.0,
            kinds=("gateway", "shipper", "agent", "trainer", "broker", "disk_spool"),
        )
    )
    assert r["faults_injected"] >= 5 and r["fault_kinds"] >= 5, r["faults"]
    assert r["faults_not_recovered"] == 0, r["faults"]
    assert r["requests"] > 50 and r["samples_trained"] > 0
    for k in ("events_lost", "samples_double_trained", "stuck_replicas", "orphans", "user_failed_outside_gateway_kill"):
        assert r[k] == 0, (k, r)
    assert r["fleet_on_newest_s"] is not None, r  # the fleet reached the newest version within the settle


def test_an_interrupted_chaos_run_leaves_no_mount_and_no_process(tmp_path):
    """SIGTERM to `flywheel chaos` while its fleet starts: it tears down (fleet stopped, small
    filesystems unmounted); a run killed outright leaves mounts that the next run into the same
    directory removes first."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from flywheel.chaos.faults import mount_tmpfs, mounts_under
    from infra.paths import REPO_ROOT
    from infra.procs import pid_alive

    out = tmp_path / "chaos"
    mount_tmpfs(out / "gateway" / "spool", 1)  # as a run killed with SIGKILL leaves it
    proc = subprocess.Popen(
        [sys.executable, "-m", "flywheel", "chaos", "--duration", "5", "--out", str(out)],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(mounts_under(out)) < 3 and time.monotonic() < deadline:  # the stale one went, three are new
            time.sleep(0.1)
        assert len(mounts_under(out)) == 3
        time.sleep(3)  # the fleet is starting
        proc.send_signal(signal.SIGTERM)
        log = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for m in mounts_under(out):
            subprocess.run(["umount", "-l", str(m)], check=False)
    assert "left by an earlier run" in log, log[-2000:]
    assert not mounts_under(out), log[-2000:]
    members = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert not [p for p in members if pid_alive(int(p))], log[-2000:]
