"""The trainer's Prometheus metrics (served on --metrics-port)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from online_rl.sandbox import judge as sandbox


class JoinCounts(Collector):
    """flywheel_trainer_events_total{outcome}: the Joiner's own counts (online_rl.data.join.JoinStats), read at
    each scrape: they live in the checkpoint, so they continue across restarts."""

    def __init__(self, stats: Callable[[], Any]):  # a dataclass (JoinStats)
        self.stats = stats

    def collect(self):
        family = CounterMetricFamily("flywheel_trainer_events", "Stream events by outcome", labels=["outcome"])
        for name, count in dataclasses.asdict(self.stats()).items():
            family.add_metric([name], count)
        yield family


class PublishClock(Collector):
    """When the trainer last published, how often it should, and whether it has anything new to publish:
    the TrainerSilent alert (deploy/prometheus/alerts.yml) fires when it has, and has not published for
    twice its interval. Read at scrape time from the trainer's publisher (online_rl.trainer.publisher); nothing
    when this trainer does not publish (no store, or not rank 0)."""

    def __init__(self, trainer):
        self.trainer = trainer  # read at each scrape: its publisher is made after its metrics

    def collect(self):
        pub = getattr(self.trainer, "publisher", None)
        if pub is None or not pub.enabled:
            return
        # Publisher.last is monotonic (set at its start, then at each publish): as a Unix time for PromQL.
        last = time.time() - (time.monotonic() - pub.last)
        yield GaugeMetricFamily(
            "flywheel_trainer_last_publish_timestamp_seconds",
            "When this trainer last published a version (its start, until it has), Unix time",
            value=last,
        )
        yield GaugeMetricFamily(
            "flywheel_trainer_publish_interval_seconds", "Seconds between published versions", value=pub.cfg.interval_s
        )
        # Publisher.due's own test: weights that are already a version are not published again, so a trainer
        # with nothing new (no feedback, no rollouts) is silent by design.
        yield GaugeMetricFamily(
            "flywheel_trainer_publish_pending",
            "1 while the trainer holds updates not yet published as a version",
            value=1.0 if self.trainer.step != pub.published_step else 0.0,
        )


class TrainerMetrics:
    def __init__(self, join_stats: Callable[[], Any], waiting: Callable[[], int] = lambda: 0, trainer=None):
        self.registry = r = CollectorRegistry()
        r.register(JoinCounts(join_stats))
        if trainer is not None:
            r.register(PublishClock(trainer))
        self.waiting = Gauge(
            "flywheel_trainer_samples_waiting",
            "Judged completions waiting for a delayed signal (persisted check, comment)",
            registry=r,
        )
        self.waiting.set_function(waiting)
        self.samples = Counter("flywheel_trainer_samples", "Samples trained, by source", ["source"], registry=r)
        self.dropped = Counter(
            "flywheel_trainer_dropped",
            "Samples dropped before training, by reason (distill_backlog: commented contexts, already trained on, "
            "that will not be sampled again)",
            ["reason"],
            registry=r,
        )
        self.reward = Gauge(
            "flywheel_trainer_reward_mean", "Mean reward of trained samples, by version", ["version"], registry=r
        )
        self.acceptance = Gauge(
            "flywheel_trainer_acceptance", "Share of user samples accepted, by version", ["version"], registry=r
        )
        # The k1 estimate (log ratio) is what is reported; the loss optimises k2 (online_rl.trainer.loss).
        self.kl = Gauge("flywheel_trainer_kl_per_token", "k1 KL estimate to the reference, per token", registry=r)
        self.mismatch = Gauge(
            "flywheel_trainer_logprob_mismatch_max", "Max |trainer - behaviour| logprob in the last batch", registry=r
        )
        self.step_time = Histogram(
            "flywheel_trainer_step_seconds",
            "Update step time",
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.tokens_per_s = Gauge("flywheel_trainer_tokens_per_s", "Trained tokens per second, last step", registry=r)
        self.grad_norm = Gauge(
            "flywheel_trainer_grad_norm",
            "Gradient norm before clipping, last update, by optimizer step (first and last policy-gradient pass, "
            "the distillation's own step)",
            ["step"],
            registry=r,
        )
        self._grad_steps: set[str] = set()  # the series set, so only they are removed
        self.version = Gauge("flywheel_trainer_published_version", "Newest version published", registry=r)
        self.step = Gauge("flywheel_trainer_step", "Updates done", registry=r)
        self.failures = Counter(
            "flywheel_trainer_failures",
            "Failures the daemon lived through, by stage "
            "(ingest, sample, distill_samples, update, rollout_http, rollout_group, publish, announce, provenance, "
            "publish_marker, history) and cause",
            ["stage", "cause"],
            registry=r,
        )
        r.register(sandbox.CONTAINED)  # flywheel_sandbox_contained_total{kind}: reward hacking, contained
        for kind in sandbox.KINDS:  # exported at 0 from the start: the alert on its increase sees the first one
            sandbox.CONTAINED.labels(kind)

    def trained(self, history: dict[str, dict], m: dict, samples=(), version: int = 0, pass_rates=()) -> None:
        """After an update: its user samples' rewards (by the version that served them) and its rollouts' pass
        rates (under the current `version`) into `history`, then the per-version means and the step's figures."""
        for s in samples:
            if s.source == "user":
                h = history.setdefault(str(s.model_version), {"n": 0, "reward": 0.0, "accepted": 0})
                h["n"] += 1
                h["reward"] += s.reward
                h["accepted"] += int(s.reward > 0)
        if pass_rates:
            h = history.setdefault(str(version), {"n": 0, "reward": 0.0, "accepted": 0})
            h["rollout_tasks"] = h.get("rollout_tasks", 0) + len(pass_rates)
            h["rollout_pass"] = h.get("rollout_pass", 0.0) + sum(pass_rates)
        for v, h in history.items():
            if h["n"]:
                self.reward.labels(v).set(h["reward"] / h["n"])
                self.acceptance.labels(v).set(h["accepted"] / h["n"])
        self.kl.set(m["kl_per_token"])
        self.mismatch.set(m["logprob_mismatch_max"])
        self.step_time.observe(m["step_s"])
        self.tokens_per_s.set(m["tokens_per_s"])
        # A pass or step this update did not take keeps no stale value from one that did.
        for step, key in (("first", "grad_norm"), ("last", "grad_norm_last"), ("distill", "grad_norm_distill")):
            if key in m:
                self.grad_norm.labels(step).set(m[key])
                self._grad_steps.add(step)
            elif step in self._grad_steps:
                self.grad_norm.remove(step)
                self._grad_steps.discard(step)


def step_line(m: dict) -> str:
    """One update's log line (the metrics train_step returns)."""
    fmt, *args = (
        "step %d: %d user + %d rollout samples, %d tokens, %.0f tok/s, kl %.4f%s%s",
        m["step"],
        m["user"],
        m["rollout"],
        m["tokens"],
        m["tokens_per_s"],
        m["kl_per_token"],
        f", rollout pass {m['rollout_pass']:.2f}" if m["rollout_pass"] is not None else "",
        f", distilled {m['distill_tokens']} tokens under comments ({m['distill_samples']} fresh samples, "
        f"kl {m['distill_kl_per_token']:.3f})"
        if m.get("distill_tokens")
        else "",
    )
    return fmt % tuple(args)
