"""Records a consumer refuses: counted, copied to the dead-letter topic, skipped.

Whatever reaches the broker is untrusted input (DESIGN.md, Trust boundaries): a consumer that cannot use a record
(contracts.events.BadRecord, contracts.control.ControlError) gives it to `DeadLetters.refuse` and goes on
to the next, committing past it as past any other. The record is counted in `<prefix>_bad_records_total{topic,
reason}` and copied whole to events.TOPIC_BAD_RECORDS, with headers naming where it came from (topic, partition,
offset), why it was refused and who refused it, so an operator can see what was written and by whom, and replay it
once a reader is fixed.

Dead-lettering is best effort and never holds the consumer up: the copy is sent asynchronously with bounded waits;
a copy that fails (the broker away, the record too large) is counted in `<prefix>_dead_letter_failures_total`, and
after a failure to reach the broker no copy is tried for `BACKOFF_S` (the record is still counted, and still on its
own topic until retention). A consumer that reads a topic from its start at every start (the canary controller)
copies what it refuses again each time: the `consumer` header tells copies apart, not that they are new.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter

from contracts import control, events as ev
from infra import kafka_auth

log = logging.getLogger(__name__)
BACKOFF_S = 30.0  # after the producer could not reach the broker: copies wait this long before another try
MAX_COPY_BYTES = 900 << 10  # a longer value is cut there (header `length`: its size), under the broker's 1 MiB
# What each topic's readers refuse for (exported at 0 from the start: an alert on an increase sees the first one).
TOPIC_REASONS = {
    ev.TOPIC_COMPLETIONS: ev.REASONS,
    ev.TOPIC_FEEDBACK: ev.REASONS,
    ev.TOPIC_TENANTS: ev.REASONS,
    ev.TOPIC_WEIGHTS: control.REASONS,
}


class DeadLetters:
    """One consumer's refused records. `prefix` names its metrics (flywheel_trainer, flywheel_agent, ...);
    `bootstrap` None: counted and logged only. `topics`: the topics it reads (their series start at 0)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        prefix: str,
        consumer: str,
        bootstrap: str | None,
        topics=tuple(TOPIC_REASONS),
        producer_config: dict | None = None,
    ):
        self.consumer, self.bootstrap = consumer, bootstrap
        self.producer_config = producer_config or {}  # extra KafkaProducer settings (security, ...)
        self.refused = Counter(
            f"{prefix}_bad_records",
            "Records read from the broker and refused (not an event, wrong types, out of range, unsigned, replayed): "
            "counted, dead-lettered and skipped",
            ["topic", "reason"],
            registry=registry,
        )
        self.failures = Counter(
            f"{prefix}_dead_letter_failures",
            f"Refused records that could not be copied to {ev.TOPIC_BAD_RECORDS} (still counted and skipped)",
            registry=registry,
        )
        for topic in topics:
            for reason in TOPIC_REASONS.get(topic, ()):
                self.refused.labels(topic, reason)
        self._producer = None
        self._retry_at = 0.0
        self._logged: set[tuple[str, str]] = set()

    def refuse(self, topic: str, value, error: Exception, record=None) -> None:
        """Count `value` (read from `topic`; `record`: its kafka-python ConsumerRecord, for where it was) as refused
        for `error`'s reason, log it (the first of each topic and reason at warning level), and copy it to the
        dead-letter topic. Never raises."""
        reason = getattr(error, "reason", "malformed")
        self.refused.labels(topic, reason).inc()
        where = "" if record is None else f" at {record.partition}:{record.offset}"
        first = (topic, reason) not in self._logged
        self._logged.add((topic, reason))
        (log.warning if first else log.debug)(
            "%s: refused a %s record%s (%s): %s", self.consumer, topic, where, reason, error
        )
        if not self.bootstrap:
            return
        if time.monotonic() < self._retry_at:  # the broker was away a moment ago: not tried again yet
            self.failures.inc()
            return
        try:
            self._copy(topic, value, reason, str(error), record)
        except Exception as e:  # noqa: BLE001 - the dead-letter topic is a courtesy; the consumer goes on
            self._failed(e)

    def _copy(self, topic: str, value, reason: str, detail: str, record) -> None:
        value = value if isinstance(value, (bytes, bytearray)) or value is None else bytes(value)
        headers = [
            ("topic", topic.encode()),
            ("reason", reason.encode()),
            ("consumer", self.consumer.encode()),
            ("detail", detail.encode("utf-8", "replace")[:512]),
        ]
        if record is not None:
            headers += [("partition", str(record.partition).encode()), ("offset", str(record.offset).encode())]
        if value is not None and len(value) > MAX_COPY_BYTES:
            headers.append(("length", str(len(value)).encode()))
            value = bytes(value[:MAX_COPY_BYTES])
        key = getattr(record, "key", None)
        future = self._producer_().send(ev.TOPIC_BAD_RECORDS, key=key, value=value, headers=headers)
        future.add_errback(self._failed)

    def _producer_(self):
        if self._producer is None:
            from kafka import KafkaProducer

            from infra.kafka_admin import RECONNECT_BACKOFF_MAX_MS

            self._producer = KafkaProducer(
                bootstrap_servers=self.bootstrap,
                **kafka_auth.client_config(),
                acks="all",
                client_id=f"flywheel-dead-letter-{self.consumer}",
                max_block_ms=2000,  # the longest a refused record can hold its consumer up
                request_timeout_ms=5000,
                delivery_timeout_ms=15000,
                max_request_size=1 << 20,
                reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
                **self.producer_config,
            )
        return self._producer

    def _failed(self, error) -> None:
        self.failures.inc()
        from kafka.errors import KafkaTimeoutError, NoBrokersAvailable

        if isinstance(error, (KafkaTimeoutError, NoBrokersAvailable)):
            self._retry_at = max(self._retry_at, time.monotonic() + BACKOFF_S)
        log.warning("%s: a refused record was not dead-lettered (%s: %s)", self.consumer, type(error).__name__, error)

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is still buffered (within timeout_s), then close the producer."""
        p, self._producer = self._producer, None
        if p is not None:
            try:
                p.close(timeout=timeout_s)
            except Exception as e:  # noqa: BLE001 - closing never fails the consumer's own close
                log.warning("%s: closing the dead-letter producer: %s", self.consumer, e)
