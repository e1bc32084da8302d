"""serving.version_stats: completions, latency and first feedback by the version that served them, bounded."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from serving.version_stats import VersionStats


def _value(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def test_feedback_counts_under_the_version_that_served_the_completion():
    r = CollectorRegistry()
    s = VersionStats(r, buckets=(0.1, 1.0))
    s.served("cmpl-a", 0, 3, 0.05)
    s.served("cmpl-a", 1, 3, 0.05)  # a second choice of the same request: one latency observation
    s.served("cmpl-b", 0, 4, 0.5)
    s.judged("cmpl-a", "accept")
    s.judged("cmpl-b", "reject")
    s.judged("cmpl-gone", "accept")  # never seen (or forgotten): counted, under "unknown"
    assert _value(r, "flywheel_gateway_version_completions_total", version="3") == 2
    assert _value(r, "flywheel_gateway_version_latency_seconds_count", version="3", kind="completion") == 1
    assert _value(r, "flywheel_gateway_version_latency_seconds_bucket", version="4", kind="completion", le="0.1") == 0
    s.served("cmpl-d", 0, 4, 2.0, kind="chat")  # an agent's turn: its own latency class
    assert _value(r, "flywheel_gateway_version_latency_seconds_count", version="4", kind="chat") == 1
    assert _value(r, "flywheel_gateway_version_feedback_total", version="3", kind="accept") == 1
    assert _value(r, "flywheel_gateway_version_feedback_total", version="4", kind="reject") == 1
    assert _value(r, "flywheel_gateway_version_feedback_total", version="unknown", kind="accept") == 1
    s.served("cmpl-c", 0, None, None)  # the replica did not say which version answered
    assert _value(r, "flywheel_gateway_version_completions_total", version="unknown") == 1


def test_old_versions_and_completion_ids_are_forgotten():
    r = CollectorRegistry()
    s = VersionStats(r, buckets=(1.0,), max_versions=2, capacity=2)
    s.served("c1", 0, 1, 0.1)
    s.judged("c1", "accept")
    s.served("c2", 0, 2, 0.1)
    s.served("c3", 0, 3, 0.1)  # v1's series go: three versions, two kept
    text = generate_latest(r).decode()
    assert 'version="1"' not in text and 'version="3"' in text
    s.judged("c1", "reject")  # c1 was pushed out of the id memory (capacity 2)
    assert _value(r, "flywheel_gateway_version_feedback_total", version="unknown", kind="reject") == 1
