"""The one client of a gateway's admin API (bearer token, JSON in and out), with a method per route of
admin_api.routes, for every caller: the off-peak scheduler and the trainer's rollouts, the canary controller,
the weight agents, the fleet, status, observe and tenants commands, the local fleet, load tests and benchmarks.

Two faces over the same routes:
- `AdminClient` (urllib, blocking): a 4xx/5xx raises urllib.error.HTTPError (its body is the gateway's JSON
  error), an unreachable gateway urllib.error.URLError (both OSErrors).
- `AsyncAdminClient` (aiohttp, over the caller's session; for the weight agent's switch): answers every call
  with (status, body), the body {"text": ...} when it is not JSON, so that refusals (409 last_active,
  held_by_operator; 404 not_found) are read, not caught; network errors raise as aiohttp's.
"""

from __future__ import annotations

import json
import urllib.request
from typing import TYPE_CHECKING, cast

from admin_api import routes
from admin_api.types import (
    CanaryAnswer,
    CanaryTrial,
    DrainBody,
    ForgetAnswer,
    ForgetRequest,
    LoadAnswer,
    PolicyChange,
    ReplicasAnswer,
    ReplicaView,
    RolloutAnswer,
    RolloutRequest,
    TenantsAnswer,
    TenantView,
    WeightsAnswer,
)

if TYPE_CHECKING:
    import aiohttp

TIMEOUT_S = 10.0  # one admin call; one cut off must not hold its caller (a switch, a status page) for minutes


def _body(method: str, body: dict | None) -> dict | None:
    """What goes out: a POST or PUT always carries an object (the gateway parses {} as no fields)."""
    return body if body is not None else ({} if method in ("POST", "PUT") else None)


class AdminClient:
    """One gateway's admin API, blocking (urllib)."""

    def __init__(self, base_url: str | None, token: str | None, timeout: float = TIMEOUT_S):
        # Either may be unset in a configuration that never calls the gateway: a call then says which is missing.
        self.base_url, self.token, self.timeout = (base_url or "").rstrip("/"), token, timeout

    def call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        """One call (path from admin_api.routes). Raises urllib.error.HTTPError on a 4xx/5xx."""
        if not self.base_url or not self.token:
            raise ValueError("the gateway's admin API needs its URL and an admin token (FLYWHEEL_ADMIN_TOKEN)")
        out = _body(method, body)
        req = urllib.request.Request(
            f"{self.base_url}{path}",
            method=method,
            data=None if out is None else json.dumps(out).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=self.timeout if timeout is None else timeout) as r:
            return json.loads(r.read())

    # ------------------------------------------------------------ replicas
    def replicas(self) -> ReplicasAnswer:
        return cast(ReplicasAnswer, self.call("GET", routes.LIST_REPLICAS.path))

    def load(self) -> LoadAnswer:
        return cast(LoadAnswer, self.call("GET", routes.GET_LOAD.path))

    def weights(self) -> WeightsAnswer:
        return cast(WeightsAnswer, self.call("GET", routes.GET_WEIGHTS.path))

    def replica_action(self, replica: str, action: str, body: DrainBody | None = None) -> ReplicaView:
        """drain | undrain | activate | borrow | return (routes.REPLICA_ACTIONS); a drain with no body is an
        operator's (no lease)."""
        return cast(ReplicaView, self.call("POST", routes.replica_action(replica, action), cast(dict, body)))

    # ------------------------------------------------------------ rollouts and canary
    def rollouts(self, body: RolloutRequest, timeout: float | None = None) -> RolloutAnswer:
        return cast(RolloutAnswer, self.call("POST", routes.ROLLOUTS.path, cast(dict, body), timeout))

    def canary(self) -> CanaryAnswer:
        return cast(CanaryAnswer, self.call("GET", routes.GET_CANARY.path))

    def start_canary(self, trial: CanaryTrial) -> CanaryAnswer:
        return cast(CanaryAnswer, self.call("PUT", routes.START_CANARY.path, cast(dict, trial)))

    def end_canary(self) -> CanaryAnswer:
        return cast(CanaryAnswer, self.call("DELETE", routes.END_CANARY.path))

    # ------------------------------------------------------------ tenants
    def tenants(self) -> TenantsAnswer:
        return cast(TenantsAnswer, self.call("GET", routes.LIST_TENANTS.path))

    def tenant(self, name: str) -> TenantView:
        return cast(TenantView, self.call("GET", routes.tenant(name)))

    def set_policy(self, name: str, change: PolicyChange) -> TenantView:
        return cast(TenantView, self.call("PUT", routes.SET_POLICY.url(name=name), cast(dict, change)))

    def forget(self, name: str, body: ForgetRequest | None = None) -> ForgetAnswer:
        return cast(ForgetAnswer, self.call("POST", routes.forget(name), cast(dict, body)))


class AsyncAdminClient:
    """One gateway's admin API over an aiohttp session the caller owns; answers (status, body), never raises on
    a status."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, token: str, timeout: float = TIMEOUT_S):
        self.session, self.base_url, self.token, self.timeout = session, base_url.rstrip("/"), token, timeout

    async def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        import aiohttp

        async with self.session.request(
            method,
            f"{self.base_url}{path}",
            json=_body(method, body),
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=aiohttp.ClientTimeout(total=self.timeout),
        ) as r:
            try:
                data = await r.json(content_type=None)
            except ValueError:
                data = {"text": await r.text()}
            return r.status, data or {}

    async def replicas(self) -> tuple[int, ReplicasAnswer]:
        status, data = await self.call("GET", routes.LIST_REPLICAS.path)
        return status, cast(ReplicasAnswer, data)

    async def replica_action(self, replica: str, action: str, body: DrainBody | None = None) -> tuple[int, dict]:
        """The replica's view on a 200; the gateway's error ({"error": {"code", "message", ...}}) otherwise."""
        return await self.call("POST", routes.replica_action(replica, action), cast(dict, body))
