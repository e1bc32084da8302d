"""The bodies that cross the admin API (admin_api.routes), as both ends read them: what clients send and the answers
they read. The gateway checks what it receives with its own schemas (serving.api.admin, serving.api.tenants);
these name the fields for the clients and for the reader. Keys absent from a `total=False` shape may be left out.
"""

from __future__ import annotations

from typing import Literal, TypedDict

# ---------------------------------------------------------------- replicas


class DrainBody(TypedDict):
    """POST /admin/replicas/{replica}/drain by a weight agent: its lease, renewed while it switches (an
    operator's drain sends {} and holds the replica until they undo it)."""

    lease_s: float


class ReplicaView(TypedDict):
    """One replica as the gateway sees it (GET /admin/replicas, /admin/load; the answer to an action)."""

    id: str
    url: str
    state: Literal["active", "draining", "borrowed"]
    healthy: bool
    outstanding: int
    rollout_outstanding: int
    weight_version: int | None
    served: int
    failures: int
    last_error: str | None
    request_rate: float
    queue_depth: int
    running: int
    kv_capacity_tokens: int | None
    borrow_pending: bool
    drain_lease_s: float | None  # None: no lease (an operator's drain, or not draining)


class ReplicasAnswer(TypedDict):
    replicas: list[ReplicaView]
    routing: dict  # the routing policy's view (serving.routing.policy)


class FleetLoad(TypedDict):
    replicas: int
    active: int
    borrowed: int
    borrow_pending: int
    in_flight: int
    queue_depth: int
    request_rate: float
    load_per_active: float


class LoadAnswer(TypedDict):
    replicas: list[ReplicaView]
    fleet: FleetLoad


class WeightsAnswer(TypedDict):
    replicas: dict[str, int | None]  # replica id -> the version it serves
    tool_calls: dict  # per version: tool-call outcomes and the reward-hacking monitors (serving.monitors)


# ---------------------------------------------------------------- rollouts


class RolloutRequest(TypedDict, total=False):
    """POST /admin/rollouts: a completions body (prompt, n, sampling) plus where it may run."""

    prompt: str
    n: int
    max_tokens: int
    min_tokens: int
    temperature: float
    replicas: Literal["any", "borrowed"]


class RolloutChoice(TypedDict):
    index: int
    text: str
    output_ids: list[int]
    logprobs: list[float]
    routed_experts: str  # base64 of uint8 expert ids, shape routed_experts_shape
    routed_experts_shape: list[int]
    weight_version: int | None
    finish_reason: str  # "abort": the replica went back to users mid-rollout
    replica: str


class RolloutAnswer(TypedDict):
    id: str
    prompt_ids: list[int]
    choices: list[RolloutChoice]


# ---------------------------------------------------------------- canary


class CanaryTrial(TypedDict):
    """PUT /admin/canary: that share of users goes to those replicas, which serve `version`."""

    version: int
    replicas: list[str]
    share: float


# Reward-hacking monitors (serving.signals.hacking): each counted per version and per canary arm, as a share of
# its base. An arm's figures carry them under "monitors" (with "repeated": answers with a call repeating an earlier
# one of the session, of tool_answers), and the canary rolls back a confident excess (weight_sync.canary.judge).
HACK_MONITORS = ("failed_call", "clarifying", "test_edit", "early_stop", "truncated")
MONITOR_BASE = {
    "failed_call": "tool_results",  # tool results read back for the arm's (version's) calls
    "clarifying": "agent_answers",  # answers to requests that offered tools
    "test_edit": "agent_answers",
    "early_stop": "all_answers",
    "truncated": "all_answers",
}


class MonitorCount(TypedDict):
    count: int  # flagged
    of: int  # the base it is a share of


class AnswerLength(TypedDict):
    answers: int
    tokens: int  # their sum
    tokens_sq: int  # the sum of squares (the guard's variance)


class ArmFigures(TypedDict, total=False):
    """One arm of a trial (GET /admin/canary "arms"; serving.canary_split.ArmStats.view)."""

    requests: int
    errors: int
    accepts: int
    rejects: int
    feedback: int
    acceptance: float | None
    p50_ms: float | None
    p99_ms: float | None
    tool_answers: int
    tool_malformed: int
    tool_repeated: int
    malformed_rate: float | None
    monitors: dict[str, MonitorCount]  # HACK_MONITORS and "repeated"
    length: AnswerLength
    implicit: dict[str, int]
    tenant_votes: list[list[int]]


class CanaryAnswer(TypedDict):
    canary: dict | None  # the split's view (serving.canary_split), each arm's figures (ArmFigures) under "arms"


# ---------------------------------------------------------------- tenants


class PolicyChange(TypedDict, total=False):
    """PUT /admin/tenants/{name}."""

    train: Literal["allow", "deny"]
    retention_days: float  # 0: no limit


class ForgetRequest(TypedDict, total=False):
    """POST /admin/tenants/{name}/forget; train "deny" also stops training on what comes next."""

    train: Literal["deny"]


class TenantPolicy(TypedDict):
    train: Literal["allow", "deny"]
    retention_days: float | None
    forgotten_before: float | None


class TenantView(TypedDict):
    name: str
    ids: list[str]  # its key ids
    policy: TenantPolicy
    limited: dict[str, int]  # requests refused by its limits on this gateway, by limit


class TenantsAnswer(TypedDict):
    tenants: list[TenantView]


class ForgetAnswer(TenantView):
    forgotten_before: float  # every event of the tenant up to this time is forgotten
