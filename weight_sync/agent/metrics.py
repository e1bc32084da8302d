"""The agent's Prometheus metrics (flywheel_agent_*), every labelled series exported from the start at 0."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from contracts import control
from contracts.events import TOPIC_WEIGHTS
from infra.dead_letter import DeadLetters
from weight_sync.agent.rejected import PERMANENT


class AgentMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.version = Gauge("flywheel_agent_weight_version", "Version the agent's replica serves", registry=r)
        self.pinned = Gauge("flywheel_agent_pinned", "1 while the fleet is pinned to a version", registry=r)
        # Served vs target is what the FleetNotOnAnnouncedVersion alert compares; announced, across agents,
        # shows one that stopped reading the topic (deploy/prometheus/alerts.yml).
        self.target = Gauge(
            "flywheel_agent_target_version",
            "Version the weights topic says this replica should serve (the newest, or the pinned, activated, "
            "rolled-back-to or canary one)",
            registry=r,
        )
        self.announced = Gauge(
            "flywheel_agent_announced_version", "Newest version announced on the weights topic", registry=r
        )
        self.rejected = Counter(
            "flywheel_agent_rejected_versions", "Versions rejected, by reason", ["reason"], registry=r
        )
        self.switches = Counter("flywheel_agent_switches", "Completed hot-switches", ["mode"], registry=r)
        self.bad_records = Counter(
            "flywheel_agent_bad_control_records",
            "Weights records refused (malformed, unsigned, bad signature, invalid, replayed)",
            ["reason"],
            registry=r,
        )
        self.retries = Counter(
            "flywheel_agent_apply_retries",
            "Applies that failed for a transient reason (store or replica unreachable) and were retried",
            registry=r,
        )
        self.poll_failures = Counter(
            "flywheel_agent_poll_failures",
            "Reads of the weights topic that failed (the broker away) and were retried",
            registry=r,
        )
        self.commit_failures = Counter(
            "flywheel_agent_offset_commit_failures",
            "Weights-topic offset commits that failed (the broker away) and were retried",
            registry=r,
        )
        self.inplace_fallbacks = Counter(
            "flywheel_agent_inplace_fallbacks",
            "Versions reloaded whole after an in-place apply failed: patch_failed (could not be built), "
            "refused (by the engine), damaged_base (the local base did not rebuild to the manifest's digests)",
            ["reason"],
            registry=r,
        )
        self.fetched = Counter(
            "flywheel_agent_fetched_bytes",
            "Bytes of versions downloaded, by source (the store, or a peer's relay)",
            ["source"],
            registry=r,
        )
        self.peer_fallbacks = Counter(
            "flywheel_agent_peer_fallbacks",
            "Pieces a peer failed to give (missing, unreachable, slow, corrupt, http_error) and the store sent instead",
            ["reason"],
            registry=r,
        )
        self.relay_requests = Counter(
            "flywheel_agent_relay_requests",
            "Requests to this agent's relay, by result (served; missing: not here, not yet, or never; bad name; "
            "unauthorized: without the fleet read credential)",
            ["result"],
            registry=r,
        )
        self.relay_sent = Counter(
            "flywheel_agent_relay_sent_bytes", "Bytes this agent's relay sent to peers", registry=r
        )
        self.phase = Histogram(
            "flywheel_agent_phase_seconds",
            "Time per phase of applying a version",
            ["phase"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        # What users felt of a switch (the switch report's pause_ms: a drained replica pauses nobody), apart from
        # the "switch" phase above, which also counts a drain's wait and the load behind it.
        self.switch_pause = Histogram(
            "flywheel_agent_switch_pause_seconds",
            "User-visible pause of each switch (0 when the replica was drained first)",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        # Every reason exported from the start at 0: a series born at 1 has no increase to alert on.
        for reason in (*PERMANENT, "fetch_failed", "switch_failed", "damaged_base"):
            self.rejected.labels(reason)
        for reason in control.REASONS:
            self.bad_records.labels(reason)
        for reason in ("missing", "unreachable", "slow", "corrupt", "http_error"):
            self.peer_fallbacks.labels(reason)
        self._dead_letters: DeadLetters | None = None

    def dead_letters(self, consumer: str, bootstrap: str | None) -> DeadLetters:
        """Refused weights records: flywheel_agent_bad_records_total{topic,reason} and the dead-letter topic
        (infra.dead_letter). Made once per registry: a run() after another reuses its counters."""
        if self._dead_letters is None:
            self._dead_letters = DeadLetters(self.registry, "flywheel_agent", consumer, bootstrap, (TOPIC_WEIGHTS,))
        return self._dead_letters
