"""Per-tenant limits on the public API: no API key, and no tenant (every key of one name), can take the gateway
from the others by the number of its requests.

    request (its tenant known: serving.auth.tenant_middleware)
      -> in flight: key < key_concurrency and tenant < tenant_concurrency, else 429 (Retry-After: 1)
      -> rate: a token in the key's bucket and in the tenant's, else 429 (Retry-After: when one is back)
      -> the handler; its slots are given back when it ends, however it ends (an answer, an error, a stream
         cut off, a client gone: the handler's end is the request's, streams included)

A refusal is an OpenAI error body (code `rate_limit_exceeded`; an Anthropic one on /v1/messages), a
`Retry-After` header in whole seconds and `retry-after-ms` (the header the OpenAI SDKs read first), counted in
`flywheel_gateway_limited_total{limit}` and, by tenant, in `refused` (the admin API's tenant view: /metrics is
open on the public port, and tenants' names are not for everyone who reaches it). A refused request takes no
token and no slot. The limits are
serving.config.TenantLimitsConfig, and a tenant's own from the keys file's `"limits"` (read again when the file
changes); 0 turns one off.

Written here rather than taken from a library: the token bucket is a few lines, and those on PyPI either wait
for a token instead of refusing (aiolimiter), count windows rather than refill a bucket (limits,
pyrate-limiter), or do not say when the next token comes (token-bucket), which Retry-After needs.
Buckets and counts are per gateway process: behind a load balancer of N gateways a key gets up to N times
its rate, which the defaults allow for.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields, replace

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from admin_api import routes as admin_routes
from serving.api.respond import json_response
from serving.auth import TENANT, KeyStore, Tenant
from serving.config import TenantLimitsConfig

KINDS = ("key_rate", "tenant_rate", "key_concurrency", "tenant_concurrency")
MESSAGES_PATH = "/v1/messages"


@dataclass
class Bucket:
    """A token bucket: `rate` tokens a second up to `burst`."""

    rate: float
    burst: float
    tokens: float
    stamp: float

    def wait(self, now: float) -> float:
        """Seconds until a token is there (0: one is)."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate


class TenantLimits:
    def __init__(self, cfg: TenantLimitsConfig, keys: KeyStore, registry: CollectorRegistry | None = None):
        self.cfg, self.keys = cfg, keys
        self.buckets: dict[tuple[str, str], Bucket] = {}  # ("key", id) | ("tenant", name) -> its bucket
        self.in_flight: dict[tuple[str, str], int] = {}  # the same keys -> requests in flight (absent: none)
        self.limited = Counter(
            "flywheel_gateway_limited",
            "Requests refused with 429 by a per-tenant limit, by limit (key_rate, tenant_rate, key_concurrency, "
            f"tenant_concurrency); by tenant on the admin API (GET {admin_routes.LIST_TENANTS.path}: limited)",
            ["limit"],
            registry=registry,
        )
        self.refused: dict[str, dict[str, int]] = {}  # tenant name -> limit -> requests refused by this gateway

    def limits(self, tenant: Tenant) -> TenantLimitsConfig:
        own = self.keys.limits.get(tenant.name)
        if not own:
            return self.cfg
        return replace(
            self.cfg,
            **{f.name: type(getattr(self.cfg, f.name))(own[f.name]) for f in fields(self.cfg) if f.name in own},
        )

    def _bucket(self, who: tuple[str, str], rate: float, burst: float, now: float) -> Bucket:
        b = self.buckets.get(who)
        burst = max(1.0, burst)
        if b is None:
            b = self.buckets[who] = Bucket(rate, burst, burst, now)
        elif (b.rate, b.burst) != (rate, burst):  # the keys file changed this tenant's limits
            b.rate, b.burst, b.tokens = rate, burst, min(b.tokens, burst)
        return b

    def admit(self, tenant: Tenant, now: float | None = None) -> tuple[str, float] | None:
        """Takes a slot and a token for the request (None), or says which limit refused it and in how many
        seconds to try again; a refused request takes nothing."""
        now = time.monotonic() if now is None else now
        lim = self.limits(tenant)
        key, name = ("key", tenant.id), ("tenant", tenant.name)
        for who, cap, kind in (
            (key, lim.key_concurrency, "key_concurrency"),
            (name, lim.tenant_concurrency, "tenant_concurrency"),
        ):
            if cap and self.in_flight.get(who, 0) >= cap:
                return kind, 1.0  # a slot comes back when a request ends: no better guess than soon
        buckets = []
        for who, rate, burst, kind in (
            (key, lim.key_rate_per_s, lim.key_burst, "key_rate"),
            (name, lim.tenant_rate_per_s, lim.tenant_burst, "tenant_rate"),
        ):
            if rate:
                b = self._bucket(who, rate, burst, now)
                wait = b.wait(now)
                if wait:
                    return kind, wait
                buckets.append(b)
        for b in buckets:
            b.tokens -= 1
        for who in (key, name):
            self.in_flight[who] = self.in_flight.get(who, 0) + 1
        return None

    def release(self, tenant: Tenant) -> None:
        for who in (("key", tenant.id), ("tenant", tenant.name)):
            left = self.in_flight.get(who, 0) - 1
            if left > 0:
                self.in_flight[who] = left
            else:
                self.in_flight.pop(who, None)

    def refusal(self, request: web.Request, tenant: Tenant, kind: str, wait: float) -> web.Response:
        self.limited.labels(kind).inc()
        by_kind = self.refused.setdefault(tenant.name, {})
        by_kind[kind] = by_kind.get(kind, 0) + 1
        scope = "API key" if kind.startswith("key") else "tenant"
        what = "requests in flight" if kind.endswith("concurrency") else "requests per second"
        message = f"Rate limit reached for this {scope} on {what}: please try again in {wait:.2f}s"
        headers = {"Retry-After": str(max(1, math.ceil(wait))), "retry-after-ms": str(max(1, math.ceil(wait * 1000)))}
        if request.path.startswith(MESSAGES_PATH):  # Anthropic's shape there, as every error on that API
            body = {"type": "error", "error": {"type": "rate_limit_error", "message": message}}
        else:
            body = {"error": {"message": message, "type": "requests", "param": None, "code": "rate_limit_exceeded"}}
        return json_response(body, status=429, headers=headers)

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        tenant = request.get(TENANT)
        if tenant is None:  # no route matched (a 404/405 to come): nothing to limit
            return await handler(request)
        refused = self.admit(tenant)
        if refused is not None:
            return self.refusal(request, tenant, *refused)
        try:
            return await handler(request)
        finally:
            self.release(tenant)
