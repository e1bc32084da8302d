"""The demo's eval-gate wiring without servers: the follower's command line is one `flywheel gate` takes (niced, one
torch thread, following), and the per-version rows and the summary read the gate's verdicts and costs from the signed
records weight_sync.gate writes in the store (a blocked version has a row of its own; one still waiting is said)."""

from __future__ import annotations

import pytest

from flywheel.demo import gate as demo_gate, report as demo_report
from flywheel.demo.population import Interaction
from flywheel.demo.run import DemoConfig
from tests.weight_sync_setup import tiny_checkpoint
from weight_sync import gate as wgate
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, publish
from weight_sync.store.server import Store


def test_the_follower_command_is_flywheel_gate_niced_on_one_thread(tmp_path):
    from flywheel.cli import build_parser
    from infra.config import build
    from online_rl.gate.cli import GateArgs

    cmd = demo_gate.follower_command(tmp_path / "store", tmp_path / "k.pem", "127.0.0.1:9092", "http://gw", 1)
    assert cmd[:3] == ["nice", "-n", str(demo_gate.NICENESS)] and demo_gate.NICENESS > 0
    assert cmd[4:7] == ["-m", "flywheel", "gate"]
    args = build_parser().parse_args(cmd[6:])  # what the child's CLI makes of it
    what, pub = build(GateArgs, args), build(PublishConfig, args, full_every=10, s3_url=None)
    assert (what.follow, what.threads, args.version, what.poll_s, what.gateway) == (True, 1, None, 2.0, "http://gw")
    assert (pub.store, pub.private_key, pub.kafka_bootstrap) == (tmp_path / "store", tmp_path / "k.pem", cmd[-3])
    with pytest.raises(ValueError, match="at least one torch thread"):
        demo_gate.follower_command(tmp_path, tmp_path, "b", "g", 0)
    with pytest.raises(ValueError, match="--gate-threads"):  # refused before anything starts
        DemoConfig(gate_threads=0)
    assert "--gateway" not in demo_gate.follower_command(tmp_path, tmp_path, "b", None, 1)  # the newest announced


def test_rows_and_summary_come_from_the_signed_gate_records(tmp_path):
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    pcfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "k.pem")
    base = tiny_checkpoint(tmp_path / "c0", 0)
    assert publish(base, pcfg).version == 0
    for v in (1, 2, 3):  # as `flywheel train --gate` leaves them: in the store, unannounced
        assert publish(tiny_checkpoint(tmp_path / f"c{v}", v, base=base), pcfg, announce_now=False).version == v
    wgate.decide(pcfg, 1, "pass", "no regression", 0, {"seconds": {"total": 41.26}, "cpu_seconds": 30.5})
    wgate.decide(pcfg, 2, "block", "pass@1 fell", 1, {"seconds": {"total": 52.0}, "cpu_seconds": 35.25})

    gates = demo_gate.verdicts(pcfg.store)
    assert gates[1] == {
        "verdict": "pass",
        "against": 0,
        "seconds": 41.26,
        "cpu_seconds": 30.5,
        "reason": "no regression",
        "overridden": False,
    }
    assert (gates[2]["verdict"], gates[2]["against"], gates[2]["seconds"]) == ("block", 1, 52.0) and 3 not in gates

    served = [Interaction("u", "t", float(i), 0.1, v, "accept") for i, v in enumerate((0, 0, 1, 1))]
    rows = demo_report.summarize(served, [], {}, (), gates)
    assert [(r["version"], r["gate"], r["gate_s"], r["gate_cpu_s"]) for r in rows] == [
        (0, None, None, None),  # v0 is never gated
        (1, "pass", 41.26, 30.5),
        (2, "block", 52.0, 35.25),  # blocked: a row with no requests
    ]
    assert rows[2]["requests"] == 0 and rows[2]["acceptance"] is None and rows[2]["failed"] == 0
    printed = demo_report.table(rows).splitlines()
    assert "gate s" in printed[0] and printed[-1].split()[-3:] == ["block", "52.0", "35.2"]
    assert "gate" not in demo_report.table(demo_report.summarize(served, [], {})).splitlines()[0]  # gate off

    from online_rl.gate.cli import waiting

    s = demo_gate.summary(gates, waiting(Store(pcfg.store)), 75.0)
    assert (s["passed"], s["blocked"], s["waiting_at_end"]) == ([1], [2], [3])
    assert (s["seconds_median"], s["seconds_max"], s["cpu_seconds_total"]) == (46.6, 52.0, 65.8)
    assert s["kept_up"] is True  # each judgement done within the interval (v3 published after the last one)
    assert demo_gate.summary(gates, [3], 50.0)["kept_up"] is False  # v2 took longer than the interval
    assert "blocked v2" in demo_gate.line(s) and "waiting at the end v3" in demo_gate.line(s)
    assert "FELL BEHIND" in demo_gate.line(demo_gate.summary(gates, [3], 50.0))

    wgate.override(pcfg, 2, "eval flake", by="sre", force=True)  # a later override keeps the gate's judgement
    assert demo_gate.verdicts(pcfg.store)[2] | {"overridden": False} == gates[2]
    assert demo_gate.verdicts(pcfg.store)[2]["overridden"] is True
