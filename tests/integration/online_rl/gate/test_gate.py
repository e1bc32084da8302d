"""The eval gate on real versions of the test model, with the session's Kafka broker and the sandbox: a deliberately
worse version (every weight scrambled) is blocked and stays in the store unannounced, the same weights published
again pass and are announced; an SRE's `flywheel weights gate-override` announces the blocked one with a signed
record of who and why; every decision is on the weights topic, signed, in order, with its figures; an unknown
version, a version judged twice and an override of a version the gate passed are clear errors. The follower
(`flywheel gate --follow`) judges what a trainer publishing with --gate leaves, and announces what passes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from infra import kafka_auth
from loadtests import versions
from online_rl.gate.run import GateConfig, run_gate
from online_rl.gate.suite import SuiteConfig
from weight_sync.manifest import generate_key, load_private
from weight_sync.publish import PublishConfig, publish
from weight_sync.store.server import Store

pytestmark = pytest.mark.timeout(600)


def _ours(bootstrap: str, public) -> list[dict]:
    """The weights topic's records signed by our key, in topic order (other tests share the session broker)."""
    from kafka import KafkaConsumer, TopicPartition

    from contracts import control
    from contracts.events import TOPIC_WEIGHTS

    c = KafkaConsumer(
        bootstrap_servers=bootstrap, **kafka_auth.client_config(), enable_auto_commit=False, consumer_timeout_ms=3000
    )
    tps = [TopicPartition(TOPIC_WEIGHTS, p) for p in sorted(c.partitions_for_topic(TOPIC_WEIGHTS) or [])]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    out = []
    for r in c:
        try:
            out.append(control.decode(r.value, public))
        except control.ControlError:
            continue
    c.close()
    return out


def test_worse_blocked_equal_passes_override_announces(test_model, kafka_bootstrap, kafka_security, tmp_path, capsys):
    from flywheel.cli import main

    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    pcfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "k.pem", kafka_bootstrap=kafka_bootstrap)
    assert publish(test_model, pcfg).version == 0  # what the fleet serves
    worse = publish(versions.broken(test_model, tmp_path / "broken", seed=9), pcfg, announce_now=False).version
    same = publish(test_model, pcfg, announce_now=False).version

    # `flywheel gate` with no version: every version waiting for a verdict, oldest first, against the announced v0
    key = ["--store", str(pcfg.store), "--key", str(pcfg.private_key), "--kafka", kafka_bootstrap]
    suite = ["--tasks", "8", "--sessions", "2", "--samples", "4", "--work", str(tmp_path)]
    capsys.readouterr()
    assert main(["gate", *suite, *key]) == 3  # a version was blocked
    printed = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [(p["version"], p["baseline"], p["verdict"]) for p in printed] == [(worse, 0, "block"), (same, 0, "pass")]

    store = Store(pcfg.store)
    blocked, passed = store.gate_verdicts()[worse], store.gate_verdicts()[same]
    figures = blocked["figures"]
    assert figures["pass_at_1"]["regressed"] and figures["pass_at_1"]["n"] == [32, 32], blocked["reason"]
    assert figures["valid_tool_call_rate"]["regressed"]
    assert figures["seconds"]["total"] > 0 and figures["cpu_seconds"] > 0
    same_figures = passed["figures"]
    assert same_figures["seconds"]["baseline"] == 0  # v0's outcomes from the first gate: the same as a fresh run
    assert all(same_figures[m]["diff"] == 0 for m in ("pass_at_1", "valid_tool_call_rate", "answer_tokens"))

    assert store.gate_blocked() == {worse} and worse in store.versions()
    capsys.readouterr()
    why = ["--reason", "eval flake: release it", "--by", "sre-bob"]
    # v{same} went out after it: released for everyone, v{worse} would take the fleet back; only with --force.
    assert main(["weights", "gate-override", str(worse), *why, *key]) == 1
    assert f"v{worse} is older than v{same}" in capsys.readouterr().err and store.gate_blocked() == {worse}
    assert main(["weights", "gate-override", str(worse), *why, "--force", *key]) == 0
    override = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert override["verdict"] == "override" and override["by"] == "sre-bob" and store.gate_blocked() == set()

    records = [
        (r["type"], r["version"], r.get("verdict"))
        for r in _ours(kafka_bootstrap, load_private(pcfg.private_key).public_key())
    ]
    assert records == [
        ("version", 0, None),
        ("gate", worse, "block"),
        ("gate", same, "pass"),
        ("version", same, None),
        ("gate", worse, "override"),
        ("version", worse, None),
    ]

    cfg = GateConfig(publish=pcfg, suite=SuiteConfig(tasks=8, sessions=2, samples=4), work=tmp_path)
    with pytest.raises(ValueError, match="not in the store"):
        run_gate(cfg, 42, baseline=0)
    with pytest.raises(ValueError, match="already has a gate verdict"):
        run_gate(cfg, same, baseline=0)
    capsys.readouterr()
    assert main(["weights", "gate-override", str(same), "--reason", "why", *key]) == 1
    assert f"v{same} is not blocked by the gate (gate verdict 'pass')" in capsys.readouterr().err


def test_the_follower_judges_what_waits_and_announces_what_passes(
    test_model, kafka_bootstrap, kafka_security, tmp_path
):
    """`flywheel gate --follow` beside a trainer publishing with --gate: the version left unannounced is judged
    against the announced one and, passing, announced as a canary candidate (--canary)."""
    import threading

    from infra.procs import wait_until
    from online_rl.gate.cli import GateArgs, follow

    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    pcfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "k.pem", kafka_bootstrap=kafka_bootstrap)
    publish(test_model, pcfg)
    stop = threading.Event()
    cfg = GateConfig(
        publish=dataclasses.replace(pcfg, canary=True), suite=SuiteConfig(tasks=4, sessions=1, samples=2), work=tmp_path
    )
    follower = threading.Thread(target=follow, args=(cfg, GateArgs(poll_s=0.5), stop), daemon=True)
    follower.start()
    try:
        v = publish(test_model, pcfg, announce_now=False).version  # what `flywheel train --gate` does
        store = Store(pcfg.store)
        wait_until(lambda: store.announced() == v, 120, interval=0.5, what=f"v{v} judged and announced")
    finally:
        stop.set()
        follower.join(timeout=60)
    assert not follower.is_alive()
    assert store.gate_verdicts()[v]["verdict"] == "pass" and store.gate_verdicts()[v]["stable"] == 0
    ours = _ours(kafka_bootstrap, load_private(pcfg.private_key).public_key())
    assert [(r["type"], r["version"], r.get("verdict"), r.get("canary")) for r in ours] == [
        ("version", 0, None, None),
        ("gate", v, "pass", True),
        ("version", v, None, True),
    ]
