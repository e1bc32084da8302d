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


def read_topic(bootstrap: str, topic: str, timeout_s: float = 120.0) -> TopicAudit:
    """Read `topic` from its start to the end it has now and count events per completion. Call it once
    what should be there is acknowledged (the spools drained): with acks=all a record is acknowledged once
    every in-sync replica has it, so it is below the end offsets read here. Raises ValueError for a topic
    that is not there, TimeoutError if its end is not reached within timeout_s."""
    from contracts import events as ev
    from infra.kafka_admin import records_to_end

    audit, seen = TopicAudit(), set()
    for r in records_to_end(bootstrap, topic, timeout_s):
        try:
            e = ev.decode(r.value)
        except ev.SchemaError:
            continue
        if isinstance(e, ev.TenantRecord):  # not on the event topics
            continue
        if e.event_id in seen:
            audit.repeated += 1
            continue
        seen.add(e.event_id)
        audit.per_completion[e.completion_id] = audit.per_completion.get(e.completion_id, 0) + 1
    return audit


def trained_keys(trainer_dir: Path) -> list[str]:
    """Every user sample the trainer trained (not dropped), by key "<completion_id>:<choice>"; a key there
    twice is a sample trained twice."""
    keys = []
    for f in sorted((Path(trainer_dir) / "ledger").glob("step-*.json")):
        keys += [e["key"] for e in json.loads(f.read_text()) if "dropped" not in e]
    return keys
