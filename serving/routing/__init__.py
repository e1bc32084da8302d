"""Which replica serves a user's request: routing policies behind one small interface.

The pool (serving.routing.pool) filters the candidates (healthy, active, not tried yet, the canary arm's);
a policy chooses among them and hears back about what happened:

    pick(candidates, request)                 -> the replica to try
    on_complete(replica, request, cached)      after it served (cached: the prompt tokens its prefix
                                              cache already held, as SGLang reports them; None: unknown)
    on_load_update(replica)                    after each health check of it, or its failure
    view()                                     what it decided and holds (GET /admin/replicas, /metrics)

A policy is one module here with one class, named in make_policy and in RoutingConfig.policy's choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from serving.config import RoutingConfig
    from serving.routing.pool import ReplicaHandle


@dataclass
class RouteRequest:
    """What a policy may look at: the prompt's token ids, who sent it, and the prefix-cache scope it is
    served in (the `cache_salt` the replica gets: a prefix is reused only within one scope; None: the scope of
    requests without one, such as rollouts)."""

    tokens: Sequence[int] = ()
    tenant: str | None = None
    scope: str | None = None
    memo: dict = field(default_factory=dict)  # per-request work a policy keeps between pick and on_complete


class RoutingPolicy(Protocol):
    name: str

    def pick(self, candidates: list[ReplicaHandle], req: RouteRequest) -> ReplicaHandle: ...

    def on_complete(self, replica: ReplicaHandle, req: RouteRequest, cached_tokens: int | None) -> None: ...

    def on_load_update(self, replica: ReplicaHandle) -> None: ...

    def view(self) -> dict: ...


def make_policy(cfg: RoutingConfig) -> RoutingPolicy:
    from serving.routing.cache_aware import CacheAware
    from serving.routing.least_outstanding import LeastOutstanding

    policies = {"least_outstanding": LeastOutstanding, "cache_aware": CacheAware}
    if cfg.policy not in policies:
        raise ValueError(f"unknown routing policy {cfg.policy!r}; one of {sorted(policies)}")
    return policies[cfg.policy](cfg)
