"""The chaos run's faults: what each does to the running fleet, and how it is undone (a process killed is
restarted the way an operator or a supervisor would: same ports, same data; a disk filled is emptied; an
outage ends), then how long the fleet took to recover.

    kill -9 of   gateway, shipper (the gateway restarts it), replica, agent, store, broker, trainer
    disk full    on the event spool, the weight store and the trainer's checkpoints (each lives on a
                 small tmpfs the run mounts; a ballast file fills it for a while)
    outages      the store down across a version switch; the broker down for 30 s

`Faults` holds what they act on (the fleet, the trainer, the pids started); the run
(flywheel.chaos.run.Chaos) sets it up, picks the faults and checks the result.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = (
    "gateway",
    "shipper",
    "replica",
    "agent",
    "store",
    "broker",
    "trainer",
    "disk_spool",
    "disk_store",
    "disk_checkpoint",
    "store_down_switch",
    "broker_down",
)


@dataclass
class Fault:
    kind: str
    at: float  # time.time() of the injection
    recovered_s: float | None = None
    note: str = ""


MOUNT_SOURCE = "flywheel-chaos"  # the source name of the tmpfs mounts a run makes (how a later run knows them)


def mount_tmpfs(path: Path, mb: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", MOUNT_SOURCE, str(path)], check=True)


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def mounts_under(root: Path) -> list[Path]:
    """Our small filesystems at or below `root` (a run killed with SIGKILL leaves them mounted); found by
    their source name, so nothing else mounted there is ever touched."""
    out: list[Path] = []
    with open("/proc/self/mounts") as f:
        for line in f:
            source, mount, fstype = line.split()[:3]
            point = Path(mount.replace("\\040", " "))
            if source == MOUNT_SOURCE and fstype == "tmpfs" and (point == root or root in point.parents):
                out.append(point)
    return sorted(out, key=lambda p: len(p.parts), reverse=True)


def _fill(path: Path) -> Path:
    """Fill the filesystem under `path` with a ballast file (to ENOSPC); returns it."""
    ballast = path / ".ballast"
    # Unbuffered: a buffered file keeps what a full disk refused and raises ENOSPC again when it is closed, which
    # left the ballast in place (the fault never lifted) when the spool had just freed a few pages.
    with open(ballast, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
        except OSError:
            pass
    return ballast


def get_json(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None):
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def _killpg(pid: int, timeout: float = 30.0) -> None:
    """kill -9 a server's process group and wait until every member is gone (and the leader reaped), so
    that what restarts it finds its port free and its pid file stale."""
    from infra.procs import pid_alive

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        members = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split()
        if not pid_alive(pid) and not [m for m in members if pid_alive(int(m))]:
            return
        time.sleep(0.1)


class Faults:
    """Injects one fault at a time into the run's fleet and waits until it has recovered. The run sets the
    state below up (flywheel.chaos.run.Chaos.setup) and says how to start the trainer."""

    cfg: Any  # flywheel.chaos.run.ChaosConfig: the faults read publish_interval_s, full_s, outage_s
    say: Any  # print-like
    out: Path
    rng: random.Random
    model: Path
    fleet: Any  # flywheel.local_fleet.LocalFleet
    trainer: Any  # its subprocess.Popen
    faults: list[Fault]
    gateway_kills: list[tuple[float, float]]  # (killed, back) windows, time.time()
    started_pids: set[int]

    def _start_trainer(self) -> None:
        raise NotImplementedError

    def _wait(self, what: str, check, timeout: float = 180.0) -> float:
        t = time.monotonic()
        while time.monotonic() - t < timeout:
            try:
                if check():
                    return time.monotonic() - t
            except Exception:  # noqa: BLE001 - not back yet
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{what} did not recover within {timeout:.0f} s")

    def _gateway_ok(self) -> bool:
        return bool(get_json(f"{self.fleet.gateway.url}/health").get("status") == "ok")

    def _replicas_ok(self) -> bool:
        reps = self.fleet.admin.replicas()["replicas"]
        return all(r["healthy"] and r["state"] == "active" for r in reps)

    def _latest_checkpoint(self) -> str | None:
        try:
            return (self.out / "trainer" / "checkpoints" / "LATEST").read_text()
        except OSError:
            return None

    def _restart_gateway(self) -> None:
        from serving import gateway_process

        old = self.fleet.gateway
        port = int(old.url.rsplit(":", 1)[1])
        self.fleet.gateway = gateway_process.start(
            [r.url for r in self.fleet.replicas],
            self.model,
            self.out / "gateway",
            kafka=self.fleet.broker.bootstrap,
            keys=self.fleet.keys,
            admin_token=self.fleet.cfg.admin_token,
            port=port,
            env=self.fleet.gateway_env(),
        )
        self.started_pids.add(self.fleet.gateway.pid)

    def inject(self, kind: str) -> Fault:
        import psutil

        from flywheel.kafka import broker as kafka_broker
        from serving.replica.process import ReplicaConfig, start as start_replica

        f, fleet = Fault(kind, time.time()), self.fleet
        self.say(f"chaos: {kind}")
        t0 = time.monotonic()
        if kind == "gateway":
            _killpg(fleet.gateway.pid)
            self._restart_gateway()
            self.gateway_kills.append((f.at - 1.0, time.time() + 1.0))
            self._wait("gateway", self._gateway_ok)
        elif kind == "shipper":
            before = get_json(f"{fleet.gateway.url}/health")["event_log"]["shipper_restarts"]
            kids = [
                p
                for p in psutil.Process(fleet.gateway.pid).children(recursive=True)
                if "spawn" in " ".join(p.cmdline())
            ]
            for p in kids:
                p.kill()
            f.note = f"{len(kids)} killed"
            self._wait(
                "shipper",
                lambda: (
                    get_json(f"{fleet.gateway.url}/health")["event_log"]["shipper_restarts"] > before
                    and self._gateway_ok()
                ),
            )
        elif kind == "replica":
            i = self.rng.randrange(len(fleet.replicas))
            rep = fleet.replicas[i]
            _killpg(rep.pid)
            cfg = ReplicaConfig(
                model_path=self.model,
                log_dir=self.out / "logs",
                threads=1,
                port=rep.port,
                max_total_tokens=fleet.cfg.max_total_tokens,
            )
            new = start_replica(fleet.keyed(cfg, f"r{i}"))
            fleet.replicas[i] = new
            self.started_pids.add(new.pid)
            self._wait("replica", lambda: self._replicas_ok() and len(set(fleet.served_versions().values())) == 1)
        elif kind == "agent":
            name = self.rng.choice(sorted(fleet.agent_pids))
            _killpg(fleet.agent_pids[name])
            i = int(name[1:])
            fleet.agent_pids[name] = fleet._spawn_agent(name, fleet.replicas[i].url)
            self.started_pids.add(fleet.agent_pids[name])
            self._wait("agent", self._replicas_ok)
        elif kind in ("store", "store_down_switch"):
            if kind == "store_down_switch":  # down right as the trainer announces a version
                from weight_sync.store.server import Store

                before = Store(fleet.store_root).latest()
                self._wait(
                    "a new version",
                    lambda: Store(fleet.store_root).latest() != before,
                    timeout=self.cfg.publish_interval_s * 3,
                )
            _killpg(fleet.store_pid)
            if kind == "store_down_switch":
                time.sleep(self.cfg.outage_s)
            port = int(fleet.store_url.rsplit(":", 1)[1])
            fleet.store_url = fleet._spawn_store(port)
            self.started_pids.add(fleet.store_pid)
            auth = {"Authorization": f"Bearer {fleet.store_token}"}  # the fleet read credential (weight_sync)
            self._wait("store", lambda: get_json(f"{fleet.store_url}/versions", headers=auth) is not None)
        elif kind in ("broker", "broker_down"):
            if kind == "broker":
                _killpg(fleet.broker.pid)
            else:
                fleet.broker.stop()
                time.sleep(self.cfg.outage_s)
            fleet.broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=self.out / "kafka"))
            self.started_pids.add(fleet.broker.pid)
            self._wait("broker", lambda: get_json(f"{fleet.gateway.url}/health")["kafka_up"])
        elif kind == "trainer":
            _killpg(self.trainer.pid)
            self.trainer.wait()
            latest = self._latest_checkpoint()
            self._start_trainer()
            # Back when it has resumed and committed a checkpoint of its own (it trains on the users' feedback).
            self._wait(
                "trainer", lambda: self.trainer.poll() is None and self._latest_checkpoint() != latest, timeout=240
            )
        elif kind.startswith("disk_"):
            where = {
                "disk_spool": "gateway/spool",
                "disk_store": "weights/store",
                "disk_checkpoint": "trainer/checkpoints",
            }[kind]
            ballast = _fill(self.out / where)
            time.sleep(self.cfg.full_s)
            ballast.unlink()
            self._wait(kind, lambda: self._gateway_ok() and self.trainer.poll() is None)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        f.recovered_s = round(time.monotonic() - t0, 1)
        self.faults.append(f)
        return f
