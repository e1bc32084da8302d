"""Prometheus metrics of one gateway (its own registry, so several gateways can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from serving.event_log.sync_window import SYNC_LAG_BUCKETS
from serving.monitors import VersionMonitors
from serving.version_stats import VersionStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


def _cached_labels(metric):
    """`metric.labels(...)` memoized by its label values: prometheus-client's takes a lock and validates and joins
    the values on every call, several times per request on the gateway's hot path. Only for metrics whose series
    are never removed (VersionStats removes old versions': not these)."""
    children: dict = {}
    labels = metric.labels

    def cached(*values):
        child = children.get(values)
        if child is None:
            child = children[values] = labels(*values)
        return child

    metric.labels = cached
    return metric


class GatewayMetrics:
    def __init__(self, gateway) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = _cached_labels(
            Counter("flywheel_gateway_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        )
        self.ttft = Histogram(
            "flywheel_gateway_time_to_first_token_seconds",
            "Time to first token (streaming)",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "flywheel_gateway_inter_token_latency_seconds",
            "Time between streamed chunks",
            ["route"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.e2e = _cached_labels(
            Histogram(
                "flywheel_gateway_e2e_latency_seconds",
                "Request latency, received to last byte",
                ["route"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.retries = Counter("flywheel_gateway_replica_retries", "Requests retried on another replica", registry=r)
        # User and rollout completions are counted apart: rollouts on borrowed replicas are not user traffic.
        self.completions = _cached_labels(
            Counter("flywheel_gateway_completions", "Completion choices generated, by source", ["source"], registry=r)
        )
        self.completion_tokens = _cached_labels(
            Counter("flywheel_gateway_completion_tokens", "Tokens generated, by source", ["source"], registry=r)
        )
        self.feedback = Counter(
            "flywheel_gateway_feedback",
            "Feedback accepted by kind (the first per completion choice)",
            ["kind"],
            registry=r,
        )
        self.cancels = Counter(
            "flywheel_gateway_client_cancels",
            "Streams the client closed before the end (the request is aborted on its replica)",
            ["route"],
            registry=r,
        )
        self.session_feedback = Counter(
            "flywheel_gateway_session_feedback",
            "Feedback on a whole agent session by kind (the first per session)",
            ["kind"],
            registry=r,
        )
        self.feedback_repeated = Counter(
            "flywheel_gateway_feedback_repeated",
            "Feedback on a completion choice already judged: logged, not counted",
            ["kind"],
            registry=r,
        )
        self.versions = VersionStats(r, LATENCY_BUCKETS)  # flywheel_gateway_version_*{version}
        # tool-call outcomes and the reward-hacking monitors, by version (flywheel_gateway_tool_calls, ..._hack_monitor)
        self.monitors = VersionMonitors()
        self.answered_before_durable = Counter(
            "flywheel_gateway_answered_before_durable",
            "Responses sent before their event was on disk (the spool "
            "was slower than durable_wait_s: a disk full or failing); a crash then could lose those events",
            ["topic"],
            registry=r,
        )
        # SGLang's cached_tokens per completion: the prefix hit rate of each replica under the routing policy.
        self.prompt_tokens = _cached_labels(
            Counter(
                "flywheel_gateway_prompt_tokens",
                "Prompt tokens of user completions whose replica reported its cache hits, by replica and routing "
                "policy",
                ["replica", "policy"],
                registry=r,
            )
        )
        self.cached_prompt_tokens = _cached_labels(
            Counter(
                "flywheel_gateway_cached_prompt_tokens",
                "Of those, the tokens the replica's prefix cache already held (no prefill paid)",
                ["replica", "policy"],
                registry=r,
            )
        )
        self._prefix_tokens: dict[tuple[str, str], list[int]] = {}  # (replica, policy) -> [prompt, cached]
        self.ignored_names: dict[str, set] = {}  # api -> the field names with a series of their own (bounded)
        self.ignored_fields = Counter(
            "flywheel_gateway_ignored_fields",
            "Request fields the pinned protocol types do not know, ignored (agent clients newer than the pin)",
            ["api", "field"],
            registry=r,
        )
        self.implicit = Counter(
            "flywheel_gateway_implicit_signals",
            "Verdicts read from agent sessions (serving.signals.implicit): tests_pass, tests_fail, revert, "
            "correction, repeat, abandoned",
            ["signal"],
            registry=r,
        )
        self.devdata = Counter(
            "flywheel_gateway_devdata_events",
            "Development-data events from unchanged clients (Continue), by event name and what became of them: "
            "joined (a feedback event on the completion that produced it), unmatched (no completion of this "
            "key's served here has that text), no_signal (a kind that judges nothing), unknown (dropped)",
            ["name", "outcome"],
            registry=r,
        )
        r.register(_LiveCollector(gateway))
        r.register(self.monitors)

    def count_prompt(self, replica: str, policy: str, prompt_tokens: int, cached_tokens: int | None) -> None:
        if cached_tokens is None:
            return  # the replica did not say: neither hit nor miss
        self.prompt_tokens.labels(replica, policy).inc(prompt_tokens)
        self.cached_prompt_tokens.labels(replica, policy).inc(cached_tokens)
        seen = self._prefix_tokens.setdefault((replica, policy), [0, 0])
        seen[0] += prompt_tokens
        seen[1] += cached_tokens

    def prefix_hit_rate(self) -> dict[tuple[str, str], float]:
        """Cached / prompt tokens since start, per (replica, policy) (also the gauge of that name)."""
        return {key: cached / prompt for key, (prompt, cached) in self._prefix_tokens.items() if prompt}


class _LiveCollector:
    """Values read at scrape time: replica state and load, event-log counters."""

    def __init__(self, gateway) -> None:
        self.gw = gateway

    def collect(self):
        inflight = GaugeMetricFamily(
            "flywheel_replica_inflight_requests", "User requests in flight per replica", labels=["replica"]
        )
        healthy = GaugeMetricFamily(
            "flywheel_replica_healthy", "1 if the replica passes health checks", labels=["replica"]
        )
        state = GaugeMetricFamily(
            "flywheel_replica_state", "1 for the replica's current state", labels=["replica", "state"]
        )
        rollouts = GaugeMetricFamily(
            "flywheel_replica_rollout_inflight_requests",
            "Trainer rollout requests in flight per replica",
            labels=["replica"],
        )
        version = GaugeMetricFamily(
            "flywheel_replica_weight_version", "Weight version the replica serves", labels=["replica"]
        )
        for rep in self.gw.pool.replicas.values():
            inflight.add_metric([rep.id], rep.outstanding)
            rollouts.add_metric([rep.id], rep.rollout_outstanding)
            healthy.add_metric([rep.id], 1.0 if rep.healthy else 0.0)
            state.add_metric([rep.id, rep.state.value], 1.0)
            if rep.weight_version is not None:
                version.add_metric([rep.id], float(rep.weight_version))
        yield from (inflight, rollouts, healthy, state, version)
        yield from _canary_families(self.gw.dispatcher.canary)
        hit = GaugeMetricFamily(
            "flywheel_gateway_prefix_hit_rate",
            "Prompt tokens found in the replica's prefix cache / prompt tokens, since the gateway started",
            labels=["replica", "policy"],
        )
        for (replica, policy), rate in self.gw.metrics.prefix_hit_rate().items():
            hit.add_metric([replica, policy], rate)
        yield hit
        view = self.gw.pool.policy.view()
        decisions = CounterMetricFamily(
            "flywheel_gateway_routing_decisions",
            "Why the routing policy sent each user request where it did (cache_aware: match, balance, no_match)",
            labels=["policy", "why"],
        )
        for why, n in view.get("decisions", {}).items():
            decisions.add_metric([view["policy"], why], n)
        yield decisions
        yield CounterMetricFamily(
            "flywheel_replica_drain_leases_lapsed",
            "Drains whose agent went quiet: the gateway routed users to the replica again",
            value=self.gw.pool.lapsed_drains,
        )
        s = self.gw.events.stats
        events = CounterMetricFamily("flywheel_events", "Events by what happened to them", labels=["state"])
        for name, value in (
            ("submitted", s.submitted),
            ("spooled", s.spooled),
            ("produced", s.produced),
            ("replayed", s.replayed),
            ("dropped_queue_full", s.dropped_queue_full),
            ("dropped_spool_full", s.dropped_spool_full),
            ("deadlettered", s.deadlettered),
        ):
            events.add_metric([name], value)
        yield events
        yield CounterMetricFamily(
            "flywheel_event_scrubbed",
            "Events delivered withheld (no prompt, output or comment) because their texts held a secret, or "
            "could not be scanned",
            value=s.scrubbed,
        )
        yield CounterMetricFamily(
            "flywheel_event_unscanned",
            "Of the scrubbed events: withheld without a scan (a backlog near the spool's limit, or spooled by a "
            "release without scanning)",
            value=s.unscanned,
        )
        yield CounterMetricFamily(
            "flywheel_event_forgotten",
            "Records of forgotten tenants never delivered (skipped, or redacted in the spool before they were sent)",
            value=s.forgotten,
        )
        yield GaugeMetricFamily(
            "flywheel_event_spool_pending_bytes", "Spooled bytes not yet acknowledged by Kafka", value=s.pending_bytes
        )
        yield GaugeMetricFamily(
            "flywheel_event_spool_alarm",
            "1 while the spool is over its size limit",
            value=1.0 if self.gw.events.spool_full else 0.0,
        )
        yield GaugeMetricFamily(
            "flywheel_kafka_up", "1 if the last delivery to Kafka succeeded", value=1.0 if s.broker_up else 0.0
        )
        yield CounterMetricFamily(
            "flywheel_event_spool_write_failures",
            "Spool writes that failed and were retried (disk full, I/O error)",
            value=s.write_failures,
        )
        yield CounterMetricFamily(
            "flywheel_event_shipper_restarts",
            "Times the shipper process died and was started again",
            value=s.shipper_restarts,
        )
        health = self.gw.events.health() if self.gw.cfg.log_events else {"writer": "off", "shipper": "off"}
        yield GaugeMetricFamily(
            "flywheel_event_writer_ok",
            "1 while the spool writer thread writes",
            value=1.0 if health["writer"] == "ok" else 0.0,
        )
        window = self.gw.events.sync_window
        yield GaugeMetricFamily(
            "flywheel_event_spool_sync_window_seconds",
            "How long a spooled event may wait for its fdatasync while the gateway runs (0: strict, synced before "
            "answering)",
            value=window.window_s,
        )
        lag = HistogramMetricFamily(
            "flywheel_event_spool_sync_lag_seconds",
            "Per sync: how long its oldest record, answered once written, waited for the fdatasync (window mode)",
        )
        cumulative, buckets = 0, []
        for bound, n in zip(SYNC_LAG_BUCKETS, window.lag_counts):
            cumulative += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        lag.add_metric([], buckets, sum_value=window.lag_sum_s)
        yield lag
        yield CounterMetricFamily(
            "flywheel_event_spool_syncs_on_request_path",
            "Spool syncs the event loop ran itself, the writer thread late (3/4 of the window)",
            value=window.inline_syncs,
        )
        yield CounterMetricFamily(
            "flywheel_event_spool_answered_past_window",
            "Events answered while a record older than the sync window was unsynced (the window's promise broken)",
            value=window.answered_past_window,
        )


def _canary_families(canary):
    """The trial the gateway splits users for, if any: its start (CanaryUndecided alerts on a trial held long
    after its controller should have decided) and each arm's counts (the same the controller reads)."""
    trial = GaugeMetricFamily(
        "flywheel_canary_trial_started_timestamp_seconds",
        "Start of the canary trial the gateway splits users for (Unix time), by candidate version",
        labels=["version"],
    )
    requests = CounterMetricFamily(
        "flywheel_canary_arm_requests", "User requests of the trial by arm", labels=["version", "arm"]
    )
    errors = CounterMetricFamily("flywheel_canary_arm_errors", "Failed requests by arm", labels=["version", "arm"])
    feedback = CounterMetricFamily(
        "flywheel_canary_arm_feedback",
        "Accepts and rejects of the arm's completions",
        labels=["version", "arm", "kind"],
    )
    if canary is not None:
        v = str(canary.version)
        trial.add_metric([v], canary.started)
        for arm, st in canary.stats.items():
            requests.add_metric([v, arm], st.requests)
            errors.add_metric([v, arm], st.errors)
            feedback.add_metric([v, arm, "accept"], st.accepts)
            feedback.add_metric([v, arm, "reject"], st.rejects)
    yield from (trial, requests, errors, feedback)
