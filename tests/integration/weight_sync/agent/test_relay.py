"""The peer relay: agents fetch a version's pieces from each other, the store sends it about once.

A real store server (`flywheel weights serve`, a fresh tracker per test) and real agents, each with its
relay server on loopback, materializing a published delta concurrently in one event loop (the relay is
about materialization: no replicas here; tests/integration/weight_sync/test_weight_sync.py switches replicas).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import torch
from safetensors.torch import load_file, save_file

from infra.procs import free_port
from tests.helpers import STORE_TOKEN, get, loopback_app, store_server
from weight_sync import fleet_credential
from weight_sync.agent.loop import Agent, AgentConfig
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, publish
from weight_sync.store.server import Store

pytestmark = pytest.mark.timeout(180)
AUTH = fleet_credential.headers(STORE_TOKEN)  # the fleet read credential store_server() wants


def _checkpoint(d: Path, tensors: dict) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "synthetic", "tensors": len(tensors)}))
    (d / "tokenizer.json").write_text(json.dumps({"vocab": [f"tok{i}" for i in range(2000)]}))
    save_file(tensors, str(d / "model.safetensors"))
    return d


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """v0 (8 bf16 tensors, 8 MB) and v1 (a delta: 20% of elements moved by 1 ULP), in small chunks."""
    root = tmp_path_factory.mktemp("relay-weights")
    g = torch.Generator().manual_seed(0)
    tensors = {f"layers.{i}.w": (torch.randn(512, 1024, generator=g) * 0.02).to(torch.bfloat16) for i in range(8)}
    v0 = _checkpoint(root / "v0", tensors)
    for k, t in tensors.items():
        bits = t.view(torch.int16)
        tensors[k] = torch.where(torch.rand(t.shape, generator=g) < 0.2, bits + 1, bits).view(torch.bfloat16)
    v1 = _checkpoint(root / "v1", tensors)
    generate_key(root / "k.pem", root / "k.pub")
    cfg = PublishConfig(store=root / "store", private_key=root / "k.pem", chunk_elems=1 << 17)  # 4 chunks a tensor
    publish(v0, cfg)
    publish(v1, cfg)
    vdir = Store(root / "store").version_dir(1)
    sizes = {"chunk": sum(f.stat().st_size for f in (vdir / "chunks").iterdir())}
    sizes["file"] = sum(f.stat().st_size for f in (vdir / "files").iterdir())
    sizes["manifest"] = sum((vdir / n).stat().st_size for n in ("manifest.json", "manifest.sig"))
    sizes["total"] = sum(sizes.values())
    return {"root": root, "v0": v0, "v1": v1, "delta": sizes}


@pytest.fixture
def store(published):
    with store_server(published["root"] / "store") as url:
        yield url


@pytest.fixture
def agents(published, store, tmp_path):
    """make(name, relay=True): an agent (its relay started); every relay is stopped at the end."""
    made = []

    def make(name: str, relay: bool = True) -> Agent:
        agent = Agent(
            AgentConfig(
                name=name,
                replica_url="http://127.0.0.1:9",  # never called: materialize only
                store_url=store,
                public_key=published["root"] / "k.pub",
                work_dir=tmp_path / name,
                initial_model=published["v0"],
                relay_port=free_port() if relay else 0,
                relay_wait_s=4.0,
                store_token=STORE_TOKEN,
            )
        )
        agent.start_relay()
        made.append(agent)
        return agent

    yield make
    for a in made:
        a.stop_relay()


def materialize(*agents: Agent, version: int = 1) -> list:
    """Every agent rebuilds `version` at once; returns their StoreClients (byte counts, fallbacks)."""

    async def main():
        async with aiohttp.ClientSession() as s:
            clients = [a.store_client(s) for a in agents]
            await asyncio.gather(*(a.materialize(c, version) for a, c in zip(agents, clients, strict=True)))
            return clients

    return asyncio.run(main())


def assert_bit_identical(agent: Agent, want: Path) -> None:
    got = load_file(str(agent.local_dir(1) / "model.safetensors"))
    ref = load_file(str(want / "model.safetensors"))
    assert got.keys() == ref.keys()
    for k in ref:
        assert torch.equal(got[k].view(torch.int16), ref[k].view(torch.int16)), k
    assert (agent.local_dir(1) / "tokenizer.json").read_bytes() == (want / "tokenizer.json").read_bytes()


def status(url: str, token: str | None = STORE_TOKEN) -> int:
    """The HTTP status of a GET, with the fleet read credential unless told otherwise."""
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=fleet_credential.headers(token)), timeout=30
        ) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def sent(store: str) -> dict:
    status, body = get(f"{store}/stats", key=STORE_TOKEN)
    assert status == 200
    return json.loads(body)


def test_three_agents_get_a_version_from_the_store_about_once(published, store, agents):
    trio = [agents(f"a{i}") for i in range(3)]
    clients = materialize(*trio)
    delta = published["delta"]
    for a in trio:
        assert_bit_identical(a, published["v1"])
    stats = sent(store)
    assert stats["sent_bytes"]["chunk"] <= 1.5 * delta["chunk"], (stats, delta)
    assert stats["sent_bytes_total"] <= 1.5 * delta["total"], (stats, delta)
    from_peers = sum(c.bytes_from_peers for c in clients)
    assert from_peers >= 1.5 * delta["total"], "the peers served the rest"
    assert sum(c.bytes_from_store for c in clients) + from_peers == 3 * delta["total"]
    assert sum(a.metrics.relay_sent._value.get() for a in trio) == from_peers
    assert sum(a.metrics.fetched.labels("peer")._value.get() for a in trio) == from_peers
    assert not any(c.fallbacks for c in clients)
    assert stats["redirects"]["chunk"] > 0 and stats["redirects"]["manifest"] > 0 and stats["redirects"]["file"] > 0
    # An agent without a relay is served by the store as before relays existed.
    (plain,) = materialize(agents("plain", relay=False))
    assert plain.bytes_from_peers == 0 and plain.bytes_from_store == delta["total"]
    assert sent(store)["sent_bytes_total"] == stats["sent_bytes_total"] + delta["total"]
    # Pruned versions leave the relay cache too.
    trio[0].state["version"] = 1
    trio[0].cfg.keep_local = 1
    trio[0]._prune()
    assert trio[0].relay_cache.versions() == [1]


def test_a_peer_that_is_down_costs_a_store_fetch_not_the_version(published, store, agents):
    first = agents("first")
    materialize(first)
    first.stop_relay()  # it holds every piece as far as the store knows, and answers nothing
    late = [agents("late0"), agents("late1")]
    clients = materialize(*late)
    for a in late:
        assert_bit_identical(a, published["v1"])
    assert sum(c.fallbacks.get("unreachable", 0) for c in clients) >= 1
    assert sum(a.metrics.peer_fallbacks.labels("unreachable")._value.get() for a in late) >= 1
    # The store dropped the dead peer for the whole version at the first report: about one more delta.
    assert sent(store)["sent_bytes_total"] <= 2.5 * published["delta"]["total"]
    assert sent(store)["tracker"]["holders_dropped"] >= 1


@pytest.mark.parametrize("piece", ["chunks/3.1", "files/tokenizer.json", "manifest.json"])
def test_a_peer_serving_corrupt_bytes_is_caught_by_digest_and_replaced(published, store, agents, piece):
    liar = agents("liar")
    materialize(liar)
    cached = liar.relay_cache.path(1, piece)
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0x55
    cached.write_bytes(bytes(data))
    (late,) = (agents("late"),)
    (client,) = materialize(late)
    assert_bit_identical(late, published["v1"])
    assert client.fallbacks == {"corrupt": 1}
    assert late.metrics.peer_fallbacks.labels("corrupt")._value.get() == 1
    assert late.relay_cache.path(1, piece).read_bytes() != bytes(data), "the lie is not passed on"


def test_a_peer_replaying_another_versions_signed_manifest_is_caught_and_replaced(published, store, agents):
    """v0's manifest and signature are genuine, but not v1's: a peer passing them off as v1's must cost one
    store fetch, not get v1 rejected."""
    liar = agents("liar")
    materialize(liar)
    v0 = Store(published["root"] / "store").version_dir(0)
    for name in ("manifest.json", "manifest.sig"):
        liar.relay_cache.path(1, name).write_bytes((v0 / name).read_bytes())
    late = agents("late")
    (client,) = materialize(late)
    assert_bit_identical(late, published["v1"])
    assert client.fallbacks == {"corrupt": 1}


def test_bad_requests_to_a_relay_or_the_store_are_4xx(published, store, agents):
    a = agents("a")
    materialize(a)
    relay = a.cfg.relay_config().advertised
    assert status(f"{relay}/versions/1/chunks/0.0") == 200
    for path in (
        "/versions/x/chunks/0.0",
        "/versions/%C2%B2/chunks/0.0",  # "²": str.isdigit takes it, int() does not (was a 500)
        "/versions/%D9%A1/chunks/0.0",  # Arabic-Indic "1": int() reads it as 1 (was an alias of v1)
        "/versions/" + "1" * 5000 + "/chunks/0.0",  # past int()'s digit limit
        "/versions/1/chunks/0.0.0",
        "/versions/1/chunks/..%2F..%2Fstate.json",
        "/versions/1/files/..",
        "/versions/1/files/a%2Fb",
        "/versions/1/head",
        "/versions/9/chunks/0.0",  # a version it does not hold
        "/state.json",
    ):
        assert status(f"{relay}{path}") == 404, path
    assert a.metrics.relay_requests.labels("bad")._value.get() >= 4
    ok = f"{store}/versions/1/chunks/0.0"
    assert status(f"{ok}?peer=http://127.0.0.1:1") == 200
    for query in ("peer=ftp://x:1", "peer=http://h:1/p", "failed=nonsense", "peer=http://h:1&direct=2"):
        assert status(f"{ok}?{query}") == 400, query
    assert status(f"{store}/versions/1/chunks/..%2Fmanifest.json?peer=http://h:1") == 404
    for v in ("%C2%B2", "%D9%A1", "1" * 5000):
        assert status(f"{store}/versions/{v}/manifest.json") == 404, v
    before = sent(store)["sent_bytes_total"]
    head = urllib.request.Request(f"{store}/versions/1/manifest.json", method="HEAD", headers=AUTH)
    with urllib.request.urlopen(head) as r:
        assert r.status == 200 and int(r.headers["Content-Length"]) > 0
    assert sent(store)["sent_bytes_total"] == before, "a HEAD sends no body"
    code, text = get(f"{store}/metrics")
    assert code == 200 and "flywheel_store_sent_bytes_total" in text


def test_a_proxy_redirecting_to_the_store_is_followed_with_or_without_a_relay(published, store, agents):
    """Only the store's redirects to a peer (marked X-Flywheel-Peer) are a peer's; any other is followed."""
    from aiohttp import web

    async def main(relayed: Agent, plain: Agent):
        async def hop(request):
            raise web.HTTPTemporaryRedirect(f"{store}{request.path_qs}")

        runner, url = await loopback_app(hop)
        try:
            relayed.cfg.store_url = plain.cfg.store_url = url
            async with aiohttp.ClientSession() as s:
                clients = [relayed.store_client(s), plain.store_client(s)]
                await asyncio.gather(relayed.materialize(clients[0], 1), plain.materialize(clients[1], 1))
                return clients
        finally:
            await runner.cleanup()

    first = agents("first")
    materialize(first)
    relayed, plain = agents("relayed"), agents("plain", relay=False)
    c_relayed, c_plain = asyncio.run(main(relayed, plain))
    for a in (relayed, plain):
        assert_bit_identical(a, published["v1"])
    assert c_relayed.bytes_from_peers > 0 and not c_relayed.fallbacks
    assert c_plain.bytes_from_peers == 0 and c_plain.bytes_from_store == published["delta"]["total"]
