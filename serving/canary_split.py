"""The gateway's side of a canary trial: which users go to the canary replicas, and what each arm saw.

A trial names a version, the replicas serving it and the share of users sent there. Users are split by a
hash of (version, tenant), so a user stays on one arm for the whole trial and a new trial reshuffles. Each
arm counts requests, errors, latency, the feedback its completions got (a completion id is remembered
with its arm until the feedback window closes) and its tool-call answers (those malformed: a call the
model got wrong or to a tool not offered; those repeating a call of the session) and what the reward-hacking
monitors flagged in its answers (serving.signals.hacking: per monitor, flagged and its base); the canary controller
(weight_sync.canary.controller) reads these through `GET /admin/canary` and decides.
"""

from __future__ import annotations

import collections
import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from admin_api.types import MONITOR_BASE

ARMS = ("canary", "stable")


@dataclass
class ArmStats:
    requests: int = 0
    errors: int = 0
    accepts: int = 0
    rejects: int = 0
    latencies_ms: collections.deque = field(default_factory=lambda: collections.deque(maxlen=20_000))
    tool_answers: int = 0  # answers (choices) with a tool call in them, well formed or not
    tool_malformed: int = 0  # of those, malformed or calling an unknown tool (returned as text)
    tool_repeated: int = 0  # of those, answers with a call repeating an earlier one of the session
    # reward-hacking monitors (serving.signals.hacking): flagged counts and their bases (admin_api.types.MONITOR_BASE)
    monitors: collections.Counter = field(default_factory=collections.Counter)
    tokens: int = 0  # of all answers (mean length and its variance: the length guard)
    tokens_sq: int = 0
    signals: collections.Counter = field(default_factory=collections.Counter)  # implicit verdicts, by signal
    votes: dict = field(default_factory=dict)  # tenant name -> [accepts, rejects] (the controller caps each's say)

    def view(self) -> dict:
        lat = np.asarray(self.latencies_ms)
        judged = self.accepts + self.rejects
        return {
            "requests": self.requests,
            "errors": self.errors,
            "accepts": self.accepts,
            "rejects": self.rejects,
            "feedback": judged,
            "acceptance": self.accepts / judged if judged else None,
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
            "tool_answers": self.tool_answers,
            "tool_malformed": self.tool_malformed,
            "tool_repeated": self.tool_repeated,
            "malformed_rate": self.tool_malformed / self.tool_answers if self.tool_answers else None,
            "monitors": {
                **{
                    name: {"count": self.monitors[name], "of": self.monitors[base]}
                    for name, base in MONITOR_BASE.items()
                },
                "repeated": {"count": self.tool_repeated, "of": self.tool_answers},
            },
            "length": {"answers": self.monitors["all_answers"], "tokens": self.tokens, "tokens_sq": self.tokens_sq},
            "implicit": dict(self.signals),
            # Each voting tenant's [accepts, rejects], largest first, without names: weight_sync.canary.controller caps
            # the
            # share of an arm's feedback one tenant's votes count for (its max_tenant_share).
            "tenant_votes": sorted(self.votes.values(), key=lambda v: (-sum(v), v)),
        }


@dataclass
class CanarySplit:
    version: int
    replicas: frozenset[str]
    share: float  # of users (tenants) routed to the canary replicas
    started: float = field(default_factory=time.time)
    stats: dict[str, ArmStats] = field(default_factory=lambda: {a: ArmStats() for a in ARMS})
    issued: collections.OrderedDict = field(default_factory=collections.OrderedDict)  # completion id -> arm
    max_issued: int = 200_000

    def __post_init__(self):
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"canary share must be between 0 and 1 (exclusive), got {self.share}")
        if not self.replicas:
            raise ValueError("a canary needs at least one replica")

    def arm_of(self, tenant: str) -> str:
        h = int.from_bytes(hashlib.sha256(f"{self.version}/{tenant}".encode()).digest()[:8], "big")
        return "canary" if h / 2**64 < self.share else "stable"

    def arm_of_replica(self, replica_id: str) -> str:
        return "canary" if replica_id in self.replicas else "stable"

    def served(self, completion_id: str, replica_id: str, latency_ms: float) -> str:
        arm = self.arm_of_replica(replica_id)
        s = self.stats[arm]
        s.requests += 1
        s.latencies_ms.append(latency_ms)
        self.issued[completion_id] = arm
        while len(self.issued) > self.max_issued:
            self.issued.popitem(last=False)
        return arm

    def tool_answer(self, replica_id: str, malformed: bool, repeated: bool) -> None:
        """An answer with a tool call in it (serving.protocol.tool_calls.parse outcome other than none)."""
        s = self.stats[self.arm_of_replica(replica_id)]
        s.tool_answers += 1
        s.tool_malformed += malformed
        s.tool_repeated += repeated

    def answer(self, replica_id: str, agent: bool, flags: dict[str, bool], tokens: int) -> None:
        """Any answer of the trial: `agent` when tools were offered; flags: monitor -> flagged."""
        s = self.stats[self.arm_of_replica(replica_id)]
        s.monitors["all_answers"] += 1
        s.monitors["agent_answers"] += agent
        s.monitors.update({name: int(hit) for name, hit in flags.items()})
        s.tokens += tokens
        s.tokens_sq += tokens * tokens

    def tool_result(self, arm: str, failed: bool) -> None:
        """The result of a call an answer of `arm` made (the arm it was made on, remembered by serving.monitors)."""
        s = self.stats[arm]
        s.monitors["tool_results"] += 1
        s.monitors["failed_call"] += failed

    def failed(self, tenant: str) -> None:
        self.stats[self.arm_of(tenant)].errors += 1

    def feedback(self, completion_id: str, kind: str, tenant: str = "") -> None:
        """A vote on a completion of the trial; tenant: the voter's name (all its keys are one voter)."""
        arm = self.issued.get(completion_id)
        if arm is None or kind not in ("accept", "reject"):
            return  # issued before the trial, or forgotten: it says nothing about either arm
        s = self.stats[arm]
        if kind == "accept":
            s.accepts += 1
        else:
            s.rejects += 1
        s.votes.setdefault(tenant, [0, 0])[kind == "reject"] += 1

    def signal(self, completion_id: str, name: str) -> None:
        """A verdict read from an agent session (serving.signals.implicit) on a completion of the trial."""
        arm = self.issued.get(completion_id)
        if arm is not None:
            self.stats[arm].signals[name] += 1

    def view(self) -> dict:
        return {
            "version": self.version,
            "replicas": sorted(self.replicas),
            "share": self.share,
            "started": self.started,
            "arms": {a: s.view() for a, s in self.stats.items()},
        }
