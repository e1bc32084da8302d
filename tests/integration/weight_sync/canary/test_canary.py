"""Canary trials on two real SGLang replicas with the simulated population: a better version is promoted,
a worse one rolled back automatically (zero failed requests, the fleet ends on the stable version), a
neutral one promoted within the margin, a version trained on a hackable reward rolled back by the gateway's
early-stop monitor (acceptance held out of the decision); replayed, forged and garbage records on the weights
topic are counted and skipped; every decision is on the weights topic and in `weights list`;
completions record their arm; the trainer stops learning from a rolled-back version."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from benchmarks import _hacked_version
from flywheel.demo.population import HouseStyle, Population, PopulationConfig
from flywheel.local_fleet import LocalFleet, LocalFleetConfig
from infra import kafka_auth
from infra.procs import wait_until
from loadtests import versions
from tests.helpers import events_until
from weight_sync.canary.controller import CanaryConfig, CanaryController
from weight_sync.canary.judge import MonitorGuard
from weight_sync.publish import publish

pytestmark = pytest.mark.timeout(900)


def _arms_in_kafka(bootstrap: str) -> dict[str, int]:
    """Completions logged per arm, read until both arms are there (the shippers send a moment later)."""
    from contracts import events as ev
    from infra.kafka_admin import quiet_kafka

    def arms(events) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in events:
            counts[e.arm] = counts.get(e.arm, 0) + 1
        return counts

    with quiet_kafka():
        return arms(events_until(bootstrap, ev.TOPIC_COMPLETIONS, lambda es: {"canary", "stable"} <= set(arms(es))))


def _bad_weights_records(bootstrap: str, tmp_path) -> int:
    """Send what any local process could write to the weights topic: a replay of its first (signed) record,
    garbage, and a canary candidate v999 unsigned and signed by another key. Returns how many."""
    import json

    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from contracts import control
    from contracts.events import TOPIC_WEIGHTS
    from weight_sync.manifest import generate_key, load_private

    c = KafkaConsumer(
        bootstrap_servers=bootstrap, **kafka_auth.client_config(), enable_auto_commit=False, consumer_timeout_ms=5000
    )
    c.assign([TopicPartition(TOPIC_WEIGHTS, 0)])
    c.seek_to_beginning()
    first = next(iter(c)).value
    c.close()
    forged = control.make("version", 999, seq=10**6, canary=True, reason="forged")
    generate_key(tmp_path / "evil.pem", tmp_path / "evil.pub")
    bad = [first, b"not json", json.dumps(forged).encode(), control.encode(forged, load_private(tmp_path / "evil.pem"))]
    producer = KafkaProducer(bootstrap_servers=bootstrap, **kafka_auth.client_config(), acks="all")
    for raw in bad:
        producer.send(TOPIC_WEIGHTS, key=b"weights", value=raw)
    producer.flush()
    producer.close()
    return len(bad)


def test_better_promoted_worse_rolled_back_neutral_promoted(test_model, tmp_path, capsys):
    from flywheel.cli import main

    fleet = LocalFleet(LocalFleetConfig(model=test_model, out_dir=tmp_path / "fleet", replicas=2, tenants=12))
    with fleet:
        pcfg = fleet.publish_config()
        # Users start on a degraded copy, so that the base model is a real improvement to trial.
        stable = publish(versions.noisy(test_model, tmp_path / "degraded", seed=1, scale=0.3), pcfg).version
        fleet.wait_fleet_on(stable)
        ctrl = CanaryController(
            CanaryConfig(
                gateway_url=fleet.gateway.url,
                admin_token=fleet.cfg.admin_token,
                publish=pcfg,
                min_feedback=60,
                min_requests=40,
                margin=0.1,
                p99_ratio=3.0,
                max_trial_s=240,
                poll_s=1.0,
            )
        ).start()
        sent_bad = _bad_weights_records(fleet.broker.bootstrap, tmp_path)  # counted and skipped, never acted on
        pop = Population(
            PopulationConfig(users=12, max_tokens=24, think_s=(0.0, 0.2)),
            fleet.gateway.url,
            list(fleet.keys.values()),
            preference=HouseStyle(),
        ).start()
        canary_cfg = dataclasses.replace(pcfg, canary=True)
        trials = []
        try:
            for ckpt in (
                test_model,
                versions.broken(test_model, tmp_path / "bad", seed=9),
                versions.nudged(test_model, tmp_path / "same", seed=2),
            ):
                v = publish(ckpt, canary_cfg).version
                wait_until(
                    lambda v=v: any(d["version"] == v for d in ctrl.decisions),
                    300,
                    interval=1.0,
                    what=f"a decision on v{v}",
                )
                decision = next(d for d in ctrl.decisions if d["version"] == v)
                final = v if decision["type"] == "promote" else decision["stable"]
                fleet.wait_fleet_on(final)
                trials.append((v, decision["type"], final))
            # An SRE ends a trial that would otherwise still be collecting feedback.
            ctrl.cfg.min_feedback = 10**9
            v_held = publish(versions.nudged(test_model, tmp_path / "held", seed=3), canary_cfg).version
            wait_until(
                lambda: any(a["type"] == "canary" and a["version"] == v_held for a in fleet.store_activations()),
                120,
                what=f"the trial of v{v_held}",
            )
            assert (
                main(
                    [
                        "weights",
                        "abort",
                        str(v_held),
                        "--store",
                        str(fleet.store_root),
                        "--key",
                        str(fleet.signing_key),
                        "--kafka",
                        fleet.broker.bootstrap,
                    ]
                )
                == 0
            )
            wait_until(lambda: any(d["version"] == v_held for d in ctrl.decisions), 60, what="the override")
            fleet.wait_fleet_on(trials[-1][2])
            # A version trained on a hackable reward (short answers accepted) through the whole fleet: acceptance
            # cannot decide (min_feedback as above), the gateway's early-stop monitor must.
            ctrl.cfg.guards = {**ctrl.cfg.guards, "early_stop": MonitorGuard(min_count=40)}
            v_hacked = publish(_hacked_version.save_hacked(test_model, tmp_path / "hacked"), canary_cfg).version
            wait_until(lambda: any(d["version"] == v_hacked for d in ctrl.decisions), 300, what="the hacked trial")
            fleet.wait_fleet_on(trials[-1][2])
        finally:
            pop.stop()
            ctrl.stop()
        arms = _arms_in_kafka(fleet.broker.bootstrap)
        records = pop.snapshot()
        assert main(["weights", "list", "--store", str(fleet.store_root)]) == 0
        listing = capsys.readouterr().out

    (v_better, d1, f1), (v_bad, d2, f2), (v_same, d3, f3) = trials
    assert (d1, d2, d3) == ("promote", "rollback", "promote"), ctrl.decisions
    assert ctrl.bad_records == sent_bad and not [d for d in ctrl.decisions if d["version"] == 999]
    assert f2 == v_better and f3 == v_same  # the rollback put everyone back on the stable version
    assert not [r for r in records if r.outcome == "failed"], "zero failed requests through all trials"
    bad_seen = [r for r in records if r.version == v_bad]
    assert bad_seen and np.mean([r.outcome == "accept" for r in bad_seen if r.outcome != "ignore"]) < 0.2
    assert arms.get("canary", 0) > 0 and arms.get("stable", 0) > 0  # completions record their arm
    # The broken version is rolled back on whichever guard trips first: its users' acceptance, or its p99
    # (random weights write to max_tokens, so its answers are also the slowest).
    for v, kind, why in (
        (v_better, "promote", ("acceptance",)),
        (v_bad, "rollback", ("acceptance", "p99")),
        (v_same, "promote", ("acceptance",)),
    ):
        lines = [line for line in listing.splitlines() if f" {kind:8} v{v}" in line]
        assert any(w in line for line in lines for w in why), listing
    assert listing.count(" canary ") >= 4
    held = next(d for d in ctrl.decisions if d["version"] == v_held)
    assert held["type"] == "rollback" and held["reason"] == "aborted by SRE override"
    hacked = next(d for d in ctrl.decisions if d["version"] == v_hacked)
    assert hacked["type"] == "rollback" and "reward hacking: early_stop" in hacked["reason"], hacked


def test_trainer_stops_learning_from_a_rolled_back_version(test_model, tmp_path):
    import json

    from contracts import control
    from online_rl.config import PublisherConfig, TrainerConfig
    from online_rl.data.samples import Sample
    from online_rl.trainer.loop import Trainer
    from weight_sync.manifest import generate_key, load_private

    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    generate_key(tmp_path / "other.pem", tmp_path / "other.pub")
    key, other = load_private(tmp_path / "k.pem"), load_private(tmp_path / "other.pem")
    rollback = control.make("rollback", 3, seq=7, stable=2, reason="worse")

    def sample(v):
        return Sample(
            key=f"k{v}",
            prompt_ids=np.array([1, 2], np.int32),
            output_ids=np.array([3], np.int32),
            behaviour_logprobs=np.zeros(1, np.float32),
            routed_experts=np.zeros((2, 2, 2), np.uint8),
            reward=1.0,
            model_version=v,
        )

    for keep in (False, True):
        t = Trainer(
            TrainerConfig(
                model_dir=test_model,
                work_dir=tmp_path / f"t{keep}",
                train_on_rolled_back=keep,
                publish=PublisherConfig(key=tmp_path / "k.pem"),
            )
        )
        t.version = 3
        # Unsigned, signed by another key, or not a record at all: counted, never acted on.
        for raw in (
            json.dumps(rollback).encode(),
            control.encode(rollback, other),
            b"null",
            b"[1]",
            b'{"record": 1, "sig": "x"}',
        ):
            t._weights_record(raw)
        assert t.rolled_back == set() and t.failures.count("control_record") == 5
        signed = control.encode(rollback, key)
        t._weights_record(signed)
        t._weights_record(signed)  # a replay: refused
        assert t.failures.count("control_record") == 6
        t.buffer = [sample(2), sample(3)]
        batch = t._take_batch()
        assert [s.model_version for s in batch] == ([2, 3] if keep else [2])
        if not keep:
            assert t.trained_since_ckpt[-1]["dropped"] == "rolled_back"
            t.save()
            again = Trainer(
                TrainerConfig(
                    model_dir=test_model, work_dir=tmp_path / "tFalse", publish=PublisherConfig(key=tmp_path / "k.pem")
                )
            )
            assert again.rolled_back == {3}
            again._weights_record(signed)  # the sequence survives the checkpoint: still a replay
            assert again.failures.count("control_record") == 1
