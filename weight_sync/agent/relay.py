"""An agent's relay: other agents fetch from it the pieces of a version this agent already verified.

    <work>/relay/<version>/manifest.json, manifest.sig, chunks/<T.C>, files/<NAME>

A piece lands here only after its digest (or, for the manifest, its signature) checked, by an atomic
rename, so a file that exists is whole. The server (aiohttp, in a thread of the agent's process with its
own event loop) answers GET /versions/N/<piece> the way the store does, Range requests included, and only
to a caller with the fleet read credential (weight_sync.fleet_credential: 401 otherwise). A piece the
agent is still receiving (the store sent the asker here because this agent asked first) is waited for up
to `wait_s`, then 404; a piece it neither has nor is receiving is 404 at once. Either way the asker falls
back to the store. `wait_s` stays below the askers' first-byte deadline (weight_sync.agent.peer_rate): a relay
still waiting when the asker gives up would be taken for a slow one. Names are checked like the store's
(weight_sync.store.server.valid_piece) and paths are built from them, never taken from the request, so nothing
outside the cache is reachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from aiohttp import web

from weight_sync import fleet_credential
from weight_sync.store.relay import peer_url
from weight_sync.store.server import valid_piece, version_number

_PIECE = web.RequestKey("flywheel_relay_piece", bool)  # set when the response carries a piece's bytes


def _settle(fut: asyncio.Future) -> None:
    """Wake the waiter of `fut` (in its own loop), unless it is done already."""
    if not fut.done():
        fut.set_result(None)


@dataclass
class RelayConfig:
    root: Path  # the cache: <work>/relay
    port: int
    host: str = "127.0.0.1"
    url: str | None = None  # what peers are told to use (default http://host:port): a NAT, a proxy
    wait_s: float = 4.0  # how long a piece still arriving here is waited for before answering 404
    token: str | None = field(default=None, repr=False)  # the fleet read credential callers must show

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise ValueError(f"relay: port must be 1..65535, got {self.port}")
        if self.url is None and self.host in ("0.0.0.0", "::", ""):
            raise ValueError("relay: listening on every address, give the URL peers should use (relay_url)")
        peer_url(self.advertised)  # one the store would refuse (a path, a bad host) fails here, at start

    @property
    def advertised(self) -> str:
        return (self.url or f"http://{self.host}:{self.port}").rstrip("/")


class RelayCache:
    """The verified pieces on disk, and the ones being received (shared by the fetch and the server thread)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._receiving: dict[tuple[int, str], int] = {}
        self._waiters: dict[tuple[int, str], list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}
        self._lock = threading.Lock()

    def path(self, version: int, piece: str) -> Path:
        if not valid_piece(piece):
            raise ValueError(f"not a piece of a version: {piece!r}")
        return self.root / str(int(version)) / piece

    def has(self, version: int, piece: str) -> bool:
        return self.path(version, piece).is_file()

    @contextlib.contextmanager
    def receiving(self, version: int, piece: str):
        """While the agent fetches a piece: peers asking for it wait for it instead of being refused."""
        key = (int(version), piece)
        with self._lock:
            self._receiving[key] = self._receiving.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._receiving[key] -= 1
                if not self._receiving[key]:
                    del self._receiving[key]
                    waiters = self._waiters.pop(key, [])
                else:
                    waiters = []
            for loop, fut in waiters:  # the piece is here (put before this exit) or will not come
                with contextlib.suppress(RuntimeError):  # that relay stopped meanwhile: nobody to wake
                    loop.call_soon_threadsafe(_settle, fut)

    async def arrival(self, version: int, piece: str, timeout_s: float) -> bool:
        """Wait (on the caller's event loop) until the piece stops arriving: True if it is here then, False
        if it never was on its way, failed, or took longer than timeout_s."""
        key = (int(version), piece)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:  # registered under the lock the receiver ends under: no wake-up is lost
            receiving = key in self._receiving
            if receiving:
                self._waiters.setdefault(key, []).append((loop, fut))
        if receiving:
            try:
                await asyncio.wait_for(fut, timeout_s)
            except asyncio.TimeoutError:
                with self._lock:
                    waiting = self._waiters.get(key, [])
                    if (loop, fut) in waiting:
                        waiting.remove((loop, fut))
                return self.has(version, piece)
        return self.has(version, piece)

    def put(self, version: int, piece: str, data: bytes) -> None:
        """Keep verified bytes (written beside, then renamed: a peer never reads half a piece)."""
        dst = self.path(version, piece)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dst)

    def adopt(self, version: int, piece: str, src: Path) -> None:
        """Move a verified file in (a finished download), or copy it if it is on another filesystem."""
        dst = self.path(version, piece)
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(src, dst)
        except OSError:
            self.put(version, piece, src.read_bytes())
            src.unlink(missing_ok=True)

    def versions(self) -> list[int]:
        return sorted(v for p in self.root.iterdir() if (v := version_number(p.name)) is not None)

    def prune(self, keep: set[int]) -> None:
        """Drop the pieces of versions the agent no longer keeps (peers asking for them get 404)."""
        for v in self.versions():
            if v not in keep:
                shutil.rmtree(self.root / str(v), ignore_errors=True)


class RelayServer:
    """The relay's HTTP face, on its own thread and event loop (the agent's loop is busy with applies)."""

    def __init__(self, cfg: RelayConfig, cache: RelayCache, count: Callable[[str, int], None] | None = None):
        self.cfg = cfg
        self.cache = cache
        self.count = count or (lambda result, nbytes: None)  # (served|missing|bad|unauthorized, body bytes)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def app(self) -> web.Application:
        async def piece(request: web.Request) -> web.StreamResponse:
            v, name = version_number(request.match_info["version"]), request.match_info["piece"]
            if v is None or not valid_piece(name):
                self.count("bad", 0)
                raise web.HTTPNotFound(reason="bad version or piece name")
            path = self.cache.path(v, name)
            if not path.is_file() and not await self.cache.arrival(v, name, self.cfg.wait_s):
                self.count("missing", 0)
                raise web.HTTPNotFound(reason="not held here (or not yet)")
            request[_PIECE] = True
            return web.FileResponse(path)

        async def sent(request: web.Request, response: web.StreamResponse) -> None:
            if request.get(_PIECE) and request.method != "HEAD" and response.status in (200, 206):
                self.count("served", response.content_length or 0)

        guard = fleet_credential.middleware(self.cfg.token, "the relay", lambda reason: self.count("unauthorized", 0))
        app = web.Application(middlewares=[guard])
        app.add_routes([web.get("/versions/{version}/{piece:.+}", piece)])
        app.on_response_prepare.append(sent)
        return app

    def start(self) -> RelayServer:
        """Listen on cfg.host:cfg.port (raises if it cannot) and serve until stop()."""
        ready, failed = threading.Event(), []
        app = self.app()  # here, not in the thread: no credential to check is an error the caller sees

        def main():
            loop = self._loop = asyncio.new_event_loop()
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
            try:
                loop.run_until_complete(runner.setup())
                loop.run_until_complete(web.TCPSite(runner, self.cfg.host, self.cfg.port).start())
            except Exception as e:  # the port taken, an address not here: the agent says so and stops
                failed.append(e)
                ready.set()
                loop.run_until_complete(runner.cleanup())
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(runner.cleanup())
                loop.close()

        self._thread = threading.Thread(target=main, name=f"relay-{self.cfg.port}", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failed:
            self._thread.join()
            raise OSError(f"relay cannot listen on {self.cfg.host}:{self.cfg.port}: {failed[0]}")
        return self

    def stop(self) -> None:
        if self._thread is None or not self._thread.is_alive() or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=15)
        self._thread = None
