"""Kafka administration every package shares, whichever broker it talks to (the development one that
flywheel.kafka.broker launches, or a cluster): creating the topics, reading a topic through to its end (audits,
checks), and quieting kafka-python's logger around calls whose failures are expected."""

from __future__ import annotations

import contextlib
import logging
import time

from infra import kafka_auth

# kafka-python 3 doubles its reconnect backoff up to 30 s (kafka-python 2 and the Java client stop at 1 s): a
# client that lost its broker then saw it back up to half a minute after it served again (measured: a broker
# restarted in 3-5 s was found after 9-11 s, a restarted cluster node after 30 s). Our clients that retry
# through an outage (trainer, agents, canary, publisher) pass this instead; the gateway's shipper keeps its
# own 2 s (serving.event_log.shipper).
RECONNECT_BACKOFF_MAX_MS = 1000


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


def ensure_topics(bootstrap: str, partitions: int = 4, topics: tuple[str, ...] | None = None) -> None:
    """Create the event, weights and tenants topics if they are missing (weights, tenants: one partition, one order), so
    the first producer does not race the broker's auto-creation. Replicated as the brokers' own
    default.replication.factor says (-1: 1 on a development broker, 3 on flywheel.kafka.cluster, whose
    min.insync.replicas=2 then makes acks=all survive one broker's death). `topics`: only those (a principal sees
    only the topics its ACLs name). On a secured broker the operator makes them (infra.kafka_auth): a role
    that finds one missing gets a PermissionError that says so, and settings it may not alter are left as they are."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import AuthorizationError, TopicAlreadyExistsError

    from contracts import events as ev

    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap,
        **kafka_auth.client_config(),
        client_id="flywheel-topics",
        reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
    )
    try:
        existing = set(admin.list_topics())
        rf = -1  # the broker's default (KIP-464)
        # The weights topic is never aged out: a new agent replays every decision (a pin from last year
        # included), and its records are a few hundred bytes per version. A tenant's newest policy record is
        # its policy: compacted, never aged out (a trainer started next year must learn of last year's forget).
        keep = {
            ev.TOPIC_WEIGHTS: {"retention.ms": "-1", "retention.bytes": "-1"},
            ev.TOPIC_TENANTS: {"cleanup.policy": "compact", "retention.ms": "-1"},
        }
        want = [
            NewTopic(ev.TOPIC_COMPLETIONS, partitions, rf),
            NewTopic(ev.TOPIC_FEEDBACK, partitions, rf),
            NewTopic(ev.TOPIC_WEIGHTS, 1, rf, topic_configs=keep[ev.TOPIC_WEIGHTS]),
            NewTopic(ev.TOPIC_DEADLETTER, 1, rf),
            # Records consumers refused (infra.dead_letter): for forensics, so kept as long as the events.
            NewTopic(ev.TOPIC_BAD_RECORDS, 1, rf),
            NewTopic(ev.TOPIC_TENANTS, 1, rf, topic_configs=keep[ev.TOPIC_TENANTS]),
        ]
        want = [t for t in want if topics is None or t.name in topics]
        missing = [t for t in want if t.name not in existing]
        if missing:
            try:
                admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass
            except AuthorizationError:
                user = kafka_auth.client_config().get("sasl_plain_username")
                names = ", ".join(t.name for t in missing)
                raise PermissionError(
                    f"topics {names} are missing on {bootstrap} and Kafka user {user!r} may not create them: "
                    "the operator creates them (infra.kafka_admin.ensure_topics, as admin)"
                ) from None
        present = [t for t in keep if t in existing and t in {w.name for w in want}]  # made before these rules
        if present:
            from kafka.admin import ConfigResource, ConfigResourceType

            try:
                admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, t, configs=keep[t]) for t in present])
            except (AuthorizationError, ValueError):
                # Not this principal's to set (the operator made the topics with them). kafka-python checks the
                # names against the topic's configs as the principal may describe them: none, a ValueError.
                pass
    finally:
        admin.close()


def records_to_end(bootstrap: str, topic: str, timeout_s: float = 120.0) -> list:
    """Every record of `topic` (kafka-python ConsumerRecords, partition by partition in offset order) from its
    start to the end offsets it has when called, without waiting for a silence that says nothing more comes.
    Call it once what should be there is acknowledged (a spool drained, a producer's send returned): with
    acks=all an acknowledged record is below the end offsets read here. Raises ValueError for a topic that is
    not there, TimeoutError if its end is not reached within timeout_s."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        **kafka_auth.client_config(),
        enable_auto_commit=False,
        group_id=None,
        reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
    )
    try:
        parts = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or [])]
        if not parts:  # reading a topic that is not there is a mistake, not an empty read
            raise ValueError(f"{topic}: no such topic on {bootstrap}")
        c.assign(parts)
        c.seek_to_beginning(*parts)
        ends = c.end_offsets(parts)
        got: dict = {tp: [] for tp in parts}
        deadline = time.monotonic() + timeout_s
        while any(
            c.position(tp, timeout_ms=max(1, int(1000 * (deadline - time.monotonic())))) < ends[tp] for tp in parts
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: not read to its end offsets {ends} in {timeout_s:.0f}s")
            for tp, records in c.poll(timeout_ms=500).items():
                got[tp] += [r for r in records if r.offset < ends[tp]]
    finally:
        c.close()
    return [r for tp in parts for r in got[tp]]
