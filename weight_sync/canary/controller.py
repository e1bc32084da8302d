"""Canary trials: a new version reaches a slice of the fleet and of the users first, and is promoted or
rolled back on measured acceptance, latency and errors, without a person (`flywheel weights canary`).

    weights topic: {"type": "version", "canary": true}  (the trainer publishes with --canary)
      -> announce {"type": "canary", replicas}: those replicas' agents load the candidate, the others stay
      -> the gateway splits users by a hash of (version, tenant): `traffic_share` of them to the canary arm
      -> every `poll_s`: the arms' figures from `GET /admin/canary` -> judge()
      -> {"type": "promote"} (every agent loads it) or {"type": "rollback", "stable"} (canary replicas go back)
Every announcement is also a line in the store's activations (`flywheel weights list`). SREs override with
`flywheel weights promote N | abort N`; a trial still undecided after `max_trial_s` is rolled back.

judge(): acceptance is compared with a one-sided normal-approximation bound on the difference of two
proportions (canary minus stable, unpooled standard error, `confidence` one-sided): promote when the lower
bound is above -margin (not worse beyond the margin), roll back when the upper bound is below -margin
(worse beyond it, with confidence); otherwise wait for more feedback. Before that, with enough requests,
a canary p99 above `p99_ratio` x stable's, or an error rate above stable's + `error_margin`, rolls back;
and with `tool_min_answers` tool-call answers per arm, a guard on reward hacking in tool use: the
malformed-call rate (answers whose call is malformed or names a tool not offered, over answers with a
call) is compared the same way as acceptance, higher being worse: the one-sided lower bound of canary
minus stable above `tool_margin` (worse beyond it, with confidence) rolls back. The guard only ever rolls
back: with too few tool answers, or no confident excess, acceptance decides alone (a fleet with little
tool traffic is not held up waiting for it).

No tenant decides a trial alone: an arm's votes are counted with each tenant's (all its keys are one voter)
scaled down to a common level, the highest at which no tenant counts for more than `max_tenant_share` of the
arm's counted votes (capped_votes). The gateway reports each voter's votes without names. With the default,
one half, an arm needs two tenants voting before any vote counts, and a tenant that votes a thousand times
beside one that votes ten times counts as ten.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from prometheus_client import CollectorRegistry

from admin_api.client import admin_call
from contracts import control
from contracts.events import TOPIC_WEIGHTS
from infra import kafka_auth
from infra.dead_letter import DeadLetters
from weight_sync.canary.votes import capped
from weight_sync.manifest import load_private
from weight_sync.publish import PublishConfig, activate

RETRY_TRIAL_S = 5.0  # a trial the gateway interrupted starts again this long after (times the attempts so far)
MAX_TRIAL_ATTEMPTS = 3  # then the candidate is rolled back: never served to everyone without a trial

log = logging.getLogger(__name__)


@dataclass
class CanaryConfig:
    gateway_url: str
    admin_token: str
    publish: PublishConfig  # store, signing key and Kafka bootstrap of the announcements
    replica_share: float = 0.5  # replicas given the candidate: at least one, never all (unless only one)
    traffic_share: float = 0.5  # users routed to the canary arm
    min_feedback: int = 100  # per arm, before acceptance is judged
    min_requests: int = 50  # per arm, before latency and errors are judged
    margin: float = 0.05  # acceptance may be this much lower than stable's and still promote
    confidence: float = 0.95  # one-sided
    p99_ratio: float = 1.5
    error_margin: float = 0.01
    tool_min_answers: int = 100  # tool-call answers per arm, before the malformed-call rate is judged
    tool_margin: float = 0.05  # the canary's malformed-call rate may exceed stable's by this much (with confidence)
    max_tenant_share: float = 0.5  # of an arm's counted votes, the most one tenant's count for (1: no cap)
    max_trial_s: float = 900.0
    poll_s: float = 2.0
    switch_timeout_s: float = 240.0


@dataclass
class Verdict:
    decision: str  # promote | rollback | extend
    reason: str
    figures: dict = field(default_factory=dict)


def _diff_bound(x_c: int, n_c: int, x_s: int, n_s: int, confidence: float) -> tuple[float, float, float]:
    """(difference of the proportions canary - stable, lower and upper one-sided `confidence` bounds):
    normal approximation, unpooled standard error."""
    p_c, p_s = x_c / n_c, x_s / n_s
    diff = p_c - p_s
    se = math.sqrt(p_c * (1 - p_c) / n_c + p_s * (1 - p_s) / n_s) or 1e-9
    z = NormalDist().inv_cdf(confidence)
    return diff, diff - z * se, diff + z * se


FIGURES = (
    "requests",
    "errors",
    "feedback",
    "feedback_cast",
    "tenants_voting",
    "acceptance",
    "p99_ms",
    "tool_answers",
    "tool_malformed",
    "malformed_rate",
)


def judge(canary: dict, stable: dict, cfg: CanaryConfig) -> Verdict:
    """The decision on the two arms' figures (GET /admin/canary "arms" entries)."""
    canary, stable = capped(canary, cfg.max_tenant_share), capped(stable, cfg.max_tenant_share)
    figures: dict[str, object] = {
        "canary": {k: canary.get(k) for k in FIGURES},
        "stable": {k: stable.get(k) for k in FIGURES},
    }
    if canary["requests"] >= cfg.min_requests and stable["requests"] >= cfg.min_requests:
        err_c = canary["errors"] / max(1, canary["requests"] + canary["errors"])
        err_s = stable["errors"] / max(1, stable["requests"] + stable["errors"])
        figures.update(error_rate_canary=round(err_c, 4), error_rate_stable=round(err_s, 4))
        if err_c > err_s + cfg.error_margin:
            return Verdict("rollback", f"error rate {err_c:.1%} vs stable {err_s:.1%}", figures)
        if canary["p99_ms"] and stable["p99_ms"] and canary["p99_ms"] > cfg.p99_ratio * stable["p99_ms"]:
            return Verdict(
                "rollback",
                f"p99 {canary['p99_ms']:.0f} ms vs stable {stable['p99_ms']:.0f} ms (> {cfg.p99_ratio}x)",
                figures,
            )
    # A gateway older than the tool counts reports none: the guard then has no say.
    t_c, t_s = canary.get("tool_answers") or 0, stable.get("tool_answers") or 0
    if t_c >= cfg.tool_min_answers and t_s >= cfg.tool_min_answers:
        m_c, m_s = canary["tool_malformed"] / t_c, stable["tool_malformed"] / t_s
        diff, lo, _ = _diff_bound(canary["tool_malformed"], t_c, stable["tool_malformed"], t_s, cfg.confidence)
        figures.update(
            malformed_rate_canary=round(m_c, 4),
            malformed_rate_stable=round(m_s, 4),
            malformed_diff=round(diff, 4),
            malformed_diff_lower=round(lo, 4),
        )
        if lo > cfg.tool_margin:
            return Verdict(
                "rollback",
                f"malformed tool calls {m_c:.1%} vs stable {m_s:.1%}: worse by more than "
                f"{cfg.tool_margin:.0%} ({cfg.confidence:.0%} bound {lo:+.3f})",
                figures,
            )
    n_c, n_s = canary["feedback"], stable["feedback"]
    if n_c < cfg.min_feedback or n_s < cfg.min_feedback:
        return Verdict(
            "extend",
            f"waiting for feedback ({n_c:g} canary, {n_s:g} stable counted; need {cfg.min_feedback} each)",
            figures,
        )
    p_c, p_s = canary["accepts"] / n_c, stable["accepts"] / n_s
    diff, lo, hi = _diff_bound(canary["accepts"], n_c, stable["accepts"], n_s, cfg.confidence)
    figures.update(acceptance_diff=round(diff, 4), diff_lower=round(lo, 4), diff_upper=round(hi, 4))
    if hi < -cfg.margin:
        return Verdict(
            "rollback",
            f"acceptance {p_c:.1%} vs stable {p_s:.1%}: worse by more than "
            f"{cfg.margin:.0%} ({cfg.confidence:.0%} bound {hi:+.3f})",
            figures,
        )
    if lo > -cfg.margin:
        return Verdict(
            "promote",
            f"acceptance {p_c:.1%} vs stable {p_s:.1%}: not worse than {cfg.margin:.0%} "
            f"({cfg.confidence:.0%} bound {lo:+.3f})",
            figures,
        )
    return Verdict("extend", f"undecided: difference {diff:+.3f} in [{lo:+.3f}, {hi:+.3f}]", figures)


class CanaryController:
    def __init__(self, cfg: CanaryConfig):
        self.cfg = cfg
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
    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        return admin_call(self.cfg.gateway_url, self.cfg.admin_token, method, path, body)

    def served(self) -> dict[str, int | None]:
        return self._call("GET", "/admin/weights")["replicas"]

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
        self._call("PUT", "/admin/canary", {"version": version, "replicas": replicas, "share": self.cfg.traffic_share})
        t0 = time.monotonic()
        while not self._stop.is_set():
            override = self._override(version)
            if override is not None:
                self._end_split()
                log.info("v%d: %s by override (%s)", version, override["type"], override.get("reason"))
                return self._decided(override)
            try:
                arms = (self._call("GET", "/admin/canary")["canary"] or {}).get("arms")
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
            self._call("DELETE", "/admin/canary")
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
