"""The weight store and the relays, attacked as an outsider would, and as a fleet member gone wrong.

An outsider (no fleet read credential) gets a 401 from the store server (`flywheel weights serve`) for every
version, piece, pack and stat, and from an agent's relay, and cannot register as a relay peer: the store
never sends an agent to it. A fleet member whose relay stalls or dribbles bytes costs an agent seconds, not a
minute per piece: it is dropped as "slow" and the store serves instead (weight_sync.agent.peer_rate).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import torch
from aiohttp import web
from safetensors.torch import save_file

from infra.procs import free_port
from tests.helpers import STORE_TOKEN, get, store_server
from weight_sync.agent.loop import Agent, AgentConfig
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, publish
from weight_sync.store.server import Store

pytestmark = pytest.mark.timeout(180)


def _checkpoint(d: Path, tensors: dict) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "synthetic", "tensors": len(tensors)}))
    save_file(tensors, str(d / "model.safetensors"))
    return d


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """v0 (4 bf16 tensors, 2 MB) and v1 (a delta: 20% of elements moved by 1 ULP), in small chunks."""
    root = tmp_path_factory.mktemp("auth-weights")
    g = torch.Generator().manual_seed(0)
    tensors = {f"layers.{i}.w": (torch.randn(256, 1024, generator=g) * 0.02).to(torch.bfloat16) for i in range(4)}
    v0 = _checkpoint(root / "v0", tensors)
    for k, t in tensors.items():
        bits = t.view(torch.int16)
        tensors[k] = torch.where(torch.rand(t.shape, generator=g) < 0.2, bits + 1, bits).view(torch.bfloat16)
    _checkpoint(root / "v1", tensors)
    generate_key(root / "k.pem", root / "k.pub")
    cfg = PublishConfig(store=root / "store", private_key=root / "k.pem", chunk_elems=1 << 16)
    publish(v0, cfg)
    publish(root / "v1", cfg)
    vdir = Store(root / "store").version_dir(1)
    pieces = ["manifest.json", "manifest.sig"] + [
        f"{d.name}/{f.name}" for d in (vdir / "chunks", vdir / "files") for f in d.iterdir()
    ]
    return {"root": root, "v0": v0, "pieces": pieces}


@pytest.fixture
def store(published):
    with store_server(published["root"] / "store") as url:
        yield url


def _status(url: str, token: str | None = None, method: str = "GET") -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers, method=method), timeout=30) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _agent(published, store: str, work: Path) -> Agent:
    """An honest agent with its relay (started; the caller stops it)."""
    agent = Agent(
        AgentConfig(
            name=work.name,
            replica_url="http://127.0.0.1:9",  # never called: materialize only
            store_url=store,
            public_key=published["root"] / "k.pub",
            work_dir=work,
            initial_model=published["v0"],
            relay_port=free_port(),
            store_token=STORE_TOKEN,
        )
    )
    agent.start_relay()
    return agent


def test_an_outsider_reads_nothing_from_the_store(published, store):
    paths = ["/versions", "/stats", "/versions/1/changed"] + [f"/versions/1/{p}" for p in published["pieces"]]
    for path in paths:
        assert _status(f"{store}{path}") == 401, path
        assert _status(f"{store}{path}", token="a-guess-of-the-fleet-token") == 401, path
        assert _status(f"{store}{path}", method="HEAD") == 401, path
        assert _status(f"{store}{path}", token=STORE_TOKEN) == 200, path
    assert _status(f"{store}/versions/1/chunks/0.0?direct=1&failed=http://127.0.0.1:1") == 401  # nor drop a peer
    code, metrics = get(f"{store}/metrics")  # open to Prometheus: counts, nothing of the weights
    assert code == 200 and 'flywheel_store_refused_requests_total{reason="missing"}' in metrics
    assert json.loads(get(f"{store}/stats", key=STORE_TOKEN)[1])["sent_bytes"]["chunk"] > 0


def test_an_outsider_cannot_register_as_a_relay_peer(published, store):
    """Before: any client that asked for a piece with ?peer=URL was noted as its holder, and the next agent
    was sent there (to a relay the outsider runs: stale bytes, a stall, a look at who fetches what)."""
    evil = f"http://127.0.0.1:{free_port()}"
    for piece in published["pieces"]:
        assert _status(f"{store}/versions/1/{piece}?peer={evil}") == 401, piece
    honest = f"http://127.0.0.1:{free_port()}"
    for piece in published["pieces"]:
        req = urllib.request.Request(
            f"{store}/versions/1/{piece}?peer={honest}", headers={"Authorization": f"Bearer {STORE_TOKEN}"}
        )
        opener = urllib.request.build_opener(_NoRedirect)
        with opener.open(req, timeout=30) as r:
            assert r.status == 200, f"{piece}: sent to {r.headers.get('Location')}"
    tracker = json.loads(get(f"{store}/stats", key=STORE_TOKEN)[1])["tracker"]
    assert tracker["redirects"] == 0 and tracker["holders"] == len(published["pieces"])  # the honest agent only


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(newurl, code, f"redirected to {newurl}", headers, fp)


def test_an_outsider_reads_nothing_from_a_relay(published, store, tmp_path):
    agent = _agent(published, store, tmp_path / "a")
    try:

        async def main():
            async with aiohttp.ClientSession() as s:
                await agent.materialize(agent.store_client(s), 1)

        asyncio.run(main())
        relay = agent.cfg.relay_config().advertised
        for piece in published["pieces"]:
            assert _status(f"{relay}/versions/1/{piece}") == 401, piece
            assert _status(f"{relay}/versions/1/{piece}", token="not-the-fleet-token-at-all") == 401, piece
            assert _status(f"{relay}/versions/1/{piece}", token=STORE_TOKEN) == 200, piece
        assert agent.metrics.relay_requests.labels("unauthorized")._value.get() == 2 * len(published["pieces"])
    finally:
        agent.stop_relay()


def test_a_relay_never_runs_open(published, tmp_path):
    with pytest.raises(ValueError, match="FLYWHEEL_STORE_TOKEN"):
        AgentConfig(
            name="a",
            replica_url="http://127.0.0.1:9",
            store_url="http://127.0.0.1:9",
            public_key=published["root"] / "k.pub",
            work_dir=tmp_path / "a",
            initial_model=published["v0"],
            relay_port=free_port(),
        )


def test_the_store_and_an_agent_refuse_to_start_without_the_credential(published, tmp_path, monkeypatch, capsys):
    from flywheel.cli import main

    monkeypatch.delenv("FLYWHEEL_STORE_TOKEN", raising=False)
    assert main(["weights", "serve", "--store", str(published["root"] / "store"), "--port", str(free_port())]) == 1
    assert "FLYWHEEL_STORE_TOKEN" in capsys.readouterr().err
    args = ["weights", "agent", "--name", "r0", "--replica", "http://127.0.0.1:9", "--store-url", "http://127.0.0.1:9"]
    assert main([*args, "--initial-model", str(published["v0"]), "--work-dir", str(tmp_path / "a")]) == 1
    assert "FLYWHEEL_STORE_TOKEN" in capsys.readouterr().err


async def _hostile_relay(how: str) -> tuple[web.AppRunner, str]:
    """A fleet member's relay gone wrong: `dribble` answers at once and sends one byte a second;
    `silent` accepts the connection and never answers."""

    async def piece(request: web.Request) -> web.StreamResponse:
        if how == "silent":
            await asyncio.sleep(3600)
        out = web.StreamResponse()
        out.content_length = 1 << 20
        await out.prepare(request)
        for _ in range(3600):
            await out.write(b"\0")
            await asyncio.sleep(1.0)
        return out

    app = web.Application()
    app.router.add_get("/{tail:.*}", piece)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("how", ["dribble", "silent"])
def test_a_slow_peer_is_dropped_within_seconds(published, store, tmp_path, how):
    """Every piece of v1 is held, as far as the store knows, by a fleet member whose relay stalls or dribbles.
    Before: each piece waited up to 60 s for it. Now: dropped within the bound, the store serves instead."""

    async def main():
        runner, hostile = await _hostile_relay(how)
        agent = _agent(published, store, tmp_path / "victim")
        try:
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {STORE_TOKEN}"}) as s:
                for piece in published["pieces"]:  # the hostile member asks for every piece: it holds them all
                    async with s.get(f"{store}/versions/1/{piece}", params={"peer": hostile, "direct": "1"}) as r:
                        assert r.status == 200
                t = time.monotonic()
                client = agent.store_client(s)
                await agent.materialize(client, 1)
                return time.monotonic() - t, client, agent
        finally:
            agent.stop_relay()
            await runner.cleanup()

    seconds, client, agent = asyncio.run(main())
    bound = agent.cfg.peer_bound
    assert client.fallbacks.get("slow", 0) >= 1 and set(client.fallbacks) == {"slow"}, client.fallbacks
    assert agent.metrics.peer_fallbacks.labels("slow")._value.get() == client.fallbacks["slow"]
    # One encounter with the peer (pieces in flight at once meet it together), then the store dropped it.
    assert seconds < bound.first_byte_s + bound.window_s + 10, seconds
    assert client.bytes_from_peers <= 8  # a byte or so per piece it dribbled, none of it kept
