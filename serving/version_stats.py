"""User completions, their latency and their first feedback, by the weight version that served them.

Why the gateway counts this and not only the trainer: an SRE asks "is v7 worse than v6?" of Prometheus
while v7 is being served, before the trainer has joined anything; and the demo's per-version table is
checked against these series (flywheel.observe.prometheus). The feedback arrives later than the completion, so
the gateway remembers which version served each completion id (bounded: the oldest are forgotten first,
as in serving.signals.first_feedback; feedback on a forgotten id is counted under version "unknown").

The `version` label is bounded too: the `max_versions` most recently served versions are kept, an older
one's series are removed (a fleet serves one or two versions at a time, a canary trial three).
"""

from __future__ import annotations

from collections import OrderedDict

from prometheus_client import CollectorRegistry, Counter, Histogram

UNKNOWN = "unknown"


class VersionStats:
    def __init__(self, registry: CollectorRegistry, buckets, max_versions: int = 8, capacity: int = 200_000):
        self.max_versions = max_versions
        self.capacity = capacity
        self._served: OrderedDict[str, str] = OrderedDict()  # completion id -> version label
        # version -> its label sets beside the version: feedback kinds, ("latency", API kind)
        self._versions: OrderedDict[str, set] = OrderedDict()
        self.completions = Counter(
            "flywheel_gateway_version_completions",
            "User completion choices by the weight version that served them",
            ["version"],
            registry=registry,
        )
        self.feedback = Counter(
            "flywheel_gateway_version_feedback",
            "First feedback on a user completion choice, by the version that served it and kind",
            ["version", "kind"],
            registry=registry,
        )
        # By kind too: a chat turn of an agent session carries a whole file, another latency class than an
        # autocomplete, and a p99 over both says little of either.
        self.latency = Histogram(
            "flywheel_gateway_version_latency_seconds",
            "Generation latency of user completions (gateway to replica and back), by serving version and API "
            "(completion, chat)",
            ["version", "kind"],
            buckets=buckets,
            registry=registry,
        )

    def served(
        self, completion_id: str, choice: int, version: int | None, latency_s: float | None, kind: str = "completion"
    ) -> None:
        v = UNKNOWN if version is None else str(version)
        self._touch(v)
        self.completions.labels(v).inc()
        if choice == 0:  # the choices of one request share their latency: observed once
            self._served[completion_id] = v
            self._served.move_to_end(completion_id)
            while len(self._served) > self.capacity:
                self._served.popitem(last=False)
            if latency_s is not None:
                self.latency.labels(v, kind).observe(latency_s)
                self._versions[v].add(("latency", kind))

    def judged(self, completion_id: str, kind: str) -> None:
        v = self._served.get(completion_id, UNKNOWN)
        self._touch(v)
        self._versions[v].add(kind)
        self.feedback.labels(v, kind).inc()

    def _touch(self, v: str) -> None:
        self._versions.setdefault(v, set())
        self._versions.move_to_end(v)
        while len(self._versions) > self.max_versions:
            old, kinds = self._versions.popitem(last=False)
            try:
                self.completions.remove(old)
            except KeyError:
                pass
            for kind in kinds:
                if isinstance(kind, tuple):  # ("latency", api kind)
                    self.latency.remove(old, kind[1])
                else:
                    self.feedback.remove(old, kind)
