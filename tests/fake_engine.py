"""An in-process stand-in for an SGLang replica, for unit tests of the gateway's own logic (routing,
retries, counting) and of a switch's dealings with gateways: /generate (plain and streamed, aborted when
its client goes away, as SGLang does), /model_info, /metrics and /update_weights_from_disk as far as
those use them, with faults on request. Tests that claim to test SGLang run the real one."""

from __future__ import annotations

import asyncio
import contextlib
import time

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer


class FakeReplica:
    def __init__(self, version: int):
        self.version = version
        self.texts: list[str] = ["x = 1"]  # what the next answers say, in order (the last one repeats)
        self.finish_type = "stop"  # SGLang's finish_reason type of every answer ("length": out of tokens)
        self.fail_status: int | None = None  # answer /generate with this status before any output
        self.break_mid_stream = False  # send one chunk, then drop the connection
        # Bytes that are not an answer: the whole body (plain), or a chunk sent after `garbage_after` good ones.
        self.garbage: bytes | None = None
        self.garbage_after = 0
        self.delay_s = 0.0  # before answering
        self.rids: list[str] = []  # /generate requests seen
        self.salts: list[str | None] = []  # the cache_salt of each /generate request seen
        self.aborted: list[str] = []  # rids whose client went away while they waited (SGLang aborts those)
        self.load_s = 0.0  # how long /update_weights_from_disk takes
        self.during_load = None  # async callable run while a load is under way (a test's look at the gateways)
        self.unflushed_loads = 0  # loads answered as SGLang does when a request still ran (weights changed)
        self.flushes: list[str] = []  # /flush_cache calls seen (their query string)
        self.script = None  # input ids -> the answer's text, in place of `texts` (a policy that reads its prompt)
        self.app = web.Application()
        self.app.add_routes(
            [
                web.post("/generate", self.generate),
                web.get("/model_info", self.model_info),
                web.get("/metrics", self.metrics),
                web.post("/update_weights_from_disk", self.update_weights),
                web.post("/flush_cache", self.flush_cache),
            ]
        )

    def _out(self, text: str) -> dict:
        return {
            "text": text,
            "output_ids": [1] * max(1, len(text) // 4),
            "meta_info": {
                "weight_version": str(self.version),
                "finish_reason": {"type": self.finish_type},
                "prompt_tokens": 3,
                "output_token_logprobs": [[-0.1, 1, None]] * max(1, len(text) // 4),
            },
        }

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.rids.append(body["rid"])
        self.salts.append(body.get("cache_salt"))
        if self.delay_s and await self._client_left(request, self.delay_s):
            self.aborted.append(body["rid"])
            return web.Response(status=499)
        if self.fail_status is not None:
            return web.json_response({"error": {"message": "engine overloaded"}}, status=self.fail_status)
        if self.script is not None:
            text = self.script(body["input_ids"])
        else:
            text = self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]
        if not body.get("stream"):
            if self.garbage is not None:
                return web.Response(body=self.garbage, content_type="application/json")
            return web.json_response(self._out(text))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, end in enumerate((len(text) // 2, len(text))):  # cumulative, as SGLang sends
            if self.garbage is not None and i == self.garbage_after:
                await resp.write(b"data: " + self.garbage + b"\n\n")
                if await self._client_left(request, 0.5):  # still "generating" when the gateway gives up on it
                    self.aborted.append(body["rid"])
                return resp
            await resp.write(b"data: " + orjson.dumps(self._out(text[:end])) + b"\n\n")
            if self.break_mid_stream:
                await asyncio.sleep(0.05)
                request.transport.close()  # the replica dies with the answer half sent
                return resp
        await resp.write(b"data: [DONE]\n\n")
        return resp

    @staticmethod
    async def _client_left(request: web.Request, seconds: float) -> bool:
        """Wait `seconds`; True as soon as the client closes its connection (the gateway's way to abort)."""
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                if request.transport is None or request.transport.is_closing():
                    return True
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:  # aiohttp's test server cancels the handler of a client that left
            return True
        return False

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": str(self.version)})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def update_weights(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.during_load is not None:
            await self.during_load()
        await asyncio.sleep(self.load_s)
        self.version = int(body["weight_version"])
        if self.unflushed_loads:
            self.unflushed_loads -= 1
            message = (
                "Weights were updated, but the cache was not flushed because requests are still running or "
                "queued. Retract or finish them, then call /flush_cache."
            )
            return web.json_response({"success": False, "message": message}, status=400)
        return web.json_response({"success": True, "message": "ok"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        self.flushes.append(request.query_string)
        return web.Response(text="Cache flushed.\n")


@contextlib.asynccontextmanager
async def gateway_over_fakes(test_model, state_dir, versions: list[int], tenants: int = 40, **cfg):
    """A gateway in this process in front of len(versions) fake replicas: yields (client, fakes).
    Health checks run once at start (the interval is an hour): a replica marked failed stays out."""
    from serving.config import GatewayConfig, PoolConfig
    from serving.gateway import Gateway

    fakes = [FakeReplica(v) for v in versions]
    servers = [TestServer(f.app) for f in fakes]
    for s in servers:
        await s.start_server()
    gw = Gateway(
        GatewayConfig(
            replicas=[str(s.make_url("")).rstrip("/") for s in servers],
            model_dir=test_model,
            state_dir=state_dir,
            api_keys=",".join(f"u{i}:key-u{i}" for i in range(tenants)),
            admin_token="admin-secret",
            pool=PoolConfig(health_interval_s=3600),
            **{"log_events": False, **cfg},
        )
    )
    client = TestClient(TestServer(gw.app))
    client.gateway = gw  # tests look at its state (stores, sessions) directly
    await client.start_server()
    try:
        yield client, fakes
    finally:
        await client.close()
        for s in servers:
            await s.close()


def run_with_sdk(test_model, tmp_path, versions: list[int], make_sdk, scenario, **cfg):
    """scenario(client, fakes, sdk) against a gateway over fake replicas, `sdk` an official client made by
    make_sdk(the gateway's base URL) and closed after."""

    async def main():
        async with gateway_over_fakes(test_model, tmp_path / "gw", versions, **cfg) as (client, fakes):
            sdk = make_sdk(str(client.make_url("")).rstrip("/"))
            try:
                return await scenario(client, fakes, sdk)
            finally:
                await sdk.close()

    return asyncio.run(main())
