"""A short chaos run in the suite (the full one is `python -m benchmarks.chaos`): a fleet, the trainer and
simulated users, with kill -9 of the gateway, the shipper, an agent, the trainer and the broker, and a
full event-spool disk, on a seeded schedule. Nothing lost, nothing trained twice, nothing stuck, nothing
left running, no user request failed outside a gateway kill."""
from __future__ import annotations

import pytest

from flywheel.chaos import ChaosConfig, run

pytestmark = pytest.mark.timeout(900)


def test_a_short_chaos_run_loses_nothing(tmp_path):
    r = run(ChaosConfig(duration_s=60.0, seed=3, out_dir=tmp_path / "chaos", users=3, gap_s=(3.0, 6.0),
                        publish_interval_s=20.0, settle_s=150.0, full_s=8.0,
                        kinds=("gateway", "shipper", "agent", "trainer", "broker", "disk_spool")))
    assert r["faults_injected"] >= 5 and r["fault_kinds"] >= 5, r["faults"]
    assert r["faults_not_recovered"] == 0, r["faults"]
    assert r["requests"] > 50 and r["samples_trained"] > 0
    for k in ("events_lost", "samples_double_trained", "stuck_replicas", "orphans",
              "user_failed_outside_gateway_kill"):
        assert r[k] == 0, (k, r)
    # Not asserted yet: "fleet on the newest version within the settle" failed in some runs here (open in #14;
    # the run's record, chaos.json in the out dir, says when).
    print("fleet on the newest version after", r["fleet_on_newest_s"], "s")
