"""serving.replica.process.start around its launch: the port it picks is held from launch until the replica listens,
and no step that fails leaves a held port, a temp dir or an unrecorded process behind. The launched command is a
`sleep` in place of SGLang (what start does around it is under test here;
tests/integration/serving/replica/test_replica.py starts the real one)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from infra import procs
from serving.replica import process as rep

pytestmark = pytest.mark.timeout(60)


class Holds(list):
    """The sockets reserve_port handed out, and their ports (a closed socket no longer says)."""

    def __init__(self):
        super().__init__()
        self.ports: list[int] = []


@pytest.fixture
def sleeper(monkeypatch, tmp_path):
    """start() launching `sleep 60`; every socket reserve_port handed out, and the config to start with."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(rep, "command", lambda cfg, port: ["sleep", "60"])
    holds = Holds()

    def reserve(host="127.0.0.1"):
        holds.append(procs.reserve_port(host))
        holds.ports.append(holds[-1].getsockname()[1])
        return holds[-1]

    monkeypatch.setattr(rep, "reserve_port", reserve)
    return holds, rep.ReplicaConfig(model_path=str(tmp_path), log_dir=str(tmp_path / "logs"))


def _temp_dirs(port: int) -> list[Path]:
    import tempfile

    return list(Path(tempfile.gettempdir()).glob(f"{rep.TMP_PREFIX}{port}-*"))


def test_the_picked_port_is_held_until_stop(sleeper):
    holds, cfg = sleeper
    r = rep.start(cfg, wait=False)
    try:
        assert [h.getsockname()[1] for h in holds] == [r.port] and r.port_hold is holds[0]
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", r.port))  # while it "loads", nobody else binds its port
        assert r.alive() and rep.find(r.port) is not None
    finally:
        assert r.stop()
    assert holds[0].fileno() == -1 and not r.alive() and rep.find(r.port) is None and not _temp_dirs(r.port)


def test_a_given_port_is_not_held(sleeper):
    holds, cfg = sleeper
    cfg.port = procs.free_port()
    r = rep.start(cfg, wait=False)
    try:
        assert holds == [] and r.port_hold is None and r.port == cfg.port
    finally:
        assert r.stop()


def test_a_failed_spawn_leaves_no_hold_and_no_temp_dir(sleeper, monkeypatch):
    holds, cfg = sleeper

    def fail(*a, **kw):
        raise OSError("no such launcher")

    monkeypatch.setattr(rep, "spawn", fail)
    with pytest.raises(OSError, match="no such launcher"):
        rep.start(cfg, wait=False)
    [hold] = holds
    assert hold.fileno() == -1 and not _temp_dirs(holds.ports[0])


def test_a_replica_whose_state_cannot_be_recorded_is_stopped(sleeper, monkeypatch):
    """Unrecorded, it would outlive us unseen (`flywheel replica start` returns and leaves it running)."""
    holds, cfg = sleeper
    spawned = []
    real_spawn = rep.spawn
    monkeypatch.setattr(rep, "spawn", lambda *a, **kw: spawned.append(real_spawn(*a, **kw)) or spawned[-1])

    def fail(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rep, "write_state", fail)
    try:
        with pytest.raises(OSError, match="No space"):
            rep.start(cfg, wait=False, die_with_parent=False)
        [proc] = spawned
        assert proc.wait(timeout=20) is not None and not procs.pid_alive(proc.pid)
    finally:
        for p in spawned:  # this test leaves nothing behind, even when what it tests does
            p.kill()
            p.wait()
    [hold] = holds
    assert hold.fileno() == -1 and not _temp_dirs(holds.ports[0])


def test_interrupted_while_it_loads_it_is_stopped(sleeper, monkeypatch):
    """A Ctrl-C while waiting for it to generate stops it (ready() catches more than its own errors)."""
    holds, cfg = sleeper
    r = rep.start(cfg, wait=False)

    def interrupt(url, timeout=5.0):
        raise KeyboardInterrupt

    monkeypatch.setattr(rep, "healthy", interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            r.ready(timeout_s=5)
        stopped = not r.alive()
    finally:
        procs.stop_pid(r.pid)  # this test leaves nothing behind, even when what it tests does
    assert stopped and holds[0].fileno() == -1 and rep.find(r.port) is None
    assert os.path.exists(r.log_file)
