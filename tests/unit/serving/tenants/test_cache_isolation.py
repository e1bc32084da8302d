"""Tenants never see each other through the prefix cache (serving.tenants.cache_scope): the router never favours a
replica because another tenant's prefix is there, and every request reaches the replica with its tenant's
cache_salt. The same against real SGLang (cached_tokens, time to first token) is in
tests/integration/serving/tenants/test_cache_isolation_live.py."""

from __future__ import annotations

import asyncio
import random

import pytest

from serving.config import RoutingConfig
from serving.routing.policy import RouteRequest
from serving.routing.pool import Lease, ReplicaPool
from serving.tenants.cache_scope import CacheScopes

pytestmark = pytest.mark.timeout(120)
SCOPES = CacheScopes(b"fleet-secret")
FILE = "".join(f"def f_{i}(x):\n    return x + {i}\n\n" for i in range(16))  # ~200 tokens: over min_match


def _pool() -> ReplicaPool:
    p = ReplicaPool(["http://r0", "http://r1"], routing=RoutingConfig())
    for r in p.replicas.values():
        r.healthy = True
    return p


def _req(tokens, tenant: str) -> RouteRequest:
    return RouteRequest(tokens, tenant, scope=SCOPES.of(tenant))


def test_another_tenants_prefix_does_not_draw_a_request():
    p = _pool()
    rng = random.Random(0)
    secret_file = [rng.randrange(1000) for _ in range(1500)]
    home = p.pick(req=_req(secret_file[:1000], "alice"))
    other = next(r for r in p.replicas.values() if r is not home)
    with Lease(home):  # alice's replica a request busier: without a cache match, bob goes to the other one
        bob = p.pick(req=_req(secret_file[:1000], "bob"))
        assert bob.id == other.id, "bob was routed to where alice's prefix is cached"
        assert p.pick(req=_req(secret_file[:1200], "alice")).id == home.id  # alice keeps her cache
        assert p.pick(req=_req(secret_file[:1100], "bob")).id == other.id  # and bob shares his own
    assert p.policy.view()["decisions"] == {"no_match": 2, "match": 2}


def test_a_tenants_salt_is_its_own_and_not_its_id():
    a, b = SCOPES.of("tenant-a"), SCOPES.of("tenant-b")
    assert a == SCOPES.of("tenant-a") and a != b  # stable for one tenant, different across tenants
    assert "tenant-a" not in a and a != CacheScopes(b"another-fleet").of("tenant-a")  # keyed by the secret
    assert SCOPES.of(None) is None  # rollouts: no tenant
    assert CacheScopes(None).of("tenant-a") is None  # isolation off: one shared scope


def _complete(client, tenant: int, prompt: str):
    body = {"model": "m", "prompt": prompt, "max_tokens": 4}
    return client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer key-u{tenant}"})


@pytest.mark.parametrize("isolate", [True, False])
def test_the_gateway_salts_each_tenants_requests_and_routes_within_its_scope(test_model, tmp_path, isolate):
    """Through a gateway over two replicas: alice sends her file, then bob sends the same file. Bob's request
    goes where the load says (no match) with a salt of his own; alice's and bob's repeats match their own."""
    from tests.fake_engine import gateway_over_fakes

    async def scenario():
        routing = RoutingConfig() if isolate else RoutingConfig(isolate_tenants=False)  # isolation is the default
        async with gateway_over_fakes(test_model, tmp_path / "gw", [1, 1], routing=routing) as (client, fakes):
            for tenant in (0, 1, 0, 1):
                r = await _complete(client, tenant, FILE)
                assert r.status == 200, await r.text()
            # A client cannot pick its own salt (another tenant's, say): the field is not part of the API.
            refused = await client.post(
                "/v1/completions",
                json={"model": "m", "prompt": FILE, "max_tokens": 4, "cache_salt": "x"},
                headers={"Authorization": "Bearer key-u1"},
            )
            view = await (await client.get("/admin/replicas", headers={"Authorization": "Bearer admin-secret"})).json()
            return fakes, refused.status, view["routing"]["decisions"]

    fakes, refused, decisions = asyncio.run(scenario())
    salts = [s for f in fakes for s in f.salts]
    assert refused == 400
    if not isolate:
        assert salts == [None] * 4
        assert decisions == {"no_match": 1, "match": 3}  # bob drawn to alice's prefix: what isolation prevents
        return
    assert decisions == {"no_match": 2, "match": 2}
    assert len(set(salts)) == 2 and None not in salts  # two tenants, two salts, every request salted


def test_messages_and_responses_are_salted_as_the_tenants_requests(test_model, tmp_path):
    """/v1/messages and /v1/responses (serving.api.turn) run as the tenant's requests: salted, routed within its
    scope. (The tenant's id once went positionally into run_choice's `rollout`: unsalted, routed as rollouts.)"""
    from tests.fake_engine import gateway_over_fakes

    async def scenario():
        async with gateway_over_fakes(test_model, tmp_path / "gw", [1, 1]) as (client, fakes):
            body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": FILE}]}
            headers = {"x-api-key": "key-u0", "anthropic-version": "2023-06-01"}
            r = await client.post("/v1/messages", json=body, headers=headers)
            assert r.status == 200, await r.text()
            body = {"model": "m", "input": FILE, "max_output_tokens": 4}
            r = await client.post("/v1/responses", json=body, headers={"Authorization": "Bearer key-u0"})
            assert r.status == 200, await r.text()
            return fakes

    salts = [s for f in asyncio.run(scenario()) for s in f.salts]
    assert len(salts) == 2 and None not in salts and len(set(salts)) == 1  # both requests: tenant u0's salt
