"""What reached Kafka, read back for an audit (the chaos run, the fleet drill): every record of a topic from
the start, duplicates by event_id dropped (the trainer drops them the same way)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TopicAudit:
    per_completion: dict[str, int] = field(default_factory=dict)  # completion_id -> distinct events
    records: int = 0  # records read
    repeated: int = 0  # records whose event_id was already seen (a producer's retry), dropped
    undecodable: int = 0

    def twice(self) -> list[str]:
        """Completions with more than one distinct event: duplicates that survive the dedupe."""
        return [c for c, n in self.per_completion.items() if n > 1]


def read_topic(bootstrap: str, topic: str, idle_ms: int = 5000) -> TopicAudit:
    """Read `topic` to its end (no new record for idle_ms) and count events per completion."""
    from kafka import KafkaConsumer

    from flywheel.core import events as ev

    audit, seen = TopicAudit(), set()
    c = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        consumer_timeout_ms=idle_ms,
    )
    try:
        for r in c:
            audit.records += 1
            try:
                e = ev.decode(r.value)
            except ev.SchemaError:
                audit.undecodable += 1
                continue
            if e.event_id in seen:
                audit.repeated += 1
                continue
            seen.add(e.event_id)
            audit.per_completion[e.completion_id] = audit.per_completion.get(e.completion_id, 0) + 1
    finally:
        c.close()
    return audit
