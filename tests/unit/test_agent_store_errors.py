"""A store that fails is not a version that is bad: an agent rejects a version for good only when the store
says it has no such version (404); a 5xx (a store restarting, a proxy's 502) on its manifest or its signature
is a transient failure, retried, never "unknown" or "unsigned"."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from weight_sync.agent import Agent, AgentConfig, Rejected
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, publish
from weight_sync.store import Store


def _store_behind(store: Store, broken: set[str]) -> web.Application:
    """The real store's app, with the paths in `broken` answered 502 (as a proxy in front of a restarting one)."""

    @web.middleware
    async def fail(request, handler):
        if request.path in broken:
            return web.Response(status=502, text="bad gateway")
        return await handler(request)

    app = store.app()
    app.middlewares.append(fail)
    return app


async def _manifest(agent: Agent, url: str, version: int):
    async with aiohttp.ClientSession() as session:
        agent.cfg.store_url = url
        return await agent.manifest(agent.store_client(session), version)


def test_a_failing_store_is_retried_and_only_a_missing_version_is_unknown(test_model, tmp_path):
    generate_key(tmp_path / "s.pem", tmp_path / "s.pub")
    cfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "s.pem")
    assert publish(test_model, cfg).version == 0
    agent = Agent(
        AgentConfig(
            name="a",
            replica_url="http://unused",
            store_url="http://unused",
            public_key=tmp_path / "s.pub",
            work_dir=tmp_path / "w",
            initial_model=test_model,
        )
    )
    broken: set[str] = set()

    async def scenario():
        runner = web.AppRunner(_store_behind(Store(cfg.store), broken))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            assert (await _manifest(agent, url, 0)).version == 0  # the store whole: the version verifies
            for path in ("/versions/0/manifest.sig", "/versions/0/manifest.json"):
                broken.clear()
                broken.add(path)
                with pytest.raises(Rejected) as e:
                    await _manifest(agent, url, 0)
                assert e.value.reason == "fetch_failed", (path, e.value)  # before: bad_manifest / unknown_version
                assert e.value.reason not in Agent.PERMANENT
            broken.clear()
            with pytest.raises(Rejected) as e:
                await _manifest(agent, url, 7)  # 404: the store has no v7
            assert e.value.reason == "unknown_version" and e.value.reason in Agent.PERMANENT
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
