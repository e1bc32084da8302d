"""A proxy that forwards /generate bytes to a replica and does nothing else: the floor of any HTTP hop
(aiohttp + uvloop, one loopback round trip) against which the gateway's own work is read."""

import sys

import aiohttp
import uvloop
from aiohttp import web


def main(target: str, port: int) -> None:
    async def start(app):
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def forward(request):
        async with request.app["session"].post(
            f"{target}/generate", data=await request.read(), headers={"Content-Type": "application/json"}
        ) as r:
            return web.Response(body=await r.read(), status=r.status, content_type="application/json")

    async def stop(app):
        await app["session"].close()

    app = web.Application()
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/generate", forward)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
