"""The admin token split by capability (admin_api.tokens): each part opens only its own doors. Before,
one token opened every admin endpoint, so each weight agent (one per replica) could also rewrite tenants'
training policies or make them forgotten."""

from __future__ import annotations

import asyncio

import pytest

from admin_api import tokens as admin_tokens
from admin_api.tokens import AdminTokens, needed
from tests.fake_engine import gateway_over_fakes

PARTS = {"status": "part-status", "weights": "part-weights", "tenants": "part-tenants"}


def test_what_each_admin_request_needs():
    assert needed("GET", "/admin/replicas") == needed("GET", "/admin/canary") == "status"
    assert needed("POST", "/admin/replicas/r0/drain") == needed("PUT", "/admin/canary") == "weights"
    assert needed("POST", "/admin/rollouts") == needed("DELETE", "/admin/canary") == "weights"
    assert needed("GET", "/admin/tenants") == needed("PUT", "/admin/tenants/acme") == "tenants"
    assert needed("GET", "/admin/tenantsx") == "status"  # a prefix is not the tenants' path
    tokens = AdminTokens(all="root", **PARTS)
    assert all(tokens.grants("root", cap) for cap in admin_tokens.CAPABILITIES)
    assert tokens.grants("part-weights", "status") and not tokens.grants("part-tenants", "status")
    assert not tokens.grants(None, "status") and not tokens.grants("", "status")
    assert not AdminTokens().grants("", "status") and not AdminTokens().any
    with pytest.raises(ValueError):
        tokens.grants("root", "everything")


def test_each_part_opens_only_its_doors(test_model, tmp_path, monkeypatch):
    for cap, token in PARTS.items():
        monkeypatch.setenv(admin_tokens.ENV[cap], token)

    async def scenario():
        async with gateway_over_fakes(test_model, tmp_path / "gw", [1, 1]) as (client, _):

            async def call(method, path, token, body=None):
                r = await client.request(method, path, json=body, headers={"Authorization": f"Bearer {token}"})
                return r.status

            return {
                "status reads": await call("GET", "/admin/replicas", PARTS["status"]),
                "status drains": await call("POST", "/admin/replicas/r0/drain", PARTS["status"], {}),
                "status reads tenants": await call("GET", "/admin/tenants", PARTS["status"]),
                "weights reads": await call("GET", "/admin/replicas", PARTS["weights"]),
                "weights drains": await call("POST", "/admin/replicas/r0/drain", PARTS["weights"], {}),
                "weights activates": await call("POST", "/admin/replicas/r0/activate", PARTS["weights"]),
                "weights sets a policy": await call("PUT", "/admin/tenants/u1", PARTS["weights"], {"train": "allow"}),
                "weights forgets": await call("POST", "/admin/tenants/u1/forget", PARTS["weights"], {}),
                "tenants sets a policy": await call("PUT", "/admin/tenants/u1", PARTS["tenants"], {"train": "deny"}),
                "tenants drains": await call("POST", "/admin/replicas/r0/drain", PARTS["tenants"], {}),
                "tenants reads replicas": await call("GET", "/admin/replicas", PARTS["tenants"]),
                "a stranger reads": await call("GET", "/admin/replicas", "not-ours"),
                "the operator sets a policy": await call("PUT", "/admin/tenants/u2", "admin-secret", {"train": "deny"}),
            }

    got = asyncio.run(scenario())
    assert got == {
        "status reads": 200,
        "status drains": 403,
        "status reads tenants": 403,
        "weights reads": 200,
        "weights drains": 200,
        "weights activates": 200,
        "weights sets a policy": 403,
        "weights forgets": 403,
        "tenants sets a policy": 409,  # let in: this gateway keeps no keys file to write the policy to
        "tenants drains": 403,
        "tenants reads replicas": 403,
        "a stranger reads": 401,
        "the operator sets a policy": 409,
    }


def test_a_token_of_undecodable_bytes_is_a_401_not_a_500():
    """aiohttp hands a non-UTF-8 header over as surrogates, which a plain encode() refuses."""
    bad = b"\xff\xfe-not-a-token".decode("utf-8", "surrogateescape")
    tokens = AdminTokens(all="root", **PARTS)
    assert not any(tokens.grants(bad, cap) for cap in admin_tokens.CAPABILITIES)
