"""A switch's dealings with more than one gateway (two gateways behind a load balancer route to the same
replica): the replica is drained on each while it loads and routed to again on each after; a gateway that
cannot be reached is passed over; one that refuses (its last active replica) makes it a switch in place
and undoes the other's drain. Gateways in this process over fake replicas (tests/fake_engine.py); the
switch itself against real SGLang is tests/integration/weight_sync/test_weight_sync.py."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp.test_utils import TestClient, TestServer

from infra.procs import free_port
from tests.fake_engine import FakeReplica
from weight_sync.agent.switch import GatewayLink, switch

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


async def slow_requests_on(client, fakes) -> list:
    """Two 3 s requests through one gateway, one on each replica (least outstanding), under way on return."""
    for f in fakes:
        f.delay_s = 3.0
    body = {"model": "flywheel-coder", "prompt": "def f(x):\n", "max_tokens": 4}
    headers = {"Authorization": "Bearer key-u0"}
    out = [asyncio.ensure_future(client.post("/v1/completions", json=body, headers=headers)) for _ in "ab"]
    await asyncio.sleep(0.5)
    return out


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
            first, last = sorted(gws, key=lambda c: str(c.make_url("")))  # the order drains are taken in
            seen = []

            async def look():
                seen.append([await states(first), await states(last)])

            fakes[0].during_load = look
            # On the gateway drained last, r1 is drained by an SRE (no lease: it will not come back soon), so
            # r0 is its last active replica there: refused, at once, after the first gateway granted it.
            r = await last.post("/admin/replicas/r1/drain", json={}, headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.status == 200
            report = await switch(urls[0], "/models/v1", 1, "drain", [link(c) for c in gws])
            assert report["mode"] == "no_pause" and report["drain_ms"] < 5000
            assert seen == [["active", "active"]]  # the first gateway's drain undone before the load
            assert [await states(first), await states(last)] == ["active", "active"]
            assert fakes[0].version == 1

    asyncio.run(main())


def test_a_cancelled_switch_leaves_no_gateway_draining(test_model, tmp_path):
    """Cancelled while the second gateway waits for a straggler (its drain asked for, not yet granted) and
    while loading: every gateway routes to the replica again."""

    async def main():
        async with two_gateways(test_model, tmp_path) as (fakes, urls, gws):
            first, second = sorted(gws, key=lambda c: str(c.make_url("")))
            stragglers = await slow_requests_on(second, fakes)
            task = asyncio.ensure_future(switch(urls[0], "/models/v1", 1, "drain", [link(c) for c in gws]))
            await asyncio.sleep(1.0)
            assert [await states(first), await states(second)] == ["draining", "draining"]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert [await states(first), await states(second)] == ["active", "active"]
            await asyncio.gather(*stragglers)
            for f in fakes:
                f.delay_s = 0.0
            fakes[0].load_s = 5.0
            task = asyncio.ensure_future(switch(urls[0], "/models/v2", 2, "drain", [link(c) for c in gws]))
            await asyncio.sleep(1.0)  # loading now
            assert [await states(first), await states(second)] == ["draining", "draining"]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert [await states(first), await states(second)] == ["active", "active"]

    asyncio.run(main())


def test_a_drain_taken_first_is_kept_while_the_next_gateway_waits_for_stragglers(test_model, tmp_path, monkeypatch):
    """Gateways are drained one after another (in URL order, the same for every agent); a drain already
    granted is renewed while a later gateway waits for its requests on the replica to finish."""
    import weight_sync.agent.gateway_drains as drains

    monkeypatch.setattr(drains, "DRAIN_LEASE_S", 1.0)  # lapses within the straggler's 3 s unless renewed

    async def main():
        async with two_gateways(test_model, tmp_path, health_interval_s=0.2) as (fakes, urls, gws):
            first, second = sorted(gws, key=lambda c: str(c.make_url("")))
            stragglers = await slow_requests_on(second, fakes)
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


def test_weights_loaded_with_a_request_still_running_are_followed_by_a_flush(test_model, tmp_path):
    """SGLang changes the weights but keeps the prefix cache (KV of the old weights) when a request still
    runs as the load ends, and answers 400: the switch flushes the cache once that request is done."""

    async def main():
        async with two_gateways(test_model, tmp_path) as (fakes, urls, gws):
            fakes[0].unflushed_loads = 1
            report = await switch(urls[0], "/models/v1", 1, "drain", [link(c) for c in gws])
            assert report["mode"] == "drain" and fakes[0].version == 1
            assert fakes[0].flushes == ["timeout=30"]
            assert [await states(c) for c in gws] == ["active", "active"]

    asyncio.run(main())


def test_a_replica_an_operator_holds_stays_held_after_a_switch(test_model, tmp_path):
    """r0 drained by an SRE on one gateway (no lease) and borrowed for rollouts on the other: the agent's
    switch neither turns those into its own leased drains nor re-activates r0 after (before: it did both)."""

    async def main():
        async with two_gateways(test_model, tmp_path) as (fakes, urls, gws):
            admin = {"Authorization": f"Bearer {ADMIN}"}
            assert (await gws[0].post("/admin/replicas/r0/drain", json={}, headers=admin)).status == 200
            assert (await gws[1].post("/admin/replicas/r0/borrow", json={}, headers=admin)).status == 200
            for _ in range(100):  # idle: the borrow settles at once, asynchronously
                if await states(gws[1]) == "borrowed":
                    break
                await asyncio.sleep(0.05)
            assert [await states(c) for c in gws] == ["draining", "borrowed"]
            report = await switch(urls[0], "/models/v1", 1, "drain", [link(c) for c in gws])
            assert report["mode"] == "no_pause" and fakes[0].version == 1  # no users there to drain
            assert [await states(c) for c in gws] == ["draining", "borrowed"]
            r = await gws[0].get("/admin/replicas", headers=admin)
            assert next(x for x in (await r.json())["replicas"] if x["id"] == "r0")["drain_lease_s"] is None
            # An agent's drain taken first, an SRE's drain of the same replica during the load: the agent's
            # undrain after it leaves the SRE's drain standing.
            assert (await gws[0].post("/admin/replicas/r0/activate", json={}, headers=admin)).status == 200
            seen = []

            async def sre_drains_mid_switch():
                seen.append(await states(gws[0], "r1"))
                seen.append((await gws[0].post("/admin/replicas/r1/drain", json={}, headers=admin)).status)

            fakes[1].during_load = sre_drains_mid_switch
            report = await switch(urls[1], "/models/v1", 1, "drain", [link(gws[0], "r1")], drain_timeout_s=5)
            assert report["mode"] == "drain" and seen == ["draining", 200]
            assert await states(gws[0], "r1") == "draining"  # before: re-activated by the agent

    asyncio.run(main())


def test_a_gateway_from_before_undrain_is_re_activated(test_model, tmp_path, monkeypatch):
    """A gateway without the undrain action (404 not_found) still gets its replica back after the switch."""
    monkeypatch.setattr("serving.api.admin.ACTIONS", ("drain", "activate", "borrow", "return"))

    async def main():
        async with two_gateways(test_model, tmp_path) as (fakes, urls, gws):
            report = await switch(urls[0], "/models/v1", 1, "drain", [link(c) for c in gws])
            assert report["mode"] == "drain" and fakes[0].version == 1
            assert [await states(c) for c in gws] == ["active", "active"]

    asyncio.run(main())
