"""Canary trials: a new version reaches a slice of the fleet and of the users first, and is promoted or
rolled back on measured acceptance, latency and errors, without a person (`flywheel weights canary`).

    weights topic: {"type": "version", "canary": true}  (the trainer publishes with --canary)
      -> announce {"type": "canary", replicas}: those replicas' agents load the candidate, the others stay
      -> the gateway splits users by a hash of (version, tenant): `traffic_share` of them to the canary arm
      -> every `poll_s`: the arms' figures from `GET /admin/canary` -> judge()
      -> {"type": "promote"} (every agent loads it) or {"type": "rollback", "stable"} (canary replicas go back)
Every announcement is also a line in the store's activations (`flywheel weights list`). SREs override with
`flywheel weights promote N | abort N`; a trial still undecided after `max_trial_s` is rolled back.

When to promote or roll back is weight_sync.canary.judge.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from admin_api.client import AdminClient
from admin_api.types import CanaryTrial
from contracts import control
from contracts.events import TOPIC_WEIGHTS
from infra import kafka_auth
from infra.config import option
from infra.dead_letter import DeadLetters
from weight_sync.canary.judge import MonitorGuard, Verdict, default_guards, judge
from weight_sync.manifest import load_private
from weight_sync.publish import PublishConfig, activate

RETRY_TRIAL_S = 5.0  # a trial the gateway interrupted starts again this long after (times the attempts so far)
MAX_TRIAL_ATTEMPTS = 3  # then the candidate is rolled back: never served to everyone without a trial

log = logging.getLogger(__name__)


@dataclass
class CanaryConfig:
    gateway_url: str | None = option(None, flag="gateway", env="FLYWHEEL_GATEWAY_URL", help="the gateway's URL")
    admin_token: str | None = option(None, env="FLYWHEEL_ADMIN_TOKEN", cli=False, help="the admin credential")
    publish: PublishConfig = field(default_factory=PublishConfig)  # store, signing key, Kafka of the announcements
    replica_share: float = option(0.5, help="replicas given the candidate: at least one, never all (unless only one)")
    traffic_share: float = option(0.5, help="users routed to the canary arm")
    min_feedback: int = option(100, help="feedback events per arm before judging")
    min_requests: int = 50  # per arm, before latency and errors are judged
    margin: float = option(0.05, help="acceptance drop still promoted (below stable's, one-sided)")
    confidence: float = option(0.95, help="one-sided confidence of every judgement")
    p99_ratio: float = option(1.5, help="the canary's p99 latency over stable's that rolls back")
    error_margin: float = 0.01
    tool_min_answers: int = option(100, help="tool-call answers per arm before the malformed-call rate is judged")
    tool_margin: float = option(0.05, help="malformed-call rate above stable's that rolls back (with confidence)")
    max_tenant_share: float = option(0.5, help="of an arm's votes, the most one tenant's count for (1: no cap)")
    # the reward-hacking monitors' guards (monitor -> min count, margin; weight_sync.canary.judge)
    guards: dict[str, MonitorGuard] = field(default_factory=default_guards)
    max_trial_s: float = option(900.0, flag="max-trial", help="seconds before an undecided trial rolls back")
    poll_s: float = 2.0
    switch_timeout_s: float = 240.0


class CanaryController:
    def __init__(self, cfg: CanaryConfig):
        self.cfg = cfg
        self.admin = AdminClient(cfg.gateway_url, cfg.admin_token)  # the gateway's admin API
        self.decisions: list[dict] = []
        self._mine: set[int] = set()  # seq of the records this controller wrote
        self._public = load_private(cfg.publish.private_key).public_key()
        self._guard = control.ReplayGuard()  # the topic is read from its start at every start
        self.bad_records = 0
        self.registry = CollectorRegistry()  # flywheel_canary_bad_records_total{topic,reason}: refused records
        self.dead_letters = DeadLetters(self.registry, "flywheel_canary", "canary", cfg.publish.kafka_bootstrap)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None  # a KafkaConsumer while running (kafka-python has no types)
        self._pending: list[dict] = []  # records read while a trial looked for overrides, for the main loop
        self._attempts: dict[int, int] = {}  # candidate -> trials the gateway (or the topic) broke
        self._stable_of: dict[int, int] = {}  # candidate -> the stable version its trial compares against

    # ------------------------------------------------------------------ gateway
    def served(self) -> dict[str, int | None]:
        return self.admin.weights()["replicas"]

    def _announce(self, kind: str, version: int, reason: str, **extra) -> dict:
        record = activate(self.cfg.publish, version, reason, kind, **extra)
        self._mine.add(record["seq"])
        return record

    # ------------------------------------------------------------------ a trial
    def _wait_served(self, replicas: list[str], version: int) -> bool | dict:
        """True once the canary replicas serve `version`; an override record if one ends the trial first."""
        deadline = time.monotonic() + self.cfg.switch_timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            override = self._override(version)
            if override is not None:
                return override
            now = self.served()
            if all(now.get(r) == version for r in replicas):
                return True
            time.sleep(0.5)
        return False

    def trial(self, version: int) -> dict:
        """Run one version's trial to a decision; returns the decision record."""
        served = self.served()
        ids = sorted(served)
        # Never the candidate itself (a retried trial finds it on the canary replicas already): the version
        # most replicas serve, the newest of those on a tie.
        counts = [v for v in served.values() if v is not None and v != version]
        stable = self._stable_of.get(version)
        if stable is None:
            stable = max(set(counts), key=lambda v: (counts.count(v), v)) if counts else 0
            self._stable_of[version] = stable
        if len(ids) < 2:
            rec = self._announce("promote", version, "one replica: no stable arm to compare against", stable=stable)
            return self._decided(rec)
        n = max(1, min(len(ids) - 1, math.floor(self.cfg.replica_share * len(ids))))
        replicas = ids[-n:]
        self._announce(
            "canary",
            version,
            f"trial on {','.join(replicas)} for {self.cfg.traffic_share:.0%} of users",
            replicas=replicas,
            stable=stable,
            share=self.cfg.traffic_share,
        )
        loaded = self._wait_served(replicas, version)
        if isinstance(loaded, dict):
            log.info("v%d: %s by override (%s)", version, loaded["type"], loaded.get("reason"))
            return self._decided(loaded)
        if not loaded:
            return self._end(version, stable, Verdict("rollback", "the canary replicas did not load the version"))
        self.admin.start_canary(CanaryTrial(version=version, replicas=replicas, share=self.cfg.traffic_share))
        t0 = time.monotonic()
        while not self._stop.is_set():
            override = self._override(version)
            if override is not None:
                self._end_split()
                log.info("v%d: %s by override (%s)", version, override["type"], override.get("reason"))
                return self._decided(override)
            try:
                arms = (self.admin.canary()["canary"] or {}).get("arms")
            except (OSError, ValueError, KeyError, TypeError) as e:  # the gateway away a moment: judge later
                log.warning("v%d: no canary figures from the gateway (%s); asking again", version, e)
                arms = None
            verdict = judge(arms["canary"], arms["stable"], self.cfg) if arms else None
            if verdict is not None and verdict.decision != "extend":
                return self._end(version, stable, verdict, time.monotonic() - t0)
            if time.monotonic() - t0 > self.cfg.max_trial_s:  # also when the gateway never gave figures
                why = verdict.reason if verdict is not None else "no figures from the gateway"
                return self._end(
                    version,
                    stable,
                    Verdict(
                        "rollback",
                        f"undecided after {self.cfg.max_trial_s:.0f}s ({why}): the safe choice",
                        verdict.figures if verdict is not None else {},
                    ),
                    time.monotonic() - t0,
                )
            self._stop.wait(self.cfg.poll_s)
        return {}

    def _give_up(self, version: int, error: Exception) -> bool:
        """Roll back a candidate whose trial could not run MAX_TRIAL_ATTEMPTS times; False if even that
        announcement fails (the caller tries again later)."""
        stable = self._stable_of.get(version)
        why = f"the trial could not run {self._attempts[version]} times ({type(error).__name__}: {error})"
        try:
            rec = self._announce("rollback", version, why, **({} if stable is None else {"stable": stable}))
        except Exception as e:  # noqa: BLE001 - the broker or the store away too: retried like the trial
            log.error("v%d: could not announce its rollback (%s)", version, e)
            return False
        log.error("v%d rolled back: %s", version, why)
        self._decided(rec)
        return True

    def _end_split(self) -> None:
        try:
            self.admin.end_canary()
        except (OSError, ValueError) as e:  # urllib's errors are OSErrors; a body that is not JSON
            log.warning("could not end the gateway's canary split: %s", e)

    def _end(self, version: int, stable: int, verdict: Verdict, elapsed: float = 0.0) -> dict:
        self._end_split()
        rec = self._announce(
            verdict.decision, version, verdict.reason, stable=stable, figures=verdict.figures, trial_s=round(elapsed, 1)
        )
        log.info("v%d %s: %s", version, verdict.decision, verdict.reason)
        return self._decided(rec)

    def _decided(self, rec: dict) -> dict:
        self.decisions.append(rec)
        return rec

    # ------------------------------------------------------------------ the topic
    def _records(self) -> list[dict]:
        from kafka.errors import KafkaError

        out: list[dict] = []
        try:
            batch = self._consumer.poll(timeout_ms=200)
        except KafkaError as e:  # the broker away: nothing read this time, the caller polls again
            log.warning("cannot read the weights topic (%s); retrying", e)
            time.sleep(1.0)
            return out
        for recs in batch.values():
            for r in recs:
                try:
                    out.append(self._guard.check(control.decode(r.value, self._public)))
                except Exception as e:  # not ours, not well-formed, or a replay (ControlError): never acted on
                    self.bad_records += 1
                    log.error("ignoring weights record at offset %d: %s", r.offset, e)
                    self.dead_letters.refuse(TOPIC_WEIGHTS, r.value, e, r)
        return out

    def _override(self, version: int) -> dict | None:
        """An SRE's promote or rollback of `version`, if one was read; every other record read meanwhile,
        before or after it, is kept for the main loop (a candidate announced in the same batch is trialled next)."""
        found = None
        for rec in self._records():
            if (
                found is None
                and rec.get("type") in ("promote", "rollback")
                and rec.get("version") == version
                and rec.get("seq") not in self._mine
            ):
                found = rec
            else:
                self._pending.append(rec)
        return found

    def _open(self):
        """The whole weights topic from its start, by assignment (no group: a rebalance racing the topic's
        creation once left the controller with no partitions). Decisions already on the topic are known,
        so a restarted controller only trials the candidates still undecided."""
        from kafka import KafkaConsumer, TopicPartition

        from infra.kafka_admin import RECONNECT_BACKOFF_MAX_MS

        c = KafkaConsumer(
            bootstrap_servers=self.cfg.publish.kafka_bootstrap,
            **kafka_auth.client_config(),
            enable_auto_commit=False,
            client_id="flywheel-canary",
            reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
        )
        deadline = time.monotonic() + 60
        parts = c.partitions_for_topic(TOPIC_WEIGHTS)
        while not parts and time.monotonic() < deadline and not self._stop.is_set():
            c.topics()
            time.sleep(0.5)
            parts = c.partitions_for_topic(TOPIC_WEIGHTS)
        if not parts:
            c.close()
            raise RuntimeError(f"no {TOPIC_WEIGHTS} topic on {self.cfg.publish.kafka_bootstrap}")
        tps = [TopicPartition(TOPIC_WEIGHTS, p) for p in sorted(parts)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        return c

    def run(self) -> None:
        from kafka.errors import KafkaError

        self._consumer = self._open()
        decided = {d["version"] for d in self.decisions}
        try:
            while not self._stop.is_set():
                records, self._pending = self._pending + self._records(), []
                for rec in records:
                    if rec.get("type") in ("promote", "rollback"):
                        decided.add(rec.get("version"))
                for i, rec in enumerate(records):
                    v = rec.get("version")
                    if rec.get("type") == "version" and rec.get("canary") and isinstance(v, int) and v not in decided:
                        log.info("v%d: canary trial starts", v)
                        try:
                            self.trial(v)
                        except (OSError, ValueError, KeyError, TypeError, KafkaError) as e:
                            # The gateway (or the broker) failed, or the version is gone: the controller lives
                            # on, the split ends, and the trial starts again, a few times, then is rolled back.
                            self._end_split()
                            n = self._attempts[v] = self._attempts.get(v, 0) + 1
                            if n >= MAX_TRIAL_ATTEMPTS and self._give_up(v, e):
                                decided.add(v)
                                continue
                            log.error("v%d: trial %d interrupted (%s: %s); trying again", v, n, type(e).__name__, e)
                            self._pending = records[i:] + self._pending  # this one and the rest, in order
                            self._stop.wait(RETRY_TRIAL_S * n)
                            break
                        decided.add(v)
                        if self._stop.is_set():
                            break
        finally:
            self._consumer.close()
            self.dead_letters.close()

    def start(self) -> "CanaryController":
        self._thread = threading.Thread(target=self.run, name="canary", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
