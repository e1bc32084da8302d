"""`flywheel chaos`: the whole loop under faults, and a check that nothing was lost, trained twice, left
stuck or left running.

A local fleet (broker, weight store, SGLang replicas, gateway, one agent per replica) and the trainer
(publishing every `publish_interval_s`) run under continuous simulated IDE traffic with feedback. At
seeded random moments one fault (flywheel.chaos.faults: kills, disks full, outages) is injected and
undone, and the time it took to recover from is kept.

At the end, after a settle period: completion and feedback events the users were answered for vs the
ones in Kafka (by completion id; duplicates dropped by event_id; gateway kills included, since an answer
waits for the event to be on disk), samples trained twice (trainer ledger), replicas not
on the newest version or not active, processes left over, user requests that failed outside the
windows of a gateway kill, and the time each fault took to recover from.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flywheel.demo.population import Population
    from flywheel.local_fleet import LocalFleet

from flywheel.chaos.faults import KINDS, Fault, Faults, get_json, mount_tmpfs, mounts_under, umount
from infra.config import add_flags, build, option


@dataclass
class ChaosConfig:
    duration_s: float = option(600.0, flag="duration", help="seconds of fault injection")
    # Faults to inject however long they take: a fault's recovery takes longer on a loaded machine, and a
    # fixed duration then fits fewer of them (3 of 5 in 60 s once, a gateway restart taking 26 s).
    min_faults: int = option(0, help="keep injecting past --duration until this many faults were injected")
    seed: int = option(0, help="the faults' draw: the same seed, the same faults at the same times")
    out_dir: Path = option(Path("chaos_out"), flag="out", help="where the fleet runs and chaos.json goes")
    preset: str = "test"  # the model (online_rl.model.bootstrap preset)
    users: int = 3
    publish_interval_s: float = 60.0
    gap_s: tuple[float, float] = (15.0, 30.0)  # between the end of one fault's recovery and the next fault
    kinds: tuple[str, ...] = KINDS
    settle_s: float = 120.0  # after the last fault: time for the fleet to reach the newest version
    disk_mb: int = 256  # each tmpfs (spool, store, checkpoints)
    full_s: float = 15.0  # how long a disk stays full
    outage_s: float = 30.0  # broker down / store down


class Chaos(Faults):
    """The run: sets the fleet and the trainer up, injects the faults (Faults), checks, tears down."""

    def __init__(self, cfg: ChaosConfig, say=print):
        self.cfg = cfg
        self.say = say
        self.out = Path(cfg.out_dir).resolve()
        self.rng = random.Random(cfg.seed)
        self.faults: list[Fault] = []
        self.gateway_kills: list[tuple[float, float]] = []  # (killed, back) windows, time.time()
        self.mounts: list[Path] = []
        self.started_pids: set[int] = set()
        self._fleet: LocalFleet | None = None  # set by setup()
        self.trainer: subprocess.Popen | None = None
        self.pop: Population | None = None

    @property
    def fleet(self) -> LocalFleet:
        assert self._fleet is not None, "Chaos.setup() starts the fleet"
        return self._fleet

    # ------------------------------------------------------------------ setup
    def _trainer_cmd(self) -> list[str]:
        f = self.fleet
        return [
            sys.executable,
            "-m",
            "flywheel",
            "train",
            "--model",
            str(self.model),
            "--work-dir",
            str(self.out / "trainer"),
            "--kafka",
            f.broker.bootstrap,
            "--publish-interval",
            str(self.cfg.publish_interval_s),
            "--store",
            str(f.store_root),
            "--key",
            str(f.signing_key),
            "--store-url",
            f.store_url,
            "--lr",
            "1e-4",
            "--threads",
            "1",
            "--min-batch",
            "4",
        ]

    def _trainer_alive(self) -> bool:
        return self.trainer is not None and self.trainer.poll() is None

    def _start_trainer(self) -> None:
        from infra.paths import REPO_ROOT
        from infra.procs import spawn

        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        with open(self.out / "logs" / "trainer.log", "ab") as log:
            self.trainer = spawn(
                self._trainer_cmd(),
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), **self.fleet.kafka_env("trainer")),
            )
        self.started_pids.add(self.trainer.pid)

    def setup(self) -> None:
        from flywheel.demo.population import HouseStyle, Population, PopulationConfig
        from flywheel.local_fleet import LocalFleet, LocalFleetConfig
        from online_rl.model.bootstrap import bootstrap

        if os.geteuid() != 0:
            raise RuntimeError("flywheel chaos mounts small filesystems for its disk-full faults: run it as root")
        self.model = bootstrap(self.cfg.preset, seed=0, progress=False)
        for stale in mounts_under(self.out):  # left by an earlier run into this directory that was killed
            self.say(f"chaos: unmounting {stale}, left by an earlier run")
            umount(stale)
        self.out.mkdir(parents=True, exist_ok=True)
        for sub in ("gateway/spool", "weights/store", "trainer/checkpoints"):
            mount_tmpfs(self.out / sub, self.cfg.disk_mb)
            self.mounts.append(self.out / sub)
        self._fleet = LocalFleet(
            LocalFleetConfig(model=self.model, out_dir=self.out, replicas=2, tenants=4), say=self.say
        )
        self.fleet.start()
        assert self.fleet.store_pid is not None, "start() spawned the store"
        self.started_pids |= {
            self.fleet.broker.pid,
            self.fleet.gateway.pid,
            self.fleet.store_pid,
            *self.fleet.agent_pids.values(),
            *(r.pid for r in self.fleet.replicas),
        }
        self._start_trainer()
        self.pop = Population(
            PopulationConfig(users=self.cfg.users, seed=self.cfg.seed),
            self.fleet.gateway.url,
            list(self.fleet.keys.values()),
            preference=HouseStyle(),
        ).start()

    def run_faults(self) -> None:
        end = time.monotonic() + self.cfg.duration_s
        order = list(self.cfg.kinds)
        self.rng.shuffle(order)
        i = 0
        while time.monotonic() < end or i < self.cfg.min_faults:
            time.sleep(self.rng.uniform(*self.cfg.gap_s))
            if time.monotonic() >= end and i >= self.cfg.min_faults:
                break
            kind = order[i % len(order)]
            i += 1
            try:
                self.inject(kind)
            except Exception as e:  # noqa: BLE001 - a fault the system did not recover from is a finding
                self.faults.append(Fault(kind, time.time(), None, f"not recovered: {e}"))
                self.say(f"chaos: {kind} NOT RECOVERED: {e}")

    # ------------------------------------------------------------------ checks
    def check(self) -> dict:
        from contracts import events as ev
        from flywheel.chaos.audit import read_topic, trained_keys
        from weight_sync.store.server import Store

        fleet, pop = self.fleet, self.pop
        assert pop is not None, "setup() started the users"
        pop.stop()
        records = pop.snapshot()
        t = time.monotonic()
        latest = Store(fleet.store_root).latest()
        try:
            self._wait(
                "the fleet on the newest version",
                lambda: (
                    set(fleet.served_versions().values()) == {Store(fleet.store_root).latest()} and self._replicas_ok()
                ),
                timeout=self.cfg.settle_s,
            )
            on_version_s = round(time.monotonic() - t, 1)
        except TimeoutError:
            on_version_s = None
        self._wait(
            "the event spool drained",
            lambda: get_json(f"{fleet.gateway.url}/health")["spool_pending_bytes"] == 0,
            timeout=120,
        )
        served = [r for r in records if r.outcome != "failed" and r.completion_id]
        completions = read_topic(fleet.broker.bootstrap, ev.TOPIC_COMPLETIONS).per_completion
        feedback = read_topic(fleet.broker.bootstrap, ev.TOPIC_FEEDBACK).per_completion
        lost_c = [r.completion_id for r in served if r.completion_id not in completions]
        judged = [r for r in served if r.outcome in ("accept", "reject")]
        lost_f = [r.completion_id for r in judged if r.completion_id not in feedback]

        def in_gateway_kill(r) -> bool:
            return any(a <= r.started + r.latency_s and r.started <= b for a, b in self.gateway_kills)

        failed = [r for r in records if r.outcome == "failed"]
        failed_outside = [r for r in failed if not in_gateway_kill(r)]
        ledger = trained_keys(self.out / "trainer")
        twice = len(ledger) - len(set(ledger))
        stuck = [r["id"] for r in fleet.admin.replicas()["replicas"] if r["state"] != "active" or not r["healthy"]]
        return {
            "faults_injected": len(self.faults),
            "fault_kinds": len({f.kind for f in self.faults}),
            "faults_not_recovered": sum(f.recovered_s is None for f in self.faults),
            "requests": len(records),
            "completion_events": len(served),
            "feedback_events": len(judged),
            # Answered means on disk (the gateway waits for the spool's fsync): none may be lost, gateway
            # kills included.
            "events_lost": len(lost_c) + len(lost_f),
            "events_lost_ids": (lost_c + lost_f)[:20],
            "samples_trained": len(ledger),
            "samples_double_trained": twice,
            "stuck_replicas": len(stuck),
            "fleet_version": latest,
            "fleet_on_newest_s": on_version_s,
            "user_failed_outside_gateway_kill": len(failed_outside),
            "user_failed_in_gateway_kill": len(failed) - len(failed_outside),
            "max_recovery_s": max((f.recovered_s or 0.0 for f in self.faults), default=0.0),
            "faults": [asdict(f) for f in self.faults],
        }

    # ------------------------------------------------------------------ teardown
    def teardown(self) -> int:
        """Stop everything; returns how many processes this run started are still alive after."""
        import psutil

        from infra.procs import stop_pid

        if self.pop is not None:
            self.pop.stop()
        if self.trainer is not None:
            stop_pid(self.trainer.pid)
        if self._fleet is not None:
            self._fleet.stop()
        marker = str(self.out)
        # This process and whatever runs it (a `timeout` or a shell whose command line names the out dir).
        ours = {os.getpid(), *(p.pid for p in psutil.Process().parents())}

        def still_running() -> list[int]:
            left = []
            for p in psutil.process_iter(["cmdline"]):
                try:
                    mine = (
                        p.pid in self.started_pids
                        or os.getpgid(p.pid) in self.started_pids
                        or marker in " ".join(p.info["cmdline"] or [])
                    )
                    if mine and p.pid not in ours and p.status() != psutil.STATUS_ZOMBIE:
                        left.append(p.pid)
                except (psutil.Error, ProcessLookupError):
                    pass
            return left

        # A server stopped by SIGTERM takes a few seconds to go (a broker flushing, SGLang's children):
        # an orphan is one still there after 30 s.
        deadline = time.monotonic() + 30
        while (left := still_running()) and time.monotonic() < deadline:
            time.sleep(0.5)

        def described(pid: int) -> str:
            try:
                return f"{pid} {' '.join(psutil.Process(pid).cmdline())[:200]}"
            except psutil.Error:
                return f"{pid} (gone)"

        if left:
            self.say("chaos: still running after teardown: " + "; ".join(map(described, left)))
        for m in self.mounts:
            umount(m)
        return len(left)


def table(result: dict) -> str:
    lines = [f"{'fault':20s} {'at':>8s} {'recovered s':>12s}  note"]
    t0 = min((f["at"] for f in result["faults"]), default=0.0)
    for f in result["faults"]:
        rec = "-" if f["recovered_s"] is None else f"{f['recovered_s']:.1f}"
        lines.append(f"{f['kind']:20s} {f['at'] - t0:8.1f} {rec:>12s}  {f['note']}")
    lines.append("")
    for k in (
        "faults_injected",
        "fault_kinds",
        "events_lost",
        "samples_double_trained",
        "stuck_replicas",
        "orphans",
        "user_failed_outside_gateway_kill",
        "user_failed_in_gateway_kill",
        "max_recovery_s",
        "fleet_on_newest_s",
        "requests",
        "completion_events",
        "feedback_events",
    ):
        lines.append(f"{k:34s} {result.get(k)}")
    return "\n".join(lines)


def run(cfg: ChaosConfig, say=print) -> dict:
    chaos = Chaos(cfg, say)
    result: dict = {}
    try:
        chaos.setup()
        chaos.run_faults()
        result = chaos.check()
    finally:
        result["orphans"] = chaos.teardown()
    (chaos.out / "chaos.json").write_text(json.dumps(result, indent=2))
    say(table(result))
    return result


@dataclass
class ChaosArgs:
    kinds: str = option("", help=f"comma-separated subset of {','.join(KINDS)} (empty: all)")


def _main(args) -> int:
    def _term(*_):  # SIGTERM (a supervisor, a CI timeout) tears down like Ctrl-C: stop the fleet, unmount
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the teardown short
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    kinds = build(ChaosArgs, args).kinds
    cfg = build(ChaosConfig, args, kinds=tuple(kinds.split(",")) if kinds else KINDS)
    r = run(cfg)
    bad = (
        r.get("events_lost"),
        r.get("samples_double_trained"),
        r.get("stuck_replicas"),
        r.get("orphans"),
        r.get("user_failed_outside_gateway_kill"),
        r.get("faults_not_recovered"),
    )
    return 0 if all(x == 0 for x in bad) and r.get("fleet_on_newest_s") is not None else 1


def register(sub) -> None:
    p = sub.add_parser(
        "chaos",
        help="the loop under seeded faults (kills, disk full, outages), then a check "
        "that nothing was lost, trained twice, stuck or left running (root)",
    )
    add_flags(p, ChaosConfig)
    add_flags(p, ChaosArgs)
    p.set_defaults(func=_main)
