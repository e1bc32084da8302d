"""Per-tenant limits, attacked as a tenant would: one key (or one tenant's many keys) floods the gateway, or holds
streams open and walks away. A gateway in this process in front of stand-in replicas (the limits are the
gateway's own logic, not the engine's)."""

from __future__ import annotations

import asyncio
import hashlib
import json

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_engine import gateway_over_fakes

pytestmark = pytest.mark.timeout(120)

ADMIN = {"Authorization": "Bearer admin-secret"}  # tests.fake_engine's gateway's
CHAT = {"model": "flywheel-coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def limits_file(tmp_path, limits: dict, keys: list[str] = ()) -> dict:
    """A keys file with these tenants' own limits (and these keys, of tenant "big"): the gateway's keys_file."""
    f = tmp_path / "keys.json"
    entries = [{"name": "big", "sha256": hashlib.sha256(k.encode()).hexdigest()} for k in keys]
    f.write_text(json.dumps({"keys": entries, "limits": limits}))
    return {"keys_file": f}


def run(test_model, tmp_path, scenario, **cfg):
    async def main():
        async with gateway_over_fakes(test_model, tmp_path / "gw", [1], tenants=4, **cfg) as (client, fakes):
            return await scenario(client, fakes)

    return asyncio.run(main())


async def limited(client) -> dict[tuple[str, str], float]:
    """Refusals by (tenant, limit), from the admin API; /metrics, open on the public port, counts them by limit
    only, and names no tenant."""
    families = list(text_string_to_metric_families(await (await client.get("/metrics")).text()))
    public = {
        s.labels["limit"]: s.value
        for fam in families
        if fam.name == "flywheel_gateway_limited"
        for s in fam.samples
        if s.name.endswith("_total")
    }
    tenants = (await (await client.get("/admin/tenants", headers=ADMIN)).json())["tenants"]
    named = {t["name"] for t in tenants} & {v for fam in families for s in fam.samples for v in s.labels.values()}
    assert not named, f"/metrics names tenants: {named}"
    by_tenant = {(t["name"], kind): float(n) for t in tenants for kind, n in t["limited"].items()}
    assert public == {
        kind: sum(n for (_, k), n in by_tenant.items() if k == kind) for kind in {k for _, k in by_tenant}
    }
    return by_tenant


def test_a_flooding_key_gets_429_with_retry_after_while_another_tenant_is_served(test_model, tmp_path):
    async def scenario(client, fakes):
        statuses, refusal = [], None
        for _ in range(8):
            r = await client.get("/v1/models", headers=auth("key-u0"))
            statuses.append(r.status)
            if r.status == 429 and refusal is None:
                refusal = (dict(r.headers), await r.json())
        other = await client.post("/v1/chat/completions", json=CHAT, headers=auth("key-u1"))
        messages = await client.post(
            "/v1/messages",
            json={"model": "flywheel-coder", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            headers={**auth("key-u0"), "anthropic-version": "2023-06-01"},
        )
        return statuses, refusal, other.status, messages.status, await messages.json(), await limited(client)

    cfg = limits_file(tmp_path, {"u0": {"key_rate_per_s": 0.5, "key_burst": 3}})
    statuses, refusal, other, m_status, m_body, counted = run(test_model, tmp_path, scenario, **cfg)
    assert statuses[:3] == [200] * 3 and statuses[3:] == [429] * 5, statuses
    headers, body = refusal
    assert int(headers["Retry-After"]) >= 1 and int(headers["retry-after-ms"]) > 0
    assert body["error"]["code"] == "rate_limit_exceeded" and body["error"]["message"]
    assert other == 200  # another tenant is served all along
    assert m_status == 429 and m_body["type"] == "error" and m_body["error"]["type"] == "rate_limit_error"
    assert counted[("u0", "key_rate")] == 6 and ("u1", "key_rate") not in counted


def test_a_tenants_keys_share_its_limit_from_the_keys_file(test_model, tmp_path):
    keys = [f"fw-big-{i}" for i in range(3)]
    cfg = limits_file(tmp_path, {"big": {"tenant_rate_per_s": 0.5, "tenant_burst": 4}}, keys)

    async def scenario(client, fakes):
        statuses = [(await client.get("/v1/models", headers=auth(keys[i % 3]))).status for i in range(9)]
        small = [(await client.get("/v1/models", headers=auth("key-u0"))).status for _ in range(9)]
        return statuses, small, await limited(client)

    statuses, small, counted = run(test_model, tmp_path, scenario, **cfg)
    assert statuses == [200] * 4 + [429] * 5  # three keys, one tenant's bucket
    assert small == [200] * 9  # the defaults: far above a user
    assert counted == {("big", "tenant_rate"): 5}


def test_a_bad_limit_in_the_keys_file_is_refused(tmp_path):
    from serving.auth import KeyStore

    keys_file = tmp_path / "keys.json"
    for bad in ({"big": {"key_rate": 5}}, {"big": {"key_rate_per_s": "fast"}}, {"big": {"key_burst": -1}}, []):
        keys_file.write_text(json.dumps({"keys": [], "limits": bad}))
        with pytest.raises(ValueError):
            KeyStore.load(keys_file)


def test_concurrency_is_given_back_when_a_client_walks_away_or_a_stream_breaks(test_model, tmp_path):
    async def scenario(client, fakes):
        (fake,) = fakes
        url = str(client.make_url("/v1/chat/completions"))
        out = {}
        fake.delay_s = 1.0
        async with aiohttp.ClientSession() as s:

            async def hold():
                async with s.post(url, json={**CHAT, "stream": True}, headers=auth("key-u0")) as r:
                    return await r.read()

            held = asyncio.ensure_future(hold())
            while not fake.rids:  # the replica has it: the key's one slot is taken
                await asyncio.sleep(0.01)
            second = await client.post("/v1/chat/completions", json=CHAT, headers=auth("key-u0"))
            out["second"] = (second.status, second.headers.get("Retry-After"), await second.json())
            out["other"] = (await client.post("/v1/chat/completions", json=CHAT, headers=auth("key-u1"))).status
            held.cancel()  # the client goes away mid-request
            await asyncio.gather(held, return_exceptions=True)
        fake.delay_s = 0.0
        for _ in range(300):  # the gateway notices at its next write to the gone client, and gives the slot back
            r = await client.post("/v1/chat/completions", json=CHAT, headers=auth("key-u0"))
            if r.status != 429:
                break
            await asyncio.sleep(0.02)
        out["third"] = r.status
        fake.break_mid_stream = True  # a stream that breaks on the replica's side: an error chunk, then the end
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth("key-u0"))
        out["broken"] = (r.status, await r.read())
        fake.break_mid_stream = False
        fake.fail_status = 500  # and a request that fails outright
        out["failed"] = (await client.post("/v1/chat/completions", json=CHAT, headers=auth("key-u0"))).status
        fake.fail_status = None
        # With one slot, a slot any of these kept would refuse this one (the replica is out since it failed).
        out["last"] = (await client.get("/v1/models", headers=auth("key-u0"))).status
        out["counted"] = await limited(client)
        return out

    out = run(test_model, tmp_path, scenario, **limits_file(tmp_path, {"u0": {"key_concurrency": 1}}))
    status, retry_after, body = out["second"]
    assert status == 429 and retry_after == "1" and body["error"]["code"] == "rate_limit_exceeded"
    assert out["other"] == 200
    assert out["third"] == 200
    assert out["broken"][0] == 200 and b'"error"' in out["broken"][1]
    assert out["failed"] >= 500 and out["last"] == 200
    assert out["counted"][("u0", "key_concurrency")] >= 1


def test_bucket_refills_at_its_rate_and_says_when():
    from serving.auth import Tenant
    from serving.config import TenantLimitsConfig
    from serving.tenants.limits import TenantLimits

    class Keys:
        limits: dict = {}

    lim = TenantLimits(TenantLimitsConfig(key_rate_per_s=2.0, key_burst=2, tenant_rate_per_s=0), Keys())
    t = Tenant(id="a" * 16, name="a")
    assert lim.admit(t, now=0.0) is None and lim.admit(t, now=0.0) is None
    kind, wait = lim.admit(t, now=0.0)
    assert kind == "key_rate" and wait == pytest.approx(0.5)
    assert lim.admit(t, now=0.5) is None  # one token back after 1/rate
    lim.release(t)
    lim.release(t)
    lim.release(t)
    assert lim.in_flight == {}
