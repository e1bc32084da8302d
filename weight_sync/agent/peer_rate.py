"""How slow a peer may be: a floor under every transfer from another agent's relay.

A peer is a shortcut, never something to wait for: the store has every piece. A peer that stalls or
dribbles bytes (overloaded, broken, or hostile: it holds the fleet credential, so it is a fleet member gone
wrong) must cost seconds, not the minute per piece a plain timeout allowed. So a transfer from a peer is
held to two bounds (PeerBound):

    first byte   the first body byte within first_byte_s of the request (connecting, the peer's own wait
                 for a piece it is still receiving, and the response's head included)
    rate         from then on min_rate * window_s more bytes within every window_s (or the piece's end)

A peer below either is abandoned at once with reason "slow": the agent reports it to the store (which drops
it for every piece of the version) and takes the piece from the store (weight_sync.agent.fetch). A peer that
stalls or dribbles costs at most first_byte_s + window_s per piece; one that keeps just above the floor
costs at most size / min_rate, and delivers the piece. The defaults leave an honest peer far above the
floor: 256 KiB/s is 2 Mbit/s, a twentieth of a shaped 50 Mbit test link shared by eight transfers.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import AsyncIterator

import aiohttp


@dataclass
class PeerBound:
    first_byte_s: float = 5.0
    min_rate: float = 256 * 1024  # bytes per second, judged over each window
    window_s: float = 2.0

    def __post_init__(self):
        if not (self.first_byte_s > 0 and self.min_rate > 0 and self.window_s > 0):
            raise ValueError("peer bound: first_byte_s, min_rate and window_s must be > 0")


class TooSlow(Exception):
    """The peer missed its first-byte deadline, or fell below min_rate over a window."""


class Pace:
    """The deadlines of one transfer: until the first byte, then of the window now running."""

    def __init__(self, bound: PeerBound, clock=time.monotonic):
        self.bound, self.clock = bound, clock
        self.started = clock()
        self.window_start: float | None = None  # None until the first byte
        self.window_bytes = 0

    def remaining(self) -> float:
        """Seconds until the next deadline (<= 0: it has passed)."""
        if self.window_start is None:
            return self.started + self.bound.first_byte_s - self.clock()
        return self.window_start + self.bound.window_s - self.clock()

    def got(self, n: int) -> None:
        now = self.clock()
        if self.window_start is None:
            self.window_start, self.window_bytes = now, 0
        self.window_bytes += n
        if self.window_bytes >= self.bound.min_rate * self.bound.window_s:  # this window's quota: the next one
            self.window_start, self.window_bytes = now, 0


async def paced_get(
    session: aiohttp.ClientSession, url: str, bound: PeerBound, headers: dict | None = None
) -> tuple[aiohttp.ClientResponse, Pace]:
    """GET url with its head due before the first-byte deadline (TooSlow otherwise). The caller reads the body
    with paced_body(response, pace), under the same deadlines, and closes the response."""
    pace = Pace(bound)
    try:
        async with asyncio.timeout(max(0.0, pace.remaining())):
            r = await session.get(
                url,
                headers=headers or {},
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=bound.first_byte_s),
            )
    except TimeoutError:
        raise TooSlow(f"no answer within {bound.first_byte_s:g} s") from None
    return r, pace


async def paced_body(r: aiohttp.ClientResponse, pace: Pace) -> AsyncIterator[bytes]:
    """The body's blocks as they come; TooSlow as soon as a deadline passes without what it asks."""
    while True:
        try:
            async with asyncio.timeout(max(0.0, pace.remaining())):
                block = await r.content.readany()
        except TimeoutError:
            if pace.window_start is None:
                raise TooSlow(f"no first byte within {pace.bound.first_byte_s:g} s") from None
            raise TooSlow(f"below {pace.bound.min_rate / 1024:g} KiB/s over {pace.bound.window_s:g} s") from None
        if not block:
            return
        pace.got(len(block))
        yield block


class PeerFailed(Exception):
    """A peer did not give the piece: missing (404), http_error, unreachable, slow, corrupt (too many bytes)."""

    def __init__(self, peer: str, reason: str):
        super().__init__(f"peer {peer}: {reason}")
        self.peer, self.reason = peer, reason


async def from_peer(
    session: aiohttp.ClientSession, url: str, peer: str, bound: PeerBound, headers: dict, limit: int
) -> AsyncIterator[bytes]:
    """A piece from a peer's relay, block by block, under the bound; anything wrong is PeerFailed (the caller
    takes the piece from the store)."""
    try:
        r, pace = await paced_get(session, url, bound, headers)
        async with r:
            if r.status != 200:
                raise PeerFailed(peer, "missing" if r.status == 404 else "http_error")
            n = 0
            async for block in paced_body(r, pace):
                n += len(block)
                if n > limit:
                    raise PeerFailed(peer, "corrupt")
                yield block
    except (TooSlow, asyncio.TimeoutError):
        raise PeerFailed(peer, "slow") from None
    except aiohttp.ClientError:
        raise PeerFailed(peer, "unreachable") from None
