"""The fleet over three test hosts (a short loadtests.fleet_drill; the full one is `python -m
benchmarks.fleet`): three Kafka nodes, two gateways behind a real HAProxy, a replica and its agent per
host. Kill -9 of a gateway under load fails only what was in flight on it, and the other takes feedback
for what it issued; kill -9 of a Kafka node under load fails and loses nothing while every agent switches
to a version published meanwhile; the cluster heals; both spools drain and every event is in Kafka once."""

from __future__ import annotations

import pytest

from flywheel.hosts.netns import _netns
from loadtests.fleet_drill import DrillConfig, run, table

pytestmark = pytest.mark.timeout(900)


def test_a_fleet_over_three_hosts_rides_through_a_gateway_and_a_broker_kill(test_model, tmp_path):
    before = _netns()
    r = run(
        DrillConfig(
            model=test_model,
            out_dir=tmp_path,
            users=3,
            warmup_s=8.0,
            gateway_down_s=8.0,
            broker_down_s=0.0,  # until the cluster has taken the node out (its session timeout, ~9 s)
            after_s=8.0,
            lb_probes=50,
            direct_completions=4,
        )
    )
    print(table(r))
    assert r["hosts"] == 3
    assert r["fleet_requests"] > 40, r
    assert r["dead_gateway_feedback_taken"] == r["dead_gateway_feedback_sent"] == 4, r
    for k in (
        "fleet_failed",
        "gateway_kill_failed_outside_inflight",
        "gateway_kill_errors_on_survivor",
        "events_lost",
        "broker_kill_events_lost",
        "broker_kill_duplicates_after_dedupe",
    ):
        assert r[k] == 0, (k, r["failures"], r)
    assert r["broker_kill_requests"] > 0, r  # users kept being served while the node was down
    assert r["fleet_served_versions"] == [1], r
    assert r["v1_switch_modes"] == ["drain"] * 3, r  # each replica drained on both gateways while it loaded
    assert r["isr_shrank_while_down"], r  # the kill was seen by the cluster, and it healed (run() waits)
    # The trainer read the cluster throughout: samples from before, during and after the node's death.
    assert r["trainer_alive"] and r["samples_double_trained"] == 0, r
    assert r["samples_trained_in_broker_kill"] > 0 and r["samples_trained_after_broker_kill"] > 0, r
    assert r["lb_added_p50_ms"] < 50, r  # a loose sanity bound: the figure is benchmarks.fleet's
    assert _netns() == before  # hosts, and everything that ran on them, gone
