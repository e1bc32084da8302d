"""The trainer's view of Kafka: completions, feedback, the weights topic and the tenants' policies, read from
the offsets its checkpoint holds (not the group's), and committed to the group only after a checkpoint has them.

Every partition is assigned, not subscribed: one trainer reads everything, and a rebalance can never move
a partition away between a read and the checkpoint that accounts for it.

Tenants' policies come first (online_rl.data.tenants): after connecting, the other topics wait until the tenants
topic is read to the end it had then (a trainer that starts, or restarts, knows every forget and deny
written so far before it reads one event), and in each fetch the tenants' records are given out first.

Records are untrusted input (anyone who can write to the broker wrote them): `events` decodes completions,
feedback and tenants' policies strictly (contracts.events.decode) and gives out only what decodes; a record
that does not is refused (`refuse`: counted in flywheel_trainer_bad_records_total{topic,reason}, copied to the
dead-letter topic, infra.dead_letter) and its offset passed like any other's, so neither it nor a restart
that reads it again (a compacted tenants topic keeps it forever) stops the trainer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry

from contracts import events as ev
from infra import kafka_auth
from infra.dead_letter import DeadLetters

log = logging.getLogger(__name__)
TOPICS = (ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK, ev.TOPIC_WEIGHTS, ev.TOPIC_TENANTS)


class StreamReader:
    def __init__(
        self, bootstrap: str | None, group_id: str, poll_ms: int = 500, registry: CollectorRegistry | None = None
    ):
        self.bootstrap, self.group_id, self.poll_ms = bootstrap, group_id, poll_ms
        registry = registry if registry is not None else CollectorRegistry()
        self.dead_letters = DeadLetters(registry, "flywheel_trainer", "trainer", bootstrap, TOPICS)
        self.current = None  # the record events() gave out last (where a record the caller refuses came from)
        self.offsets: dict[str, int] = {}  # "topic:partition" -> next offset to read (the checkpoint's)
        self._consumer: Any = None  # a KafkaConsumer once connected (kafka-python has no types)
        self._policies_end: dict = {}  # tenants partition -> its end at connect, while the others wait for it

    def _connect(self):
        from kafka import KafkaConsumer, TopicPartition

        from infra.kafka_admin import RECONNECT_BACKOFF_MAX_MS, ensure_topics

        assert self.bootstrap, "fetch() connects only with a broker"
        ensure_topics(self.bootstrap, topics=TOPICS)  # weights too: a rollback announced later must reach us
        c = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            **kafka_auth.client_config(),
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id="flywheel-trainer",
            max_poll_records=2000,
            reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
        )
        try:
            parts = []
            for topic in TOPICS:
                ids = c.partitions_for_topic(topic)
                deadline = time.monotonic() + 10
                while not ids and time.monotonic() < deadline:  # auto-created on first use
                    c.topics()
                    time.sleep(0.2)
                    ids = c.partitions_for_topic(topic)
                parts += [TopicPartition(topic, p) for p in sorted(ids or [])]
            c.assign(parts)
            committed = {tp: c.committed(tp) for tp in parts}
            for tp in parts:
                key = f"{tp.topic}:{tp.partition}"
                if key in self.offsets:  # the checkpoint decides, not the group's committed offset
                    c.seek(tp, self.offsets[key])
                elif committed[tp] is not None:
                    c.seek(tp, committed[tp])
                else:
                    c.seek_to_beginning(tp)
            policies = [tp for tp in parts if tp.topic == ev.TOPIC_TENANTS]
            self._policies_end = {tp: end for tp, end in c.end_offsets(policies).items() if c.position(tp) < end}
            if self._policies_end:
                c.pause(*[tp for tp in parts if tp.topic != ev.TOPIC_TENANTS])
        except BaseException:
            c.close()  # a half-made consumer holds sockets: the next try makes a new one
            raise
        return c

    def fetch(self) -> dict:
        """The records that came within poll_ms, by partition. Raises when the broker cannot be reached."""
        if not self.bootstrap:
            return {}
        if self._consumer is None:
            self._consumer = self._connect()
        c = self._consumer
        if self._policies_end and all(c.position(tp) >= end for tp, end in self._policies_end.items()):
            self._policies_end = {}
            c.resume(*c.paused())  # every policy known: the events may come
        return c.poll(timeout_ms=self.poll_ms)

    def read(self, batch: dict) -> Iterator[tuple[str, bytes]]:
        """(topic, value) of each fetched record, in order per partition; a record's offset counts as read
        once the caller has taken it (asked for the next)."""
        for tp, records in sorted(batch.items(), key=lambda kv: kv[0].topic != ev.TOPIC_TENANTS):
            for r in records:
                self.current = r
                yield tp.topic, r.value
                self.offsets[f"{tp.topic}:{tp.partition}"] = r.offset + 1

    def events(self, batch: dict) -> Iterator[tuple[str, Any]]:  # Any: bytes or an event, by topic
        """As read(), with completions and feedback (contracts.events.CompletionEvent, FeedbackEvent) and
        tenants' policies (TenantRecord) decoded; weights records stay bytes (the trainer verifies them with its key).
        A record that does not decode as its topic's kind is refused, never given out."""
        for topic, value in self.read(batch):
            if topic == ev.TOPIC_WEIGHTS:
                yield topic, value
                continue
            try:
                event = ev.decode(value, topic)
            except ev.BadRecord as e:
                self.refuse(topic, value, e)
                continue
            yield topic, event

    def refuse(self, topic: str, value, error: Exception) -> None:
        """The record events() gave out last (`value`, from `topic`) is unusable: counted, dead-lettered, skipped."""
        self.dead_letters.refuse(topic, value, error, self.current)

    def commit(self) -> None:
        """The offsets a checkpoint now holds, to the consumer group (for monitoring and tools: the
        checkpoint stays authoritative, so a failed commit only delays what they see)."""
        if self._consumer is None or not self.offsets:
            return
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        offsets = {}
        for key, offset in self.offsets.items():
            topic, partition = key.rsplit(":", 1)
            offsets[TopicPartition(topic, int(partition))] = OffsetAndMetadata(offset, "", -1)
        try:
            self._consumer.commit(offsets)
        except Exception as e:
            log.warning("offset commit failed (%s); the checkpoint's offsets stay authoritative", e)

    def close(self) -> None:
        self.dead_letters.close()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
