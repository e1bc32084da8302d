"""After a run: is every completion and feedback event the load test caused in Kafka?"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Set as AbstractSet

from infra import kafka_auth


def _spool_pending(gateway: str) -> int:
    try:
        with urllib.request.urlopen(f"{gateway}/health", timeout=5) as r:
            return json.loads(r.read())["spool_pending_bytes"]
    except urllib.error.HTTPError as e:  # 503 (degraded) still reports the spool
        return json.loads(e.read())["spool_pending_bytes"]


def all_delivered(
    gateway: str,
    bootstrap: str,
    completion_ids: set[str],
    since: float,
    timeout_s: float = 180.0,
    turn_ids: AbstractSet[str] = frozenset(),
    session_ids: AbstractSet[str] = frozenset(),
) -> dict:
    """Wait for the gateway's spool to drain, then read both topics from `since` (unix time) on. Expected:
    a completion event for every completion id and agent turn, a feedback event for every completion id
    (by completion) and every agent session (by session id)."""
    from kafka import KafkaConsumer, TopicPartition

    from contracts import events as ev
    from infra.kafka_admin import quiet_kafka

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _spool_pending(gateway) > 0:
        time.sleep(0.5)
    drained_s = round(timeout_s - (deadline - time.monotonic()), 1)
    seen: dict[str, set[str]] = {ev.TOPIC_COMPLETIONS: set(), ev.TOPIC_FEEDBACK: set()}
    with quiet_kafka():
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            **kafka_auth.client_config(),
            group_id=f"loadtest-check-{uuid.uuid4().hex[:6]}",
            enable_auto_commit=False,
        )
        try:
            parts = [TopicPartition(t, p) for t in seen for p in sorted(consumer.partitions_for_topic(t) or [])]
            consumer.assign(parts)
            starts = consumer.offsets_for_times({tp: int((since - 5) * 1000) for tp in parts})
            ends = consumer.end_offsets(parts)
            for tp in parts:
                if starts.get(tp) is None:
                    consumer.seek(tp, ends[tp])
                else:
                    consumer.seek(tp, starts[tp].offset)
            while time.monotonic() < deadline and any(consumer.position(tp) < ends[tp] for tp in parts):
                for tp, recs in consumer.poll(timeout_ms=500).items():
                    for r in recs:
                        e = ev.decode(r.value)
                        if isinstance(e, ev.TenantRecord):  # not on the event topics
                            continue
                        session = isinstance(e, ev.FeedbackEvent) and e.session_id
                        seen[tp.topic].add(f"session:{e.session_id}" if session else e.completion_id)
        finally:
            consumer.close()
    missing_c = len((completion_ids | turn_ids) - seen[ev.TOPIC_COMPLETIONS])
    missing_f = len((completion_ids | {f"session:{s}" for s in session_ids}) - seen[ev.TOPIC_FEEDBACK])
    return {
        "issued": len(completion_ids),
        "agent_turns": len(turn_ids),
        "agent_sessions": len(session_ids),
        "missing_completions": missing_c,
        "missing_feedback": missing_f,
        "spool_drained_s": drained_s,
        "complete": missing_c == 0 and missing_f == 0,
    }
