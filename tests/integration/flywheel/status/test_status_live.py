"""`flywheel status` against a real Kafka broker: consumer groups shaped like the trainer's (assigned
partitions of completions, feedback and weights, committed with its checkpoint) and the weight agents'
(subscribed to weights) with known committed offsets; the lag it reports is the log end offset (read here
on its own, through a consumer) minus each committed offset, a partition never committed counting whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from contracts import events as ev
from flywheel.status.gather import StatusConfig, failed, gather
from infra import kafka_auth
from infra.paths import REPO_ROOT

pytestmark = pytest.mark.timeout(180)
TOPICS = (ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK, ev.TOPIC_WEIGHTS)


def _commit(bootstrap: str, group: str, offsets: dict) -> None:
    from kafka import KafkaConsumer
    from kafka.structs import OffsetAndMetadata

    c = KafkaConsumer(
        bootstrap_servers=bootstrap, **kafka_auth.client_config(), group_id=group, enable_auto_commit=False
    )
    try:
        c.assign(list(offsets))
        c.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
    finally:
        c.close()


@pytest.fixture
def own_broker(tmp_path):
    """A broker of this test's own: it writes records that are not events onto the real topics, which the
    session's shared broker must never carry (other tests decode every record there)."""
    from flywheel.kafka import broker as kafka_broker

    broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path / "kafka"))
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def test_consumer_lag_of_trainer_and_agents(own_broker, kafka_security):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from infra.kafka_admin import ensure_topics

    kafka_bootstrap = own_broker
    ensure_topics(kafka_bootstrap)
    tag = uuid.uuid4().hex[:8]
    trainer, prefix = f"flywheel-trainer-{tag}", f"flywheel-agent-{tag}-"
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, **kafka_auth.client_config(), acks="all")
    for i in range(10):
        producer.send(ev.TOPIC_WEIGHTS, key=b"weights", value=b"w%d" % i)
    for i in range(40):
        producer.send(ev.TOPIC_COMPLETIONS, key=b"c%d" % i, value=b"c")
    for i in range(9):
        producer.send(ev.TOPIC_FEEDBACK, key=b"c%d" % i, value=b"f")
    producer.flush()
    producer.close()

    probe = KafkaConsumer(bootstrap_servers=kafka_bootstrap, **kafka_auth.client_config())
    try:
        parts = {t: [TopicPartition(t, p) for p in sorted(probe.partitions_for_topic(t))] for t in TOPICS}
        every = [tp for tps in parts.values() for tp in tps]
        ends, starts = probe.end_offsets(every), probe.beginning_offsets(every)
    finally:
        probe.close()
    weights = TopicPartition(ev.TOPIC_WEIGHTS, 0)

    # the trainer: completions committed 3 short of each end, weights 2 short, feedback never committed
    _commit(
        kafka_bootstrap,
        trainer,
        {**{tp: max(0, ends[tp] - 3) for tp in parts[ev.TOPIC_COMPLETIONS]}, weights: ends[weights] - 2},
    )
    want_trainer = {
        ev.TOPIC_COMPLETIONS: sum(ends[tp] - max(0, ends[tp] - 3) for tp in parts[ev.TOPIC_COMPLETIONS]),
        ev.TOPIC_FEEDBACK: sum(ends[tp] - starts[tp] for tp in parts[ev.TOPIC_FEEDBACK]),
        ev.TOPIC_WEIGHTS: 2,
        ev.TOPIC_TENANTS: 0,  # the trainer reads the tenants' policies too (online_rl.data.reader): none here
    }
    _commit(kafka_bootstrap, prefix + "r0", {weights: ends[weights]})  # caught up
    _commit(kafka_bootstrap, prefix + "r1", {weights: ends[weights] - 7})  # 7 records behind

    data = gather(StatusConfig(kafka=kafka_bootstrap, trainer_group=trainer, agent_group_prefix=prefix, timeout_s=10))
    assert failed(data) == [], data
    groups = {g["group"]: g for g in data["kafka"]["groups"]}
    t = groups[trainer]
    assert t["role"] == "trainer" and t["by_topic"] == want_trainer, t
    assert t["lag"] == sum(want_trainer.values())
    assert t["uncommitted_partitions"] == len(parts[ev.TOPIC_FEEDBACK]) + 1  # and the tenants topic's one
    assert groups[prefix + "r0"]["role"] == "agent" and groups[prefix + "r0"]["lag"] == 0
    assert groups[prefix + "r1"]["lag"] == 7 and groups[prefix + "r1"]["by_topic"] == {ev.TOPIC_WEIGHTS: 7}
    assert data["kafka"]["trainer_group"] == trainer and data["kafka"]["agents"] >= 2
    assert [g["role"] for g in data["kafka"]["groups"]][:3] == ["trainer", "agent", "agent"]  # trainer first

    # the command itself, as an SRE runs it, logged in as the `status` role (describe only): the screen and --json
    login = kafka_security.client_env("status") if kafka_security else {}
    keep = ("FLYWHEEL_HOME", *(() if kafka_security else kafka_auth.env(None)))  # an external broker's login
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_") or k in keep},
        **login,
        "PYTHONPATH": str(REPO_ROOT),
        "COLUMNS": "140",
    }
    args = [sys.executable, "-m", "flywheel", "status", "--kafka", kafka_bootstrap, "--trainer-group", trainer]
    args += ["--agent-group-prefix", prefix]
    out = subprocess.run(args, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Kafka consumer lag" in out.stdout and trainer in out.stdout and "Traceback" not in out.stdout + out.stderr
    row = next(line for line in out.stdout.splitlines() if prefix + "r1" in line)
    assert " 7 " in row and "weights 7" in row, out.stdout
    out = subprocess.run(args + ["--json"], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    lag = {g["group"]: g["lag"] for g in json.loads(out.stdout)["kafka"]["groups"]}
    assert lag[trainer] == t["lag"] and lag[prefix + "r1"] == 7 and out.returncode == 0
