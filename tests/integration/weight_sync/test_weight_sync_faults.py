"""The weight agent living through failures and records it must not trust: a killed agent restarts on its last
good version, a failed load never leaves the replica paused or draining, a transient apply failure is retried with
its offset not committed, only signed fresh records are acted on, and a rollback reaches every agent after the
counter file is lost. (Publish, verify, rebuild, hot-switch and bad versions:
tests/integration/weight_sync/test_weight_sync.py.)
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from infra import kafka_auth
from infra.procs import wait_until
from serving import gateway_process
from tests import weight_sync_setup
from tests.helpers import GATEWAY_ADMIN, STORE_TOKEN, get, post
from tests.weight_sync_setup import _agent, _greedy, _version, announce
from weight_sync.agent.loop import Agent, AgentConfig
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, activate

pytestmark = pytest.mark.timeout(900)
weights = weight_sync_setup.weights  # the store with v0 and three deltas (a fixture: one per module)


def test_killed_agent_restarts_on_its_last_good_version(weights, second_replica, tmp_path):
    work = tmp_path / "agent"
    agent = _agent(weights, second_replica, "restart", work, switch_mode="no_pause")
    assert asyncio.run(agent.apply(3))
    # The replica restarts on its launch checkpoint (v0 weights); the agent, restarted, puts v3 back.
    asyncio.run(_agent(weights, second_replica, "other", tmp_path / "other", switch_mode="no_pause").apply(0))
    assert _version(second_replica.url) == "0"
    again = _agent(weights, second_replica, "restart", work, switch_mode="no_pause")
    assert again.state["version"] == 3
    asyncio.run(again.ensure_replica_on_current())
    assert _version(second_replica.url) == "3"


def test_a_failed_load_never_leaves_the_replica_paused_or_draining(weights, second_replica, test_model, tmp_path):
    from weight_sync.agent.switch import GatewayLink, SwitchError, switch

    version = _version(second_replica.url)
    with pytest.raises(SwitchError):
        asyncio.run(switch(second_replica.url, str(tmp_path / "missing"), 9, "retract"))
    assert _greedy(second_replica.url) and _version(second_replica.url) == version  # not left paused
    from tests.helpers import GATEWAY_KEYS

    gw = gateway_process.start(
        [second_replica.url, second_replica.url + "/"],
        test_model,
        tmp_path / "gw",
        keys=GATEWAY_KEYS,
        admin_token=GATEWAY_ADMIN,
        extra_args=["--no-events"],
    )

    def state(rid):
        reps = json.loads(get(f"{gw.url}/admin/replicas", key=GATEWAY_ADMIN)[1])["replicas"]
        return next(r for r in reps if r["id"] == rid)["state"]

    try:
        with pytest.raises(SwitchError):
            asyncio.run(
                switch(
                    second_replica.url, str(tmp_path / "missing"), 9, "drain", GatewayLink(gw.url, GATEWAY_ADMIN, "r0")
                )
            )
        assert state("r0") == "active"
        # An agent that drained its replica and died: its lease runs out and the gateway takes it back.
        assert post(f"{gw.url}/admin/replicas/r0/drain", {"lease_s": 1}, key=GATEWAY_ADMIN)[0] == 200
        assert state("r0") == "draining"
        wait_until(lambda: state("r0") == "active", 15, what="the lapsed drain")
        # An SRE's drain (no lease) holds.
        assert post(f"{gw.url}/admin/replicas/r1/drain", {}, key=GATEWAY_ADMIN)[0] == 200
        time.sleep(3)
        assert state("r1") == "draining"
        assert post(f"{gw.url}/admin/replicas/r0/drain", {"lease_s": "x"}, key=GATEWAY_ADMIN)[0] == 400
    finally:
        assert gw.stop()


def test_a_transient_apply_failure_is_retried_and_its_offset_not_committed(weights, second_replica, tmp_path):
    """The store goes away while a version is announced: the agent keeps the record uncommitted and retries
    with backoff until the store is back, then switches; the broker is away by then, so its commit fails
    (once this ended the agent) and is retried until the broker is back."""
    from kafka import KafkaConsumer, TopicPartition

    from contracts.events import TOPIC_WEIGHTS
    from flywheel.kafka import broker as kafka_broker
    from tests.helpers import TcpProxy

    broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path / "kafka"))
    proxy = TcpProxy(int(weights["url"].rsplit(":", 1)[1]))  # not started: the store is unreachable
    agent = Agent(
        AgentConfig(
            name="retry",
            replica_url=second_replica.url,
            store_url=proxy.url,
            public_key=weights["root"] / "signing.pub",
            work_dir=tmp_path / "agent",
            initial_model=weights["ckpts"][0],
            kafka_bootstrap=broker.bootstrap,
            switch_mode="no_pause",
            store_token=STORE_TOKEN,
            retry_base_s=0.3,
            retry_max_s=1.0,
        )
    )
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)

    def committed():
        c = KafkaConsumer(
            bootstrap_servers=broker.bootstrap, **kafka_auth.client_config(), group_id="flywheel-agent-retry"
        )
        try:
            return c.committed(TopicPartition(TOPIC_WEIGHTS, 0))
        finally:
            c.close()

    try:
        from infra.kafka_admin import ensure_topics

        ensure_topics(broker.bootstrap)
        thread.start()
        announce(weights, broker.bootstrap, 2)
        wait_until(lambda: agent.metrics.retries._value.get() >= 3, 60, what="retries while the store is down")
        assert _version(second_replica.url) == "0" and committed() is None
        assert broker.stop()
        proxy.start()
        wait_until(lambda: _version(second_replica.url) == "2", 60, what="the switch once the store is back")
        wait_until(lambda: agent.metrics.commit_failures._value.get() >= 1, 180, what="a commit failing")
        assert thread.is_alive()
        broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path / "kafka"))
        wait_until(lambda: committed() == 1, 120, what="the offset committed once the broker is back")
        assert thread.is_alive()
        assert agent.metrics.rejected.labels("switch_failed")._value.get() >= 3
    finally:
        stop.set()
        thread.join(timeout=30)
        proxy.shutdown()
        assert broker.stop()
        asyncio.run(_agent(weights, second_replica, "reset", tmp_path / "reset", switch_mode="no_pause").apply(0))


def test_the_agent_acts_only_on_signed_fresh_records(weights, second_replica, tmp_path):
    """Any local process can write to the broker: a replayed old record, an unsigned or forged one, or
    plain garbage on the weights topic is counted and skipped, and the agent keeps following real ones."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from contracts import control
    from contracts.events import TOPIC_WEIGHTS
    from flywheel.kafka import broker as kafka_broker
    from infra.kafka_admin import ensure_topics
    from weight_sync.manifest import load_private

    broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path / "kafka"))
    ensure_topics(broker.bootstrap)
    cfg = PublishConfig(
        store=weights["root"] / "store", private_key=weights["root"] / "signing.pem", kafka_bootstrap=broker.bootstrap
    )
    agent = Agent(
        AgentConfig(
            name="guarded",
            replica_url=second_replica.url,
            store_url=weights["url"],
            public_key=weights["root"] / "signing.pub",
            work_dir=tmp_path / "agent",
            initial_model=weights["ckpts"][0],
            kafka_bootstrap=broker.bootstrap,
            switch_mode="no_pause",
            store_token=STORE_TOKEN,
        )
    )
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, **kafka_auth.client_config())
    try:
        thread.start()
        activate(cfg, 1, "serve v1")
        wait_until(lambda: _version(second_replica.url) == "1", 60, what="v1")
        activate(cfg, 3, "serve v3")
        wait_until(lambda: _version(second_replica.url) == "3", 60, what="v3")
        c = KafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            **kafka_auth.client_config(),
            enable_auto_commit=False,
            consumer_timeout_ms=3000,
        )
        c.assign([TopicPartition(TOPIC_WEIGHTS, 0)])
        c.seek_to_beginning()
        first = next(iter(c)).value  # the signed "serve v1", to replay
        c.close()
        forged = control.make("activate", 2, seq=10_000, reason="forged")
        generate_key(tmp_path / "evil.pem", tmp_path / "evil.pub")
        for raw in (
            first,
            b"null",
            b"[1]",
            b"not json",
            json.dumps(forged).encode(),
            control.encode(forged, load_private(tmp_path / "evil.pem")),
        ):
            producer.send(TOPIC_WEIGHTS, key=b"weights", value=raw)
        producer.flush()
        bad = agent.metrics.bad_records
        wait_until(
            lambda: (
                sum(bad.labels(r)._value.get() for r in ("replayed", "malformed", "unsigned", "bad_signature")) == 6
            ),
            30,
            what="6 refusals",
        )
        assert bad.labels("replayed")._value.get() == 1 and bad.labels("malformed")._value.get() == 3
        assert bad.labels("unsigned")._value.get() == 1 and bad.labels("bad_signature")._value.get() == 1
        assert thread.is_alive() and _version(second_replica.url) == "3"
        activate(cfg, 0, "back to v0")  # and the real ones still go through
        wait_until(lambda: _version(second_replica.url) == "0", 60, what="v0")
    finally:
        producer.close()
        stop.set()
        thread.join(timeout=30)
        assert broker.stop()


def test_a_rollback_after_the_counter_file_is_lost_reaches_every_agent(weights, second_replica, tmp_path, capsys):
    """The store's sequence counter is lost (a restore, a move to a new host) after a version announcement the
    agents have passed: the SRE's rollback still gets a number above it, and the agent applies it instead of
    dropping it as a replay."""
    from flywheel.cli import main as flywheel
    from flywheel.kafka import broker as kafka_broker
    from infra.kafka_admin import ensure_topics
    from tests.helpers import STORE_TOKEN

    broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path / "kafka"))
    ensure_topics(broker.bootstrap)
    store = weights["root"] / "store"
    cfg = PublishConfig(store=store, private_key=weights["root"] / "signing.pem", kafka_bootstrap=broker.bootstrap)
    agent = _agent(
        weights,
        second_replica,
        "follower",
        tmp_path / "agent",
        kafka_bootstrap=broker.bootstrap,
        switch_mode="no_pause",
        store_token=STORE_TOKEN,
    )
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    try:
        thread.start()
        activate(cfg, 1, "serve v1")  # a decision: in the store's activation ledger
        wait_until(lambda: _version(second_replica.url) == "1", 60, what="v1")
        announce(weights, broker.bootstrap, 2)  # a new version: numbered, sent, followed by the fleet
        wait_until(lambda: _version(second_replica.url) == "2", 60, what="v2")
        (store / "control_seq").unlink()
        rollback = ["weights", "rollback", "--to", "1", "--reason", "v2 misbehaves", "--store", str(store)]
        key = ["--key", str(weights["root"] / "signing.pem"), "--kafka", broker.bootstrap]
        assert flywheel(rollback + key) == 0
        sent = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        wait_until(lambda: _version(second_replica.url) == "1", 60, what=f"the rollback (seq {sent['seq']}) applied")
        # Every file of the store's that names a number gone (a store rebuilt on a new host): the topic says.
        for name in ("control_seq", "activations.jsonl", "announcements.jsonl"):
            (store / name).rename(tmp_path / name)
        try:
            again = activate(cfg, 2, "forward again")
        finally:  # the module's ledgers back (the new counter keeps the numbering above them)
            for name in ("activations.jsonl", "announcements.jsonl"):
                (tmp_path / name).rename(store / name)
        assert again["seq"] > sent["seq"]
        wait_until(lambda: _version(second_replica.url) == "2", 60, what=f"the activation (seq {again['seq']})")
        assert agent.metrics.bad_records.labels("replayed")._value.get() == 0
    finally:
        stop.set()
        thread.join(timeout=30)
        assert broker.stop()
