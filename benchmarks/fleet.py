"""The fleet over test hosts (loadtests.fleet_drill at full length): three hosts, three Kafka nodes, two
gateways behind HAProxy, a gateway and a Kafka node killed under load. Prints one JSON object as the last
line with hosts, broker_kill_events_lost, broker_kill_duplicates_after_dedupe,
gateway_kill_failed_outside_inflight, lb_added_p50_ms, fleet_requests and fleet_failed (targets: >= 3
hosts, every loss and failure count 0). Needs root (network namespaces) and haproxy."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from loadtests.fleet_drill import DrillConfig, run, table


def main() -> dict:
    from online_rl.model.bootstrap import bootstrap

    model = bootstrap("test")
    out = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    try:
        r = run(
            DrillConfig(
                model=model,
                out_dir=out,
                users=6,
                warmup_s=30.0,
                gateway_down_s=30.0,
                broker_down_s=60.0,
                after_s=30.0,
                lb_probes=500,
                direct_completions=20,
            )
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(table(r))
    return r


if __name__ == "__main__":
    print(json.dumps(main()))
