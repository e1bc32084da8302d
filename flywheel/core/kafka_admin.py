"""Kafka administration every package shares, whichever broker it talks to (the development one that
flywheel.kafka_broker launches, or a cluster): creating the topics, and quieting kafka-python's logger
around calls whose failures are expected."""

from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def quiet_kafka():
    """Silence kafka-python's logging for a block whose failures are expected and handled by the caller
    (probing a broker that is still starting, a short-lived consumer that is closed mid-refresh)."""
    log = logging.getLogger("kafka")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def ensure_topics(bootstrap: str, partitions: int = 4) -> None:
    """Create the event and weights topics if they are missing (weights: one partition, one order), so
    the first producer does not race the broker's auto-creation. Replicated as the brokers' own
    default.replication.factor says (-1: 1 on a development broker, 3 on flywheel.kafka_cluster, whose
    min.insync.replicas=2 then makes acks=all survive one broker's death)."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    from flywheel.core import events as ev

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="flywheel-topics")
    try:
        existing = set(admin.list_topics())
        rf = -1  # the broker's default (KIP-464)
        # The weights topic is never aged out: a new agent replays every decision (a pin from last year
        # included), and its records are a few hundred bytes per version.
        want = [
            NewTopic(ev.TOPIC_COMPLETIONS, partitions, rf),
            NewTopic(ev.TOPIC_FEEDBACK, partitions, rf),
            NewTopic(ev.TOPIC_WEIGHTS, 1, rf, topic_configs={"retention.ms": "-1", "retention.bytes": "-1"}),
            NewTopic(ev.TOPIC_DEADLETTER, 1, rf),
            # A tenant's newest policy record is its policy: compacted, never aged out, one order.
            NewTopic(ev.TOPIC_TENANTS, 1, rf, topic_configs={"cleanup.policy": "compact", "retention.ms": "-1"}),
        ]
        missing = [t for t in want if t.name not in existing]
        if missing:
            try:
                admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass
        if ev.TOPIC_WEIGHTS in existing:  # made before this rule (or auto-created): set it now
            from kafka.admin import ConfigResource, ConfigResourceType

            admin.alter_configs(
                [
                    ConfigResource(
                        ConfigResourceType.TOPIC,
                        ev.TOPIC_WEIGHTS,
                        configs={"retention.ms": "-1", "retention.bytes": "-1"},
                    )
                ]
            )
    finally:
        admin.close()
