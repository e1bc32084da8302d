"""The routing policy's interface: what a policy may look at (RouteRequest) and what it answers (RoutingPolicy).
The policy a configuration names is made by the pool (serving.routing.pool.make_policy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from serving.routing.replica import ReplicaHandle


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
