"""The fleet over test hosts under simulated IDE traffic, through HAProxy, with the faults a multi-host
fleet must ride through (`python -m benchmarks.fleet`; a short run in the suite):

  1. what HAProxy adds: p50 of a request to a gateway directly and through the balancer, interleaved;
  2. kill -9 of gateway g0 under load: only requests in flight then may fail; feedback for completions g0
     issued, sent after its death, is taken by g1 (the shared id secret); g0 restarts on its spool;
  3. kill -9 of a Kafka node under load, a new version published while it is down: no request fails or
     waits on Kafka (each gateway's spool absorbs it), every agent switches its replica through the leader
     change; the node restarts and the cluster heals (every partition back to 3 in-sync replicas);
  4. the trainer (on host 0, reading the cluster throughout) trains on events from before, during and
     after the node's death, none twice;
  5. at the end: both spools drained, every answered completion and feedback event read back from the
     cluster (after dedupe by event_id: none lost, none twice).
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from flywheel.demo.population import HouseStyle, Population, PopulationConfig
from flywheel.hosts.fleet import HostFleet, HostFleetConfig
from infra.procs import pid_alive, stop_pid, wait_until


@dataclass
class DrillConfig:
    model: Path
    out_dir: Path
    hosts: int = 3
    users: int = 4
    think_s: tuple[float, float] = (0.05, 0.3)
    warmup_s: float = 15.0  # load before the first fault
    gateway_down_s: float = 15.0  # g0 dead (under load) before it restarts
    # The Kafka node dead (under load; v1 is published meanwhile) this long, and at least until the cluster
    # has taken it out of every in-sync set (the controller fences it after its session times out, ~9 s).
    broker_down_s: float = 30.0
    after_s: float = 15.0  # load after the last fault
    lb_probes: int = 200  # requests each way for lb_added_p50_ms
    direct_completions: int = 8  # issued on g0 just before it dies; their feedback goes through the balancer
    killed_node: int = 2  # index of the Kafka node to kill (host 2: a gateway's host too)
    switch_timeout_s: float = 180.0
    heal_timeout_s: float = 180.0
    seed: int = 0


def _call(url: str, key: str | None = None, body: dict | None = None, timeout: float = 60.0) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def lb_added_ms(fleet: HostFleet, n: int) -> dict:
    """p50 of GET /health straight to g0 and through the balancer, one after the other, n of each (new
    connections both ways, as an IDE's first request makes)."""
    direct: list[float] = []
    through: list[float] = []
    for _ in range(n):
        for url, out in ((fleet.gateways[0].url, direct), (fleet.gateway.url, through)):
            t = time.perf_counter()
            _call(f"{url}/health", timeout=10)
            out.append(1000 * (time.perf_counter() - t))
    d, t = statistics.median(direct), statistics.median(through)
    return {"direct_p50_ms": round(d, 2), "through_lb_p50_ms": round(t, 2), "lb_added_p50_ms": round(t - d, 2)}


def _spools_drained(fleet: HostFleet) -> bool:
    return all(_call(f"{u}/health", timeout=5)[1].get("spool_pending_bytes") == 0 for u in fleet.gateway_urls())


def _in_sync(fleet: HostFleet, topics: list[str]) -> bool:
    n = len(fleet.broker.nodes)
    return all(len(isr) == n for t in topics for isr in fleet.broker.in_sync(t).values())


def run(cfg: DrillConfig, say=print) -> dict:
    out = Path(cfg.out_dir)
    fleet_cfg = HostFleetConfig(model=cfg.model, out_dir=out / "fleet", hosts=cfg.hosts, tenants=cfg.users)
    r: dict = {"hosts": cfg.hosts}
    with HostFleet(fleet_cfg, say=say) as fleet:
        # Publishing is this drill's own (v1 while a node is down); the trainer only reads and trains.
        trainer = fleet.spawn_trainer(
            out / "trainer", "--publish-interval", "86400", "--threads", "1", "--min-batch", "4", "--lr", "1e-4"
        )
        try:
            r.update(lb_added_ms(fleet, cfg.lb_probes))
            say(f"drill: haproxy adds {r['lb_added_p50_ms']} ms at p50 (direct {r['direct_p50_ms']} ms)")
            pop = Population(
                PopulationConfig(users=cfg.users, think_s=cfg.think_s, seed=cfg.seed),
                fleet.gateway.url,
                list(fleet.keys.values()),
                preference=HouseStyle(),
            ).start()
            try:
                time.sleep(cfg.warmup_s)
                gw_kill = _kill_a_gateway(fleet, cfg, r, say)
                time.sleep(cfg.warmup_s / 2)
                broker_kill = _kill_a_broker(fleet, cfg, r, out, say)
                time.sleep(cfg.after_s)
            finally:
                pop.stop()
            r["trainer_alive"] = pid_alive(trainer.pid)
        finally:
            stop_pid(trainer.pid)
        wait_until(lambda: _spools_drained(fleet), 120, interval=0.5, what="both gateways' spools drained")
        r["fleet_served_versions"] = sorted(set(fleet.served_versions().values()))
        r.update(_audit(fleet, pop.snapshot(), gw_kill, broker_kill, out / "trainer"))
    return r


@dataclass
class _GatewayKill:
    read: float  # time.time() when the balancer's count was read, just before the kill
    at: float  # when the gateway was gone
    back: float  # when the balancer had the restarted gateway in rotation again
    in_flight: int  # requests the balancer had on the gateway just before the kill
    direct: list[str]  # completions the gateway issued just before, their feedback sent after its death


def _kill_a_gateway(fleet: HostFleet, cfg: DrillConfig, r: dict, say) -> _GatewayKill:
    key = next(iter(fleet.keys.values()))
    direct = []
    for i in range(cfg.direct_completions):
        status, body = _call(
            f"{fleet.gateways[0].url}/v1/completions",
            key,
            {"model": "flywheel-coder", "prompt": f"def f{i}(x):\n", "max_tokens": 8},
        )
        if status != 200:
            raise RuntimeError(f"a completion straight to g0 failed ({status}): {body}")
        direct.append(body["id"])
    t_read = time.time()
    seen = fleet.gateway.servers()
    in_flight, survivor_errors = seen["gw0"]["sessions"], seen["gw1"]["errors"]
    fleet.kill_gateway(0)
    t_kill = time.time()
    say(f"drill: gateway g0 killed (kill -9) with {in_flight} requests in flight on it")
    fleet.balancer_sees(0, "DOWN")
    fb = [_call(f"{fleet.gateway.url}/v1/feedback", key, {"completion_id": c, "kind": "accept"}) for c in direct]
    r["dead_gateway_feedback_taken"] = sum(s == 200 for s, _ in fb)
    r["dead_gateway_feedback_sent"] = len(fb)
    time.sleep(cfg.gateway_down_s)
    fleet.restart_gateway(0)
    fleet.balancer_sees(0, "UP")
    t_back = time.time()
    # What excuses failures as g0's must not hide one on g1: the balancer counts g1's failed answers.
    r["gateway_kill_errors_on_survivor"] = fleet.gateway.servers()["gw1"]["errors"] - survivor_errors
    say(f"drill: gateway g0 back after {t_back - t_kill:.1f} s")
    return _GatewayKill(t_read, t_kill, t_back, in_flight, direct)


def _kill_a_broker(fleet: HostFleet, cfg: DrillConfig, r: dict, out: Path, say) -> tuple[float, float]:
    """Kill -9 a Kafka node, publish v1 while it is down, restart it, wait for the cluster to heal.
    Returns the window (kill, healed) in time.time()."""
    from contracts import events as ev
    from loadtests.versions import nudged
    from weight_sync.publish import publish

    t_kill = time.time()
    fleet.broker.kill(cfg.killed_node)
    say(f"drill: Kafka node {cfg.killed_node + 1} killed (kill -9)")
    v1 = publish(nudged(cfg.model, out / "v1-model", seed=cfg.seed + 1), fleet.publish_config()).version
    r["switch_with_node_down_s"] = round(fleet.wait_fleet_on(v1, cfg.switch_timeout_s), 1)
    say(f"drill: every replica on v{v1} after {r['switch_with_node_down_s']} s (one Kafka node down)")
    # A replica serves v1 a moment before its agent has written the switch's report (it persists first).
    wait_until(
        lambda: len([x for x in fleet.switch_reports() if x["version"] == v1]) >= len(fleet.agent_pids),
        30,
        interval=0.2,
        what=f"every agent's report of its switch to v{v1}",
    )
    r["v1_switch_modes"] = sorted(x["mode"] for x in fleet.switch_reports() if x["version"] == v1)
    # The cluster noticed: the dead node left the in-sync set of every partition of the event topics.
    dead = fleet.broker.nodes[cfg.killed_node].node_id
    topics = [ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK]

    def shrank() -> bool:
        return all(dead not in isr for t in topics for isr in fleet.broker.in_sync(t).values())

    try:
        wait_until(shrank, cfg.heal_timeout_s, interval=1.0, what=f"Kafka node {dead} out of every in-sync set")
        r["isr_shrank_while_down"] = True
        r["broker_isr_shrank_seen_after_s"] = round(time.time() - t_kill, 1)  # first looked at after the switch
    except TimeoutError as e:  # reported, not raised: the drill goes on to heal the cluster and audit
        r["isr_shrank_while_down"] = False
        r["isr_shrink_error"] = str(e)
        say(f"drill: {e}")
    time.sleep(max(0.0, cfg.broker_down_s - (time.time() - t_kill)))
    t = time.monotonic()
    fleet.broker.restart(cfg.killed_node)
    wait_until(
        lambda: _in_sync(fleet, [*topics, "weights"]),
        cfg.heal_timeout_s,
        interval=1.0,
        what="every partition back to 3 in-sync replicas",
    )
    r["broker_heal_s"] = round(time.monotonic() - t, 1)
    say(f"drill: Kafka node back, cluster healed {r['broker_heal_s']} s after its restart began")
    return t_kill, time.time()


def _audit(fleet: HostFleet, records: list, gw: _GatewayKill, broker: tuple[float, float], trainer_dir: Path) -> dict:
    from contracts import events as ev
    from flywheel.chaos.audit import read_topic, trained_keys

    def during(x, a: float, b: float) -> bool:
        return x.started <= b and x.started + x.latency_s >= a

    served = [x for x in records if x.outcome != "failed" and x.completion_id]
    judged = [x for x in served if x.outcome in ("accept", "reject")]
    feedback_audit = read_topic(fleet.broker.bootstrap, ev.TOPIC_FEEDBACK)
    completions_audit = read_topic(fleet.broker.bootstrap, ev.TOPIC_COMPLETIONS)
    completions, feedback = completions_audit.per_completion, feedback_audit.per_completion
    lost = [x for x in served if x.completion_id not in completions]
    lost += [x for x in judged if x.completion_id not in feedback]
    lost_direct = [c for c in gw.direct if c not in completions] + [c for c in gw.direct if c not in feedback]

    # Failures the kill may excuse, by their own request (an interaction is a completion, then its feedback):
    # those in flight when the balancer's count was read, at most as many as it had on the killed gateway,
    # and those begun between that reading and the gateway's end. A request refused by a dead gateway is
    # sent to the other one; one failed on the live gateway is never excused (gateway_kill_errors_on_survivor).
    failed = [x for x in records if x.outcome == "failed"]
    began = {id(x): x.failed_request_started or x.started for x in failed}
    spanning = sum(began[id(x)] <= gw.read <= x.started + x.latency_s for x in failed)
    excused = min(spanning, gw.in_flight) + sum(gw.read < began[id(x)] <= gw.at for x in failed)
    in_broker_kill = [x for x in records if x.outcome != "failed" and during(x, *broker)]
    latencies = sorted(x.latency_s for x in records if x.outcome != "failed")
    trained = trained_keys(trainer_dir)
    started_at = {x.completion_id: x.started for x in served}
    trained_at = [started_at.get(k.rsplit(":", 1)[0], 0.0) for k in trained]
    return {
        "fleet_requests": len(records) + len(gw.direct),
        "fleet_failed": len(failed) - excused,
        "gateway_kill_in_flight": gw.in_flight,
        "gateway_kill_failed_inflight": excused,
        "gateway_kill_failed_outside_inflight": sum(during(x, gw.read, gw.back) for x in failed) - excused,
        "broker_kill_requests": len(in_broker_kill),
        "broker_kill_max_latency_s": round(max((x.latency_s for x in in_broker_kill), default=0.0), 2),
        "p99_latency_s": round(latencies[int(0.99 * (len(latencies) - 1))], 2) if latencies else None,
        "broker_kill_events_lost": sum(during(x, *broker) for x in lost),
        "events_lost": len(lost) + len(lost_direct),
        # Over the whole run (the broker kill is where producers re-send): completions or feedback that
        # reached Kafka as two different events.
        "broker_kill_duplicates_after_dedupe": len(completions_audit.twice()) + len(feedback_audit.twice()),
        "duplicates_dropped_by_event_id": completions_audit.repeated + feedback_audit.repeated,
        "completion_events": len(served) + len(gw.direct),
        "feedback_events": len(judged) + len(gw.direct),
        "samples_trained": len(trained),
        "samples_double_trained": len(trained) - len(set(trained)),
        # Trained from requests answered while the node was down, and after the cluster healed.
        "samples_trained_in_broker_kill": sum(broker[0] <= t <= broker[1] for t in trained_at),
        "samples_trained_after_broker_kill": sum(t > broker[1] for t in trained_at),
        # Each failure with when it began and ended, in seconds from g0's death.
        "failures": [
            f"{x.error} ({began[id(x)] - gw.at:+.2f} s to {x.started + x.latency_s - gw.at:+.2f} s)" for x in failed
        ][:10],
    }


def table(r: dict) -> str:
    keys = [k for k in r if k != "failures"]
    width = max(len(k) for k in keys)
    return "\n".join(f"{k:<{width}}  {r[k]}" for k in keys)
