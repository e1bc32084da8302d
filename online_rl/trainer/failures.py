"""How the trainer daemon lives with failures: one sample, one rollout group, one HTTP call, one publish,
one announce. Each failure is counted (`flywheel_trainer_failures_total{stage,cause}`), logged once with
its cause (the first of a streak; the rest of the streak at debug level, and a line when the stage
recovers), retried with exponential backoff when it is transient and skipped when it is not. The loop
goes on either way."""

from __future__ import annotations

import logging
import socket
import time
import urllib.error
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class RetryConfig:
    base_s: float = 1.0  # first backoff after a transient failure
    max_s: float = 60.0  # backoff doubles per failure in a streak, up to this


def transient(exc: BaseException) -> bool:
    """Worth retrying: the network, a server's 5xx or 408/429, Kafka's retriable errors, I/O (a full disk
    may be freed). A 4xx, bad data or a bug is not: retrying gives the same answer."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in (408, 429) or exc.code >= 500
    if isinstance(exc, (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout)):
        return True
    try:
        from kafka.errors import KafkaError, NoBrokersAvailable
    except ImportError:  # pragma: no cover - kafka-python is a dependency
        KafkaError = NoBrokersAvailable = ()
    if isinstance(exc, NoBrokersAvailable):
        return True
    if isinstance(exc, KafkaError):
        return bool(getattr(exc, "retriable", False)) or type(exc).__name__ in ("KafkaTimeoutError",)
    return isinstance(exc, OSError)


class Failures:
    def __init__(self, counter, cfg: RetryConfig | None = None, clock=time.monotonic):
        self.counter = counter  # a prometheus Counter labelled (stage, cause)
        self.cfg = cfg or RetryConfig()
        self.clock = clock
        self._streak: dict[str, int] = {}
        self._causes: dict[str, set[str]] = {}
        self._retry_at: dict[str, float] = {}

    def failed(self, stage: str, exc: BaseException, retry: bool | None = None) -> bool:
        """Record one failure of `stage`. Returns whether it will be retried (transient), after backoff."""
        retry = transient(exc) if retry is None else retry
        cause = type(exc).__name__
        self.counter.labels(stage, cause).inc()
        n = self._streak[stage] = self._streak.get(stage, 0) + 1
        delay = min(self.cfg.max_s, self.cfg.base_s * 2 ** (n - 1)) if retry else 0.0
        first = cause not in self._causes.setdefault(stage, set())
        self._causes[stage].add(cause)
        (log.warning if first else log.debug)(
            "%s failed (%s: %s); %s",
            stage,
            cause,
            str(exc)[:300] or "-",
            f"retrying in {delay:.0f} s" if retry else "skipped",
        )
        if retry:
            self._retry_at[stage] = self.clock() + delay
        return retry

    def succeeded(self, stage: str) -> None:
        n = self._streak.pop(stage, 0)
        self._retry_at.pop(stage, None)
        if self._causes.pop(stage, None) and n:
            log.info("%s recovered after %d failure(s)", stage, n)

    def ready(self, stage: str) -> bool:
        """False while a transient failure's backoff runs."""
        return self.clock() >= self._retry_at.get(stage, 0.0)

    def count(self, stage: str) -> float:
        return sum(
            m.value
            for metric in self.counter.collect()
            for m in metric.samples
            if m.name.endswith("_total") and m.labels.get("stage") == stage
        )
