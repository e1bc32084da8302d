"""One replica as the router sees it (ReplicaHandle): its state, health, load and the version it serves.

The pool (serving.routing.pool) owns the handles and changes their state; the policies read them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import Enum


class ReplicaState(str, Enum):
    ACTIVE = "active"
    DRAINING = "draining"
    BORROWED = "borrowed"


@dataclass
class ReplicaHandle:
    id: str
    url: str
    state: ReplicaState = ReplicaState.ACTIVE
    healthy: bool = False  # until the first health check answers
    outstanding: int = 0  # user requests in flight (a choice of n counts once each)
    rollout_outstanding: int = 0
    weight_version: int | None = None
    last_error: str | None = None
    last_check: float = 0.0
    served: int = 0
    failures: int = 0
    borrow_pending: bool = False  # draining on the way to borrowed
    drain_lease_until: float | None = None  # a drain an agent holds (renewed while it switches); None: an SRE's
    queue_depth: int = 0  # SGLang's waiting requests (its /metrics), as of the last health check
    running: int = 0  # SGLang's running requests, same source
    kv_capacity_tokens: int | None = None  # SGLang's KV pool (sglang:max_total_num_tokens), same source
    rollout_tasks: dict = field(default_factory=dict)  # rid -> the task running that rollout here (to abort on return)
    _rate: float = 0.0  # user requests/s, exponentially decayed
    _rate_t: float = field(default_factory=time.monotonic)

    RATE_TAU_S = 10.0

    def count_request(self) -> None:
        now = time.monotonic()
        self._rate = self._rate * math.exp(-(now - self._rate_t) / self.RATE_TAU_S) + 1.0 / self.RATE_TAU_S
        self._rate_t = now

    @property
    def rate(self) -> float:
        """User requests per second over roughly the last RATE_TAU_S seconds."""
        return self._rate * math.exp(-(time.monotonic() - self._rate_t) / self.RATE_TAU_S)

    def view(self) -> dict:
        return {
            "id": self.id,
            "url": self.url,
            "state": self.state.value,
            "healthy": self.healthy,
            "outstanding": self.outstanding,
            "rollout_outstanding": self.rollout_outstanding,
            "weight_version": self.weight_version,
            "served": self.served,
            "failures": self.failures,
            "last_error": self.last_error,
            "request_rate": round(self.rate, 3),
            "queue_depth": self.queue_depth,
            "running": self.running,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "borrow_pending": self.borrow_pending,
            "drain_lease_s": None
            if self.drain_lease_until is None
            else round(max(0.0, self.drain_lease_until - time.monotonic()), 1),
        }
