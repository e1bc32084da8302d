"""Worst-case time to fetch a version (what a rollback to a version not held locally costs) when the peers
the store sends an agent to are hostile fleet members (issue #48, item 1).

In this process: the store server (Store.app over a published v0 and v1, a 20% delta in 4 chunks, 7 pieces
with manifest, signature and config), a hostile relay, and one honest agent with its relay that
materializes v1. The hostile member holds the fleet read credential and tells the store it holds every piece
of v1 (`?peer=URL`):
- static: once, before the agent starts (the store drops it at the agent's first report);
- reregister: again and again (every 20 ms), so the store keeps sending the agent there: every piece meets it.
Its relay either dribbles (answers at once, one byte a second) or is silent (never answers).

    python -m benchmarks.hostile_peers

Runs on code before the peer bound too (it passes the credential only where the code takes one), so the
same script gives the before and after figures. Prints one JSON object: seconds per scenario and the
agent's fallbacks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import aiohttp
import torch
from aiohttp import web
from safetensors.torch import save_file

from infra.procs import free_port
from weight_sync.agent.loop import Agent, AgentConfig
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, publish
from weight_sync.store.server import Store

TOKEN = "bench-fleet-read-credential"
SCENARIOS = os.environ.get("HOSTILE_SCENARIOS", "static-dribble,reregister-dribble,static-silent,reregister-silent")


def _publish(tmp: Path) -> tuple[Path, list[str]]:
    g = torch.Generator().manual_seed(0)
    tensors = {f"layers.{i}.w": (torch.randn(256, 1024, generator=g) * 0.02).to(torch.bfloat16) for i in range(2)}
    dirs = []
    for n in range(2):
        d = tmp / f"m{n}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "synthetic"}))
        save_file(tensors, str(d / "model.safetensors"))
        dirs.append(d)
        for k, t in tensors.items():
            bits = t.view(torch.int16)
            tensors[k] = torch.where(torch.rand(t.shape, generator=g) < 0.2, bits + 1, bits).view(torch.bfloat16)
    generate_key(tmp / "k.pem", tmp / "k.pub")
    cfg = PublishConfig(store=tmp / "store", private_key=tmp / "k.pem", chunk_elems=1 << 17)
    for d in dirs:
        publish(d, cfg)
    vdir = Store(cfg.store).version_dir(1)
    pieces = ["manifest.json", "manifest.sig"]
    pieces += [f"{d.name}/{f.name}" for d in (vdir / "chunks", vdir / "files") for f in sorted(d.iterdir())]
    return dirs[0], pieces


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _hostile_app(how: str) -> web.Application:
    async def piece(request: web.Request) -> web.StreamResponse:
        if how == "silent":
            await asyncio.sleep(3600)
        out = web.StreamResponse()
        out.content_length = 1 << 20
        await out.prepare(request)
        try:
            for _ in range(3600):
                await out.write(b"\0")
                await asyncio.sleep(1.0)
        except ConnectionError:  # the agent gave up on it
            pass
        return out

    app = web.Application()
    app.router.add_get("/{tail:.*}", piece)
    return app


def _store_app(store: Path) -> web.Application:
    try:
        return Store(store).app(token=TOKEN)
    except TypeError:  # code from before the fleet read credential
        return Store(store).app()


def _agent(tmp: Path, name: str, store: str, v0: Path) -> Agent:
    kw = {"store_token": TOKEN} if "store_token" in {f.name for f in dataclasses.fields(AgentConfig)} else {}
    agent = Agent(
        AgentConfig(
            name=name,
            replica_url="http://127.0.0.1:9",
            store_url=store,
            public_key=tmp / "k.pub",
            work_dir=tmp / name,
            initial_model=v0,
            relay_port=free_port(),
            relay_wait_s=4.0,
            **kw,
        )
    )
    agent.start_relay()
    return agent


async def _scenario(tmp: Path, v0: Path, pieces: list[str], name: str) -> dict:
    when, how = name.split("-")
    store_runner, store = await _serve(_store_app(tmp / "store"))
    hostile_runner, hostile = await _serve(_hostile_app(how))
    agent = _agent(tmp, name, store, v0)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    done = asyncio.Event()
    try:
        async with aiohttp.ClientSession(headers=auth) as s:

            async def register() -> None:
                for piece in pieces:
                    async with s.head(f"{store}/versions/1/{piece}", params={"peer": hostile, "direct": "1"}) as r:
                        assert r.status == 200, r.status

            await register()
            keeper = None
            if when == "reregister":

                async def keep() -> None:
                    while not done.is_set():
                        await asyncio.sleep(0.02)
                        await register()

                keeper = asyncio.create_task(keep())
            t = time.monotonic()
            async with aiohttp.ClientSession() as own:
                client = agent.store_client(own)
                await agent.materialize(client, 1)
            seconds = time.monotonic() - t
            done.set()
            if keeper is not None:
                await keeper
    finally:
        agent.stop_relay()
        await hostile_runner.cleanup()
        await store_runner.cleanup()
    return {"seconds": round(seconds, 1), "fallbacks": client.fallbacks, "bytes_from_peers": client.bytes_from_peers}


def main() -> None:
    out: dict = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        v0, pieces = _publish(tmp)
        out["pieces"] = len(pieces)
        for name in SCENARIOS.split(","):
            out[name] = asyncio.run(_scenario(tmp, v0, pieces, name))
            print(name, out[name], flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
