"""What an agent does when the store or its own disk fails. A store that fails is not a version that is bad:
a version is rejected for good only when the store says it has no such version (404); a 5xx (a store
restarting, a proxy's 502) on its manifest or its signature is a transient failure, retried, never "unknown"
or "unsigned". A rebuild that fails for any reason (a full disk) leaves no model-sized staging file and no
open descriptor, and what a killed agent left is pruned."""

from __future__ import annotations

import asyncio
import errno
import os

import aiohttp
import pytest
from aiohttp import web

from tests.helpers import STORE_TOKEN, serving_app
from weight_sync.agent.loop import Agent, AgentConfig, Rejected
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, publish
from weight_sync.store.server import Store


def _store_behind(store: Store, broken: set[str]) -> web.Application:
    """The real store's app, with the paths in `broken` answered 502 (as a proxy in front of a restarting one)."""

    @web.middleware
    async def fail(request, handler):
        if request.path in broken:
            return web.Response(status=502, text="bad gateway")
        return await handler(request)

    app = store.app(token=STORE_TOKEN)
    app.middlewares.append(fail)
    return app


async def _manifest(agent: Agent, url: str, version: int):
    async with aiohttp.ClientSession() as session:
        agent.cfg.store_url = url
        return await agent.manifest(agent.store_client(session), version)


@pytest.fixture(scope="module")
def published(test_model, tmp_path_factory) -> PublishConfig:
    """A store holding v0 (the test model, full) and v1 (a delta against it)."""
    root = tmp_path_factory.mktemp("published")
    generate_key(root / "s.pem", root / "s.pub")
    cfg = PublishConfig(store=root / "store", private_key=root / "s.pem")
    assert publish(test_model, cfg).version == 0
    assert publish(test_model, cfg).kind == "delta"
    return cfg


def _open_files() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            pass
    return out


def _agent(cfg: PublishConfig, test_model, work) -> Agent:
    return Agent(
        AgentConfig(
            name="a",
            replica_url="http://unused",
            store_url="http://unused",
            public_key=cfg.private_key.with_suffix(".pub"),
            work_dir=work,
            initial_model=test_model,
            store_token=STORE_TOKEN,
        )
    )


def test_a_failing_store_is_retried_and_only_a_missing_version_is_unknown(published, test_model, tmp_path):
    cfg, agent = published, _agent(published, test_model, tmp_path / "w")
    broken: set[str] = set()

    async def scenario():
        async with serving_app(_store_behind(Store(cfg.store), broken)) as url:
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

    asyncio.run(scenario())


def test_a_rebuild_the_disk_ended_leaves_nothing_behind(published, test_model, tmp_path, monkeypatch):
    from weight_sync.checkpoint import CheckpointWriter

    agent = _agent(published, test_model, tmp_path / "w")
    write, calls = CheckpointWriter.write, []

    def write_until_full(self, name, bits):
        calls.append(name)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, name, bits)

    monkeypatch.setattr(CheckpointWriter, "write", write_until_full)

    async def scenario():
        async with (
            serving_app(Store(published.store).app(token=STORE_TOKEN)) as url,
            aiohttp.ClientSession() as session,
        ):
            agent.cfg.store_url = url
            await agent.materialize(agent.store_client(session), 1)

    with pytest.raises(OSError) as e:  # transient: apply() retries it (switch_failed), not a rejection
        asyncio.run(scenario())
    assert e.value.errno == errno.ENOSPC and len(calls) == 2
    assert not (tmp_path / "w" / ".build-1").exists() and not agent.local_dir(1).exists()  # before: left there
    assert not [f for f in _open_files() if ".build-1" in f]  # before: the writer's file left open
    # What an agent killed mid-rebuild or mid-download leaves is pruned after its next switch.
    (tmp_path / "w" / ".build-7").mkdir()
    (tmp_path / "w" / ".build-7" / "model.safetensors").write_bytes(b"x" * 1024)
    (tmp_path / "w" / "downloads").mkdir(exist_ok=True)
    (tmp_path / "w" / "downloads" / "v7-0.0.part").write_bytes(b"x")
    agent._prune()
    assert not (tmp_path / "w" / ".build-7").exists() and not list((tmp_path / "w" / "downloads").iterdir())


def test_a_damaged_local_base_is_dropped_and_rebuilt_not_the_version_rejected(published, test_model, tmp_path):
    """The agent's copy of v0 (its launch checkpoint) has a flipped bit: v1, a delta on v0, does not rebuild
    to its digests. That is this agent's disk, not the version: the copy is dropped (damaged_base, retried)
    and the retry rebuilds v0 from the store, then v1 (before: digest_mismatch, v1 rejected for good)."""
    import shutil
    import struct

    launch = tmp_path / "launch"
    shutil.copytree(test_model, launch)
    weights = launch / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[8 + struct.unpack("<Q", raw[:8])[0] + 10] ^= 0x40  # a byte of the first tensor's data
    weights.write_bytes(bytes(raw))
    agent = _agent(published, launch, tmp_path / "w")

    async def scenario():
        async with (
            serving_app(Store(published.store).app(token=STORE_TOKEN)) as url,
            aiohttp.ClientSession() as session,
        ):
            agent.cfg.store_url = url
            client = agent.store_client(session)
            with pytest.raises(Rejected) as e:
                await agent.materialize(client, 1)
            assert e.value.reason == "damaged_base" and e.value.reason not in Agent.PERMANENT
            assert not agent.local_dir(0).exists() and launch.exists()  # the link went, not the checkpoint
            return await agent.materialize(client, 1)  # the retry

    assert asyncio.run(scenario()) == agent.local_dir(1) and agent.local_dir(0).is_dir()
