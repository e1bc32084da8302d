"""The admin API's tokens, one per capability (DESIGN, Trust boundaries): a process holds only the part it
needs, so a leaked weight agent's token cannot change tenants' privacy, nor a dashboard's move replicas.

    status    read the fleet: GET /admin/replicas, /weights, /load, /canary   (flywheel status, observe)
    weights   move replicas and versions: drain, undrain, activate, borrow, return, the canary split,
              rollouts (and read what it moves)                               (weight agents, canary, trainer)
    tenants   tenants' policies and forgetting: /admin/tenants (read and write: key ids are theirs)
                                                                              (flywheel tenants)

FLYWHEEL_ADMIN_TOKEN, the operator's token, holds all three. Each part comes from its own environment
variable (never a flag). A client presents whichever token it holds as the bearer, as before.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

from admin_api import routes

CAPABILITIES = (routes.STATUS, routes.WEIGHTS, routes.TENANTS)
ENV = {
    "all": "FLYWHEEL_ADMIN_TOKEN",
    "status": "FLYWHEEL_ADMIN_TOKEN_STATUS",
    "weights": "FLYWHEEL_ADMIN_TOKEN_WEIGHTS",
    "tenants": "FLYWHEEL_ADMIN_TOKEN_TENANTS",
}


def _digest(token: str) -> bytes:
    """What tokens are compared by: equal lengths (the compare says nothing of a token's length), and any
    header aiohttp decoded (a non-UTF-8 one carries surrogates) is bytes again, never an exception."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def needed(method: str, path: str) -> str:
    """The capability a request on the admin API needs (path as the admin app sees it, /admin/...): the one its
    route declares (admin_api.routes); for a path no route declares (answered 404), the rule they all follow."""
    route = routes.declared(method, path)
    if route is not None:
        return route.capability
    tail = path.removeprefix(routes.PREFIX)
    if tail == "/tenants" or tail.startswith("/tenants/"):
        return "tenants"
    return "status" if method in ("GET", "HEAD") else "weights"


@dataclass(frozen=True, repr=False)
class AdminTokens:
    """The gateway's view: which presented token grants which capability."""

    all: str | None = None
    status: str | None = None
    weights: str | None = None
    tenants: str | None = None

    @classmethod
    def from_env(cls, all_token: str | None = None) -> AdminTokens:
        """The parts from the environment; `all_token` (the gateway's admin_token option) when given."""
        return cls(
            all=all_token if all_token is not None else os.environ.get(ENV["all"]) or None,
            **{cap: os.environ.get(ENV[cap]) or None for cap in CAPABILITIES},
        )

    def grants(self, presented: str | None, capability: str) -> bool:
        """Constant-time against each token that could grant it: the operator's, the capability's own, and
        for reading, the writers' (an agent reads the replicas it drains)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}")
        holders = [self.all, getattr(self, capability)]
        if capability == "status":
            holders.append(self.weights)
        ok = False
        for token in holders:  # no early exit: the time taken does not say which token matched
            ok |= bool(presented and token and hmac.compare_digest(_digest(presented), _digest(token)))
        return ok

    @property
    def any(self) -> bool:
        return any((self.all, self.status, self.weights, self.tenants))
