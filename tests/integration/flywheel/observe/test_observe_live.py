"""A real Prometheus on a real fleet (broker, store, two SGLang replicas, gateway, agents): every component is
scraped, the gateway's per-version series agree with what the users were told, every Grafana expression evaluates,
`flywheel status` reads it all, and alerts fire for real: a corrupt version published, a replica killed, the broker
stopped; then every command of every runbook runs against that broken fleet, and the fixes they give clear the
alerts. The repo's alert rules are used as they are, with their `for:` cut to 0 s (a test cannot wait minutes;
promtool's unit tests check the durations, tests/unit/flywheel/observe/test_alert_rules.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from flywheel.local_fleet import LocalFleet, LocalFleetConfig
from flywheel.observe.alert_rules import alert_names, load_rules, runbook_commands, with_for, write_rules
from flywheel.observe.prometheus import Prometheus, PrometheusConfig, binary_path, fleet_targets, sleep_scrapes
from infra.procs import free_port, wait_until
from tests.helpers import post

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(binary_path() is None, reason="prometheus not installed (scripts/setup.sh)"),
]


def fast_rules(out) -> Path:
    return write_rules(with_for(load_rules(), "0s"), out / "alerts_fast.yml")


@pytest.fixture(scope="module")
def observed(test_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("observed")
    fleet = LocalFleet(LocalFleetConfig(model=test_model, out_dir=out / "fleet", replicas=2, tenants=2))
    cfg = PrometheusConfig(
        data_dir=out / "prometheus", scrape_interval_s=1.0, evaluation_interval_s=1.0, rule_files=[fast_rules(out)]
    )
    with fleet, Prometheus(cfg) as prom:
        prom.set_targets(fleet_targets(fleet))
        prom.wait_scraped(("gateway", "sglang", "agent", "store"), timeout_s=60)
        yield fleet, prom


def wait_for(prom, expr: str, timeout_s: float, what: str) -> list[dict]:
    """Poll an instant query until it returns a non-empty vector."""
    rows: list[dict] = []

    def some() -> bool:
        nonlocal rows
        rows = prom.query(expr)
        return bool(rows)

    wait_until(some, timeout_s, interval=1.0, what=what)
    return rows


def complete(fleet, n: int) -> list[tuple[str, int | None]]:
    """n completions through the gateway; (completion id, serving version) each."""
    key = next(iter(fleet.keys.values()))
    out = []
    for i in range(n):
        status, body, _ = post(
            f"{fleet.gateway.url}/v1/completions",
            {"model": "flywheel-coder", "prompt": f"def f{i}(x):\n", "max_tokens": 4},
            key=key,
        )
        assert status == 200, body
        out.append((body["id"], body.get("model_version")))
    return out


def test_every_component_is_scraped_and_per_version_acceptance_agrees(observed):
    fleet, prom = observed
    health = prom.targets_health()
    assert health["sglang"] == ["up", "up"] and health["agent"] == ["up", "up"], health
    assert health["gateway"] == ["up"] and health["store"] == ["up"], health
    done = complete(fleet, 12)
    # sglang_*: Prometheus 2 asks for OpenMetrics, and prometheus_client escapes SGLang's "sglang:" then.
    own = wait_for(prom, 'count by (__name__) ({job="sglang", __name__=~"sglang_.+"})', 30, "SGLang's own metrics")
    assert len(own) > 5, own
    key = next(iter(fleet.keys.values()))
    verdicts = {}
    for i, (cid, version) in enumerate(done):
        kind = "accept" if i % 3 else "reject"
        status, body, _ = post(f"{fleet.gateway.url}/v1/feedback", {"completion_id": cid, "kind": kind}, key=key)
        assert status == 200, body
        verdicts.setdefault(str(version), []).append(kind)
    from flywheel.observe.command import ACCEPTANCE, JUDGED

    def scraped() -> bool:
        return sum(prom.values(JUDGED, "version").values()) == len(done)

    wait_until(scraped, 30, interval=0.5, what="the feedback in Prometheus")
    acceptance = prom.values(ACCEPTANCE, "version")
    expected = {v: kinds.count("accept") / len(kinds) for v, kinds in verdicts.items()}
    assert acceptance == pytest.approx(expected), (acceptance, expected)
    assert set(prom.values("flywheel_replica_weight_version", "replica").values()) == {0.0}


def test_every_dashboard_expression_evaluates_on_the_live_prometheus(observed):
    from flywheel.observe.dashboard import expressions, load_dashboard, promql_for_query

    _, prom = observed
    sleep_scrapes(prom.cfg, 3)  # series born by the traffic above need two samples for a rate
    exprs = expressions(load_dashboard())
    assert len(exprs) >= 15
    errors, empty = [], set()
    for title, expr in exprs:
        try:  # windows wide enough to hold this module's traffic, whenever it came
            if not prom.query(promql_for_query(expr, rate_interval="10m", range_="1h")):
                empty.add(title)
        except ValueError as e:
            errors.append(f"{title}: {e}")
    assert not errors, errors
    # Panels stay empty where this fleet has nothing to show (no trainer, no canary, no switch yet); these
    # show what the fleet did above.
    shown = {
        "Requests/s by route and status",
        "Generation latency p50/p99 by version",
        "TTFT p50/p99 per replica (SGLang)",
        "Acceptance by version (15 min window)",
        "Version per replica",
        "Spool pending bytes",
        "Delta size and compression by version",
        "Targets up by job",
    }
    assert not shown & empty, sorted(shown & empty)


def test_status_reads_the_fleet(observed):
    fleet, prom = observed
    # With every `for:` at 0 s, the first delivery's moment (events spooled, Kafka not yet answered) may
    # fire KafkaUnreachable for an evaluation or two; a healthy fleet settles to none.
    wait_until(lambda: not firing(prom), 60, interval=1, what=f"no alert firing on a healthy fleet ({prom.alerts()})")
    env = {**os.environ, **fleet.env(), "FLYWHEEL_PROMETHEUS_URL": prom.url, "PYTHONPATH": os.getcwd()}
    run = subprocess.run(
        [sys.executable, "-m", "flywheel", "status", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    status = json.loads(run.stdout)
    assert {r["id"] for r in status["replicas"]["replicas"]} == {"r0", "r1"}, status["replicas"]
    for part in ("replicas", "gateway", "kafka", "versions", "alerts"):
        assert "error" not in status[part], (part, status[part])
    assert status["kafka"]["agents"] == 2, status["kafka"]  # each agent's consumer group, with its lag
    assert status["trainer"].get("not_given"), status["trainer"]  # this fleet has none: said, not failed
    assert status["alerts"]["firing"] == [], status["alerts"]


def firing(prom) -> set[str]:
    return {a["labels"]["alertname"] for a in prom.alerts() if a["state"] == "firing"}


def test_alerts_fire_for_real(observed, tmp_path):
    from weight_sync.manifest import generate_key
    from weight_sync.publish import PublishConfig, publish

    fleet, prom = observed
    assert not {"AgentRejectedVersion", "ReplicaDown", "KafkaUnreachable"} & firing(prom), prom.alerts()

    # 1. A version signed with a key the agents do not trust: both reject it and keep serving v0.
    forged = tmp_path / "forged.pem"
    generate_key(forged, tmp_path / "forged.pub")
    cfg = fleet.publish_config()
    publish(fleet.cfg.model, PublishConfig(**{**cfg.__dict__, "private_key": forged}))
    wait_until(lambda: "AgentRejectedVersion" in firing(prom), 120, interval=1, what="AgentRejectedVersion firing")
    assert set(fleet.served_versions().values()) == {0}

    # 2. A replica killed (SIGKILL: no goodbye): its scrape fails, the gateway marks it unhealthy.
    os.kill(fleet.replicas[1].pid, signal.SIGKILL)
    wait_until(lambda: "ReplicaDown" in firing(prom), 60, interval=1, what="ReplicaDown firing")
    down = [a["labels"] for a in prom.alerts() if a["labels"]["alertname"] == "ReplicaDown" and a["state"] == "firing"]
    assert down and all(labels.get("replica") == "r1" for labels in down), down  # the dead one, only it

    # 3. The broker stopped: the gateway's next delivery fails (its events wait in the spool).
    fleet.stop_broker()
    complete(fleet, 2)  # served by the replica still up; their events cannot reach Kafka
    wait_until(lambda: "KafkaUnreachable" in firing(prom), 120, interval=1, what="KafkaUnreachable firing")


# Commands that run until stopped (a gateway, a trainer, an agent, the canary controller): a gateway passes
# once it answers on its port and is still up READY_GRACE_S later (answering is its job); the others, if still
# up after DAEMON_S (an agent's or a trainer's /metrics answers before its first poll and update: not ready).
# Those run on while the runbook goes on (as an SRE's would), one of each kind at a time (two trainers would
# share a work dir), each judged and stopped at the first command after its DAEMON_S (so that one, an agent
# in the fleet's consumer group, say, overlaps the runbook about as long as it runs), before the next of its
# kind starts, or at the end.
# Status commands report a broken part by their exit code; the rest must exit 0.
DAEMONS = ("flywheel serve", "flywheel train", "flywheel weights agent", "flywheel weights canary")
REPORTERS = ("flywheel status", "flywheel kafka status")
DAEMON_S = 20
READY_S, READY_GRACE_S = 90, 5
PROBES = {'--port "$GATEWAY_PORT"': ("GATEWAY_PORT", "/health")}  # a daemon's port flag -> where it answers


def test_every_runbook_command_runs_and_the_fixes_clear_the_alerts(observed, test_model, tmp_path):
    """After test_alerts_fire_for_real: r1 is dead and the broker stopped. The SRE starts with Kafka (every
    weights command needs it), then follows every page in turn; the last two alerts clear."""
    from weight_sync import gate
    from weight_sync.publish import activate, publish

    fleet, prom = observed
    dead = fleet.replicas[1]
    env = {
        **os.environ,
        **fleet.env(),
        **fleet.replica_env("r1"),  # the page is about r1: its keys, to restart it and its agent
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",  # `flywheel`, as installed
        "PYTHONPATH": os.getcwd(),
        # One torch thread a process, as the fleet's replicas run (its restarted replica too, `--threads`: then
        # SGLang's children are forked, serving.replica.cpu_compat; ready in about half the time).
        "OMP_NUM_THREADS": "1",
        "FLYWHEEL_PROMETHEUS_URL": prom.url,
        "REPLICA": "r1",
        "VERSION": "0",
        "STABLE_VERSION": "0",
        "MODEL_DIR": str(test_model),
        "REPLICA_URL": dead.url,
        "REPLICA_PORT": str(urlsplit(dead.url).port),
        "REPLICA_THREADS": "1",
        "KAFKA_DATA_DIR": str(fleet.out / "kafka"),
        "KAFKA_PORT": fleet.broker.bootstrap.rsplit(":", 1)[1],
        "GATEWAY_STATE_DIR": str(tmp_path / "gateway"),
        "GATEWAY_PORT": str(free_port()),
        "AGENT_METRICS_PORT": str(free_port()),
        "AGENT_WORK_DIR": str(tmp_path / "agent"),  # the restarted agent's state: not the fleet's, not the cache
        "TRAINER_WORK_DIR": str(tmp_path / "trainer"),
        "TRAINER_METRICS_PORT": str(free_port()),
    }
    alerts = sorted(alert_names(load_rules()), key=lambda a: a != "KafkaUnreachable")
    failed = []
    running: dict[str, _Daemon] = {}  # DAEMONS prefix -> the agent, trainer or canary controller running on

    def judge(alert: str, cmd: str, rc, out: str) -> None:
        if cmd.startswith(DAEMONS):
            ok = rc is None  # still serving
        elif cmd.startswith(REPORTERS):
            ok = rc in (0, 1)
        else:
            ok = rc == 0
        if not ok or "Traceback" in out:
            failed.append(f"{alert}: {cmd!r} -> {rc}: {out[-600:]}")

    try:
        for alert in alerts:
            page_env = env
            if alert == "CanaryUndecided":  # a trial whose controller is gone, for its page to end
                activate(fleet.publish_config(), 0, "test: a trial left undecided", "canary", replicas=["r1"], stable=0)
            if alert == "GateBlockedVersion":  # a version the eval gate blocked (the same weights), for its override
                held = publish(test_model, fleet.publish_config(), announce_now=False).version
                gate.decide(fleet.publish_config(), held, "block", "test: a block to override", 0, {})
                page_env = {**env, "VERSION": str(held)}
            for cmd in runbook_commands(alert):
                kind = next((d for d in DAEMONS if cmd.startswith(d)), None)
                for k in [k for k, d in running.items() if k == kind or d.due()]:
                    d = running.pop(k)
                    judge(d.alert, d.cmd, *d.finish())
                if kind and not _probe(cmd, page_env):
                    log = tmp_path / f"{alert}-{kind.rsplit(' ', 1)[1]}.log"
                    running[kind] = _Daemon.start(alert, cmd, page_env, log)
                    continue
                judge(alert, cmd, *_run(cmd, page_env, tmp_path / f"{alert}.log"))
        while running:
            d = running.pop(next(iter(running)))
            judge(d.alert, d.cmd, *d.finish())
        assert not failed, "\n".join(failed)
        # `flywheel kafka start` brought the broker back; `flywheel replica start` + `fleet activate`, r1.
        wait_until(
            lambda: not {"ReplicaDown", "KafkaUnreachable"} & firing(prom),
            180,
            interval=1,
            what=f"ReplicaDown and KafkaUnreachable cleared (firing: {firing(prom)})",
        )
    finally:
        for d in running.values():  # a failure above: stopped, not judged
            _end(d.proc)
        subprocess.run(
            [sys.executable, "-m", "flywheel", "replica", "stop", "--port", env["REPLICA_PORT"]],
            env=env,
            capture_output=True,
            timeout=120,
        )


def _answers(url: str) -> bool:
    """Anything over HTTP: a gateway whose replica is down answers 503, and it is up."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _probe(cmd: str, env: dict) -> list[tuple[str, str]]:
    """[(port, path)] where a daemon started by cmd answers; [] for one without a port."""
    return [(env[var], path) for flag, (var, path) in PROBES.items() if flag in cmd]


def _popen(cmd: str, env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as f:
        f.write(f"$ {cmd}\n".encode())
        f.flush()
        return subprocess.Popen(
            ["bash", "-c", cmd], env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _output(log: Path, cmd: str) -> str:
    text = log.read_text()
    return text[text.rfind(f"$ {cmd}") :]


@dataclass
class _Daemon:
    """A daemon without a port, left running while the runbook goes on; finish() judges and stops it."""

    alert: str
    cmd: str
    proc: subprocess.Popen
    log: Path
    started: float

    @classmethod
    def start(cls, alert: str, cmd: str, env: dict, log: Path) -> "_Daemon":
        return cls(alert, cmd, _popen(cmd, env, log), log, time.monotonic())

    def due(self) -> bool:
        return time.monotonic() >= self.started + DAEMON_S

    def finish(self) -> tuple[int | None, str]:
        """(None if still running when judged, DAEMON_S after its start or later, else its exit code; its
        output). Waits for the DAEMON_S; then stops it."""
        try:
            rc = self.proc.wait(timeout=max(0.0, self.started + DAEMON_S - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = None
        _end(self.proc)
        return rc, _output(self.log, self.cmd)


def _run(cmd: str, env: dict, log: Path) -> tuple[int | str | None, str]:
    """Run cmd to its end, or a gateway until it has answered (and READY_GRACE_S more). (Exit code; None for
    a gateway still running when stopped, "not answering" for one that never answered on its port; output.)"""
    proc = _popen(cmd, env, log)
    rc: int | str | None = None
    try:
        if cmd.startswith(DAEMONS):
            (port, path), *_ = _probe(cmd, env)
            url = f"http://127.0.0.1:{port}{path}"
            try:
                wait_until(lambda: proc.poll() is not None or _answers(url), READY_S, interval=0.5)
            except TimeoutError:
                rc = "not answering"
            else:
                rc = proc.wait(timeout=READY_GRACE_S)  # exited, or up READY_GRACE_S after answering
        else:
            rc = proc.wait(timeout=240)
    except subprocess.TimeoutExpired:
        rc = None
    _end(proc)
    return rc, _output(log, cmd)
