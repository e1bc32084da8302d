"""A switch's dealings with more than one gateway (two gateways behind a load balancer route to the same
replica): the replica is drained on each while it loads and routed to again on each after; a gateway that
cannot be reached is passed over; one that refuses (its last active replica) makes it a switch in place
and undoes the other's drain. Gateways in this process over fake replicas (tests/fake_engine.py); the
switch itself against real SGLang is tests/integration/test_weight_sync.py."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp.test_utils import TestClient, TestServer

from flywheel.core.procs import free_port
from tests.fake_engine import FakeReplica
from weight_sync.switch import GatewayLink, switch

ADMIN = "admin-secret"


@contextlib.asynccontextmanager
async def two_gateways(test_model, tmp_path, health_interval_s: float = 3600):
    """Two gateways in this process over the same two fake replicas: yields (fakes, their URLs, [client,
    client])."""
    from serving.config import GatewayConfig, PoolConfig
    from serving.gateway import Gateway

    fakes = [FakeReplica(0), FakeReplica(0)]
    servers = [TestServer(f.app) for f in fakes]
    for s in servers:
        await s.start_server()
    urls = [str(s.make_url("")).rstrip("/") for s in servers]
    clients = []
    for j in range(2):
        gw = Gateway(
            GatewayConfig(
                replicas=urls,
                model_dir=test_model,
                state_dir=tmp_path / f"g{j}",
                api_keys="u0:key-u0",
                admin_token=ADMIN,
                log_events=False,
                pool=PoolConfig(health_interval_s=health_interval_s),  # also how often drain leases expire
            )
        )
        c = TestClient(TestServer(gw.app))
        await c.start_server()
        clients.append(c)
    try:
        yield fakes, urls, clients
    finally:
        for c in clients:
            await c.close()
        for s in servers:
            await s.close()


async def states(client, rid: str = "r0") -> str:
    r = await client.get("/admin/replicas", headers={"Authorization": f"Bearer {ADMIN}"})
    return next(x["state"] for x in (await r.json())["replicas"] if x["id"] == rid)


def link(client, rid: str = "r0") -> GatewayLink:
    return GatewayLink(str(client.make_url("")).rstrip("/"), ADMIN, rid)


def test_a_replica_is_drained_on_every_gateway_while_it_loads(test_model, tmp_path):
    async def main():
        async with two_gateways(test_model, tmp_path) as (fakes, urls, gws):
            seen = []

            async def look():
                seen.append([await states(c) for c in gws])

            fakes[0].during_load = look
            report = await switch(urls[0], "/models/v1", 1, "drain", [link(c) for c in gws])
            assert report["mode"] == "drain"
            assert seen == [["draining", "draining"]]
            assert [await states(c) for c in gws] == ["active", "active"]
            assert fakes[0].version == 1

    asyncio.run(main())


def test_an_unreachable_gateway_is_passed_over(test_model, tmp_path):
    async def main():
        async with two_gateways(test_model, tmp_path) as (fakes, urls, gws):
            seen = []

            async def look():
                seen.append(await states(gws[0]))

            fakes[0].during_load = look
            dead = GatewayLink(f"http://127.0.0.1:{free_port()}", ADMIN, "r0")  # nothing listens there
            report = await switch(urls[0], "/models/v1", 1, "drain", [link(gws[0]), dead])
            assert report["mode"] == "drain" and seen == ["draining"]
            assert await states(gws[0]) == "active" and fakes[0].version == 1

    asyncio.run(main())


def test_a_gateway_that_refuses_makes_it_a_switch_in_place(test_model, tmp_path):
    async def main():
        async with two_gateways(test_model, tmp_path) as (fakes, urls, gws):
            # On gateway 1, r1 is drained by an SRE (no lease): r0 is its last active replica.
            r = await gws[1].post("/admin/replicas/r1/drain", json={}, headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.status == 200
            # Refused while another replica drains (for good: an SRE's drain has no lease): the switch waits
            # for its turn until its drain timeout, then switches in place.
            gws_links = [link(c) for c in gws]
            report = await switch(urls[0], "/models/v1", 1, "drain", gws_links, drain_timeout_s=1.0)
            assert report["mode"] == "no_pause"
            assert [await states(c) for c in gws] == ["active", "active"]  # gateway 0's drain undone
            assert fakes[0].version == 1

    asyncio.run(main())


def test_a_drain_taken_first_is_kept_while_the_next_gateway_waits_for_stragglers(test_model, tmp_path, monkeypatch):
    """Gateways are drained one after another (in URL order, the same for every agent); a drain already
    granted is renewed while a later gateway waits for its requests on the replica to finish."""
    import weight_sync.switch as sw

    monkeypatch.setattr(sw, "DRAIN_LEASE_S", 1.0)  # lapses within the straggler's 3 s unless renewed

    async def main():
        async with two_gateways(test_model, tmp_path, health_interval_s=0.2) as (fakes, urls, gws):
            first, second = sorted(gws, key=lambda c: str(c.make_url("")))
            for f in fakes:
                f.delay_s = 3.0
            body = {"model": "flywheel-coder", "prompt": "def f(x):\n", "max_tokens": 4}
            headers = {"Authorization": "Bearer key-u0"}
            # Two requests on the second gateway: one on each replica (least outstanding).
            stragglers = [
                asyncio.ensure_future(second.post("/v1/completions", json=body, headers=headers)) for _ in "ab"
            ]
            await asyncio.sleep(0.5)
            seen = []

            async def look():
                seen.append([await states(first), await states(second)])

            fakes[0].during_load = look
            report = await switch(urls[0], "/models/v1", 1, "drain", [link(c) for c in gws])
            assert report["mode"] == "drain" and report["drain_ms"] > 2000  # it waited for the straggler
            assert seen == [["draining", "draining"]]  # the first gateway's drain outlived its 1 s lease
            assert [await states(c) for c in gws] == ["active", "active"]
            assert [(await s).status for s in stragglers] == [200, 200]

    asyncio.run(main())
