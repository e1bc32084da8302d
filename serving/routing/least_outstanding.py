"""Least outstanding requests: the replica with the fewest user requests in flight; ties rotate."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from serving.config import RoutingConfig
    from serving.routing.policy import RouteRequest
    from serving.routing.replica import ReplicaHandle


def outstanding(r: ReplicaHandle) -> int:
    """A replica's load as user routing sees it: its user requests in flight."""
    return r.outstanding


def least_loaded(candidates: list[ReplicaHandle], load: Callable[[ReplicaHandle], int], turn: int) -> ReplicaHandle:
    low = min(load(r) for r in candidates)
    best = [r for r in candidates if load(r) == low]
    return best[turn % len(best)]


class LeastOutstanding:
    name = "least_outstanding"

    def __init__(self, cfg: RoutingConfig | None = None, load: Callable[[ReplicaHandle], int] | None = None):
        self.load = load or outstanding
        self._turn = itertools.count()

    def pick(self, candidates: list[ReplicaHandle], req: RouteRequest | None = None) -> ReplicaHandle:
        return least_loaded(candidates, self.load, next(self._turn))

    def on_complete(self, replica: ReplicaHandle, req: RouteRequest, cached_tokens: int | None) -> None:
        pass

    def on_load_update(self, replica: ReplicaHandle) -> None:
        pass

    def view(self) -> dict:
        return {"policy": self.name}
