"""The series the alert rules need that the components did not export before (deploy/prometheus/alerts.yml):
the agent's target and announced versions, the trainer's publish clock, the canary trial's start, and
counters exported at 0 before their first event (an increase() alert cannot see a series born at 1)."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

from online_rl.trainer.metrics import TrainerMetrics
from serving.canary_split import CanarySplit
from weight_sync.agent.loop import Agent, AgentMetrics


def agent(name: str, version: int) -> Agent:
    """An Agent with only what decide() reads (no replica, store or keys)."""
    a = Agent.__new__(Agent)
    a.cfg = SimpleNamespace(name=name)
    a.state = {"version": version, "pinned": None, "latest_seen": version}
    a.metrics = AgentMetrics()
    return a


def gauge(metrics, name: str, labels: dict | None = None) -> float | None:
    return metrics.registry.get_sample_value(name, labels or {})


def test_agent_target_follows_the_topic_and_announced_is_the_newest_seen():
    a = agent("r1", 4)
    assert a.decide([{"type": "version", "version": 5}]) == 5
    assert gauge(a.metrics, "flywheel_agent_target_version") == 5
    assert gauge(a.metrics, "flywheel_agent_announced_version") == 5
    # A canary trial on r0 only: r1 stays on 5, but has seen 6 announced.
    a.decide([{"type": "version", "version": 6, "canary": True}, {"type": "canary", "version": 6, "replicas": ["r0"]}])
    assert gauge(a.metrics, "flywheel_agent_target_version") == 5
    assert gauge(a.metrics, "flywheel_agent_announced_version") == 6
    a.decide([{"type": "pin", "version": 3}, {"type": "version", "version": 7}])
    assert gauge(a.metrics, "flywheel_agent_target_version") == 3  # pinned: newer versions do not move it
    assert gauge(a.metrics, "flywheel_agent_announced_version") == 7
    a.decide([{"type": "unpin"}])
    assert gauge(a.metrics, "flywheel_agent_target_version") == 7


def test_agent_rejection_counters_exist_at_zero_before_any_rejection():
    m = AgentMetrics()
    for reason in ("bad_manifest", "digest_mismatch", "unknown_version", "fetch_failed", "switch_failed"):
        assert gauge(m, "flywheel_agent_rejected_versions_total", {"reason": reason}) == 0.0
    for reason in ("unsigned", "bad_signature", "replayed"):
        assert gauge(m, "flywheel_agent_bad_control_records_total", {"reason": reason}) == 0.0


@dataclasses.dataclass
class Stats:
    joined: int = 0


def test_trainer_publish_clock_reads_the_publisher_at_scrape_time():
    publisher = SimpleNamespace(
        enabled=True, last=time.monotonic() - 100, cfg=SimpleNamespace(interval_s=600.0), published_step=2
    )
    trainer = SimpleNamespace(step=3)  # its publisher is made after its metrics
    m = TrainerMetrics(lambda: Stats(), trainer=trainer)
    assert gauge(m, "flywheel_trainer_publish_interval_seconds") is None
    trainer.publisher = publisher
    assert abs(gauge(m, "flywheel_trainer_last_publish_timestamp_seconds") - (time.time() - 100)) < 5
    assert gauge(m, "flywheel_trainer_publish_interval_seconds") == 600.0
    assert gauge(m, "flywheel_trainer_publish_pending") == 1.0
    publisher.published_step = 3  # nothing new since the last version
    assert gauge(m, "flywheel_trainer_publish_pending") == 0.0
    publisher.enabled = False  # a trainer that does not publish has no clock to alert on
    assert gauge(m, "flywheel_trainer_last_publish_timestamp_seconds") is None


def test_trainer_exports_every_sandbox_kind_before_the_first_containment():
    m = TrainerMetrics(lambda: Stats())
    for kind in ("network", "filesystem", "tamper", "wall_time"):
        assert gauge(m, "flywheel_sandbox_contained_total", {"kind": kind}) is not None


def test_the_gateway_exports_its_canary_trial_and_arms():
    from prometheus_client import CollectorRegistry

    from serving.metrics import _canary_families

    split = CanarySplit(version=7, replicas=frozenset({"r1"}), share=0.5, started=1234.5)
    split.stats["canary"].requests, split.stats["canary"].accepts = 4, 3
    registry = CollectorRegistry()

    class Trial:
        def collect(self):
            yield from _canary_families(split)

    registry.register(Trial())
    assert registry.get_sample_value("flywheel_canary_trial_started_timestamp_seconds", {"version": "7"}) == 1234.5
    assert registry.get_sample_value("flywheel_canary_arm_requests_total", {"version": "7", "arm": "canary"}) == 4
    labels = {"version": "7", "arm": "canary", "kind": "accept"}
    assert registry.get_sample_value("flywheel_canary_arm_feedback_total", labels) == 3
    assert list(_canary_families(None))[0].samples == []  # no trial: the families, empty
