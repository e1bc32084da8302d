"""The real Kafka 4 broker: idempotent zstd producer, consumer group reading every message exactly once."""

import uuid

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

from infra import kafka_auth

pytestmark = pytest.mark.timeout(180)


def _topic(bootstrap: str, partitions: int = 3) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **kafka_auth.client_config())
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()
    return name


def _consume_all(bootstrap, topic, group, expect, timeout_s=30):
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        **kafka_auth.client_config(),
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    got = []
    try:
        import time

        deadline = time.monotonic() + timeout_s
        while len(got) < expect and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(records)
        if got:
            consumer.commit()
        # Anything beyond `expect` would be a duplicate: give it a moment to show up.
        for records in consumer.poll(timeout_ms=1000).values():
            got.extend(records)
        consumer.commit()
    finally:
        consumer.close()
    return got


def test_broker_is_kafka_4_kraft(kafka_bootstrap):
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, **kafka_auth.client_config())
    try:
        cluster = admin.describe_cluster()
        assert len(cluster["brokers"]) == 1
        assert cluster["controller_id"] in (-1, 1)
    finally:
        admin.close()
    probe = KafkaConsumer(bootstrap_servers=kafka_bootstrap, **kafka_auth.client_config())
    try:
        assert probe.config["api_version"] >= (4, 0) or probe._client.check_version() >= (4, 0)
    finally:
        probe.close()


def test_idempotent_zstd_producer_and_group_reads_every_message_once(kafka_bootstrap):
    topic = _topic(kafka_bootstrap)
    producer = KafkaProducer(
        bootstrap_servers=kafka_bootstrap,
        **kafka_auth.client_config(),
        acks="all",
        enable_idempotence=True,
        compression_type="zstd",
        linger_ms=5,
    )
    n = 500
    try:
        futures = [producer.send(topic, key=f"cmpl-{i % 37}".encode(), value=f"event-{i}".encode()) for i in range(n)]
        producer.flush()
        metas = [f.get(timeout=30) for f in futures]
    finally:
        producer.close()
    assert producer.config["enable_idempotence"] and producer.config["acks"] == -1
    # The same key always lands in the same partition (completions and feedback co-partition by id).
    by_key = {}
    for i, m in enumerate(metas):
        assert by_key.setdefault(i % 37, m.partition) == m.partition

    group = f"g-{uuid.uuid4().hex[:6]}"
    got = _consume_all(kafka_bootstrap, topic, group, n)
    values = sorted(int(r.value.decode().split("-")[1]) for r in got)
    assert values == list(range(n)), "every message exactly once"
    # Committed offsets: the group resumes after the last message and sees nothing again.
    again = _consume_all(kafka_bootstrap, topic, group, 0, timeout_s=2)
    assert again == []


def test_the_audit_reads_a_topic_to_its_end_counting_events_once(kafka_bootstrap):
    """flywheel.chaos.audit.read_topic (the chaos run's and the fleet drill's audit): every acknowledged
    record up to the end offsets, a producer's retry (same event_id) dropped, undecodable records skipped."""
    from contracts import events as ev
    from flywheel.chaos.audit import read_topic

    topic = _topic(kafka_bootstrap)
    events = [ev.FeedbackEvent(completion_id=f"c{i % 7}", choice_index=0, tenant="t", kind="accept") for i in range(50)]
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, **kafka_auth.client_config(), acks="all")
    try:
        for e in [*events, events[3], events[9]]:  # two retries
            producer.send(topic, key=e.completion_id.encode(), value=e.encode())
        producer.send(topic, key=b"c0", value=b"not an event")
        producer.flush()
    finally:
        producer.close()
    audit = read_topic(kafka_bootstrap, topic)
    assert audit.repeated == 2 and sum(audit.per_completion.values()) == 50
    assert audit.per_completion == {f"c{i}": len(range(i, 50, 7)) for i in range(7)}
    assert read_topic(kafka_bootstrap, _topic(kafka_bootstrap)).per_completion == {}  # an empty topic: at once
    with pytest.raises(ValueError, match="no such topic"):
        read_topic(kafka_bootstrap, "t-never-made")
