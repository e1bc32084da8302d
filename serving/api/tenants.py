"""Tenants' privacy policies on the admin API (`/admin/tenants`, admin token):

    GET  /admin/tenants                 every tenant: its key ids, policy and requests refused by its limits here
    GET  /admin/tenants/{name}
    PUT  /admin/tenants/{name}          {"train": "allow"|"deny", "retention_days": N (0: none)}
    POST /admin/tenants/{name}/forget   {"train": "deny" (optional: also stop training on what comes next)}

A change is written to the keys file (serving.auth.set_policy, the one source every gateway on the host
reads) and is in effect when the answer comes (serving.tenants.policy): a forget has been applied to this
gateway's spool and its records are on disk for the tenants topic.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from admin_api import routes
from serving.api.respond import json_response
from serving.auth import set_policy
from serving.protocol.schema import ApiError, Field, Schema, number, one_of

if TYPE_CHECKING:
    from pathlib import Path

    from serving.auth import KeyStore
    from serving.tenants.limits import TenantLimits
    from serving.tenants.policy import TenantPolicies

POLICY_BODY = Schema(
    {
        "train": Field(one_of("allow", "deny")),
        "retention_days": Field(number(0, 36500, "'retention_days' must be a number of days in [0, 36500]")),
    }
)
FORGET_BODY = Schema({"train": Field(one_of("deny"))})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TenantsApi:
    def __init__(self, keys: KeyStore, policies: TenantPolicies, limits: TenantLimits, keys_file: Path | None):
        self.keys, self.policies, self.limits, self.keys_file = keys, policies, limits, keys_file

    def handlers(self) -> dict[routes.Route, Handler]:
        return {
            routes.LIST_TENANTS: self.list,
            routes.GET_TENANT: self.get,
            routes.SET_POLICY: self.put,
            routes.FORGET: self.forget,
        }

    def _view(self, name: str, tenants: dict | None = None) -> dict:
        ids = (self.keys.tenants() if tenants is None else tenants).get(name)
        if ids is None:
            raise ApiError(404, f"no tenant {name!r} in the key store", code="tenant_not_found")
        limited = self.limits.refused.get(name, {})
        return {"name": name, "ids": ids, "policy": self.keys.policy(name).view(), "limited": dict(limited)}

    async def _set(self, name: str, **changes) -> None:
        """Write the change (off the loop: the keys file's lock may be held by the CLI or another gateway),
        then put it into effect here; answers only once it is, else 503 (it keeps trying) or 409."""
        keys_file = self._keys_file()
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(set_policy, keys_file, name, **changes)
            )
        except ValueError as e:  # the file holds a policy nobody can load (a hand edit): fix it first
            raise ApiError(409, f"{keys_file}: {e}", code="keys_file_invalid") from None
        await self._sync(name)

    async def _sync(self, name: str) -> None:
        await self.policies.sync()
        if self.keys.load_error:  # broken between our write and the reload: nothing was applied
            raise ApiError(409, self.keys.load_error, code="keys_file_invalid")
        if name in self.policies.retry:
            raise ApiError(
                503,
                f"{name}'s policy is saved but not yet in effect on this gateway (its spool is slow or full); "
                "it keeps trying",
                "server_error",
                code="spool_busy",
            )

    def _keys_file(self):
        if self.keys_file is None:
            raise ApiError(409, "this gateway has no keys file: policies live there (--keys-file)", code="no_keys_file")
        return self.keys_file

    async def list(self, request: web.Request) -> web.Response:
        await self.policies.sync()
        tenants = self.keys.tenants()
        return json_response({"tenants": [self._view(n, tenants) for n in tenants]})

    async def get(self, request: web.Request) -> web.Response:
        await self.policies.sync()
        return json_response(self._view(request.match_info["name"]))

    async def put(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self._view(name)
        b = POLICY_BODY.parse(await request.read())
        if not b.given:
            raise ApiError(400, "give 'train' and/or 'retention_days'", code="missing_required_parameter")
        changes = {k: b[k] for k in b.given}
        if changes.get("retention_days") == 0:
            changes["retention_days"] = None  # 0: no retention of its own (the topic's)
        await self._set(name, **changes)
        return json_response(self._view(name))

    async def forget(self, request: web.Request) -> web.Response:
        """Every event of the tenant up to now is forgotten: skipped and redacted in this gateway's spool,
        and, through the tenants topic, dropped by the trainer (buffered or not yet read)."""
        name = request.match_info["name"]
        self._view(name)
        b = FORGET_BODY.parse(await request.read())
        now = time.time()
        await self._set(name, forgotten_before=now, **({"train": "deny"} if b["train"] else {}))
        return json_response({**self._view(name), "forgotten_before": now})
