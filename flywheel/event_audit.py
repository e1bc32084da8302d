"""Audits after a fault drill (the chaos run, the fleet drill): what reached Kafka (every record of a topic
from the start, duplicates by event_id dropped, as the trainer drops them) and what the trainer trained
(its checkpoints' ledgers)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TopicAudit:
    per_completion: dict[str, int] = field(default_factory=dict)  # completion_id -> distinct events
    repeated: int = 0  # records whose event_id was already seen (a producer's retry), dropped

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
            try:
                e = ev.decode(r.value)
            except ev.SchemaError:
                continue
            if e.event_id in seen:
                audit.repeated += 1
                continue
            seen.add(e.event_id)
            audit.per_completion[e.completion_id] = audit.per_completion.get(e.completion_id, 0) + 1
    finally:
        c.close()
    return audit


def trained_keys(trainer_dir: Path) -> list[str]:
    """Every user sample the trainer trained (not dropped), by key "<completion_id>:<choice>"; a key there
    twice is a sample trained twice."""
    keys = []
    for f in sorted((Path(trainer_dir) / "ledger").glob("step-*.json")):
        keys += [e["key"] for e in json.loads(f.read_text()) if "dropped" not in e]
    return keys
