"""The drains a switch holds on the gateways that route to its replica (weight_sync.agent.switch): asked of each
gateway in one order, renewed while the replica loads (a lease: an agent that dies mid-switch never leaves
its replica draining), ended after (through admin_api.client); and the JSON POST the switch makes to its replica.

A gateway that cannot be reached is passed over; one that refuses (the replica is its last active one)
makes the switch one in place; one where an operator holds the replica (drained or borrowed) is left so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import aiohttp

from admin_api.client import AsyncAdminClient
from admin_api.types import DrainBody, ReplicaView

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 10.0  # a gateway's admin call; one cut off must not hold the switch for minutes
DRAIN_LEASE_S = 30.0  # an agent's drain lapses unless renewed: a dead agent never leaves a replica draining


class SwitchError(Exception):
    pass


@dataclass
class GatewayLink:
    """How an agent reaches its replica's entry in the gateway (to drain it during a switch)."""

    url: str
    admin_token: str
    replica_id: str


async def post_json(session, url, body=None, headers=None, timeout=300.0) -> tuple[int, dict]:
    async with session.post(
        url, json=body or {}, headers=headers or {}, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as r:
        try:
            data = await r.json(content_type=None)
        except ValueError:
            data = {"text": await r.text()}
        return r.status, data or {}


HELD = "held"  # _drain: an operator holds the replica on that gateway (drained or borrowed): users are not routed there


def _admin(session, gw: GatewayLink) -> AsyncAdminClient:
    return AsyncAdminClient(session, gw.url, gw.admin_token, timeout=ADMIN_TIMEOUT_S)


async def _ask_drain(session, gw: GatewayLink) -> tuple[int, dict]:
    """Drain the replica on the gateway under this agent's lease (granting it, or renewing it)."""
    return await _admin(session, gw).replica_action(gw.replica_id, "drain", DrainBody(lease_s=DRAIN_LEASE_S))


async def _replicas(session, gw: GatewayLink) -> list[ReplicaView]:
    return list((await _admin(session, gw).replicas())[1]["replicas"])


async def _drain(session, gw: GatewayLink, deadline: float) -> bool | str:
    """Ask the gateway to drain the replica and wait (until `deadline`, monotonic) for its requests there to
    finish; False if it refuses (the last active replica); HELD if an operator holds it (nothing to drain,
    and nothing to re-activate after: their decision stands)."""
    while True:
        status, out = await _ask_drain(session, gw)
        if status == 409 and (out.get("error") or {}).get("code") == "held_by_operator":
            return HELD
        if status != 409:
            break
        # Refused as the last active replica. If another one is draining for a switch (its drain has a
        # lease: it comes back), wait for our turn: replicas switch one at a time. If none will come back
        # (an SRE's drain has no lease), switch in place.
        others = [x for x in await _replicas(session, gw) if x["id"] != gw.replica_id]
        switching = [
            x for x in others if x["state"] == "draining" and x["healthy"] and x.get("drain_lease_s") is not None
        ]
        if not switching or time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    if status != 200:
        raise SwitchError(f"gateway refused to drain {gw.replica_id} ({status}): {out}")
    renewed = time.monotonic()
    while time.monotonic() < deadline:
        mine = [x for x in await _replicas(session, gw) if x["id"] == gw.replica_id]
        if not mine or mine[0].get("outstanding", 0) == 0:
            return True
        if time.monotonic() - renewed > DRAIN_LEASE_S / 3:  # a long wait for stragglers keeps the lease
            await _ask_drain(session, gw)
            renewed = time.monotonic()
        await asyncio.sleep(0.05)
    return True  # still busy: the update's writer lock waits for the stragglers


async def _renew_drain(session, gw: GatewayLink) -> None:
    """Keep the drain's lease alive while this agent works: if the agent dies mid-switch, the lease runs
    out and the gateway routes to the replica again by itself."""
    while True:
        await asyncio.sleep(DRAIN_LEASE_S / 3)
        try:
            await _ask_drain(session, gw)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass


async def _undrain_quietly(session, gw: GatewayLink) -> None:
    try:
        await _undrain(session, gw)
    except (SwitchError, aiohttp.ClientError, asyncio.TimeoutError):
        pass


async def _undrain(session, gw: GatewayLink) -> None:
    """End this agent's drain: users come back, unless an operator drained or borrowed the replica meanwhile.
    A gateway from before `undrain` (404 not_found) is re-activated, as agents did then."""
    admin = _admin(session, gw)
    status, out = await admin.replica_action(gw.replica_id, "undrain")
    if status == 404 and (out.get("error") or {}).get("code") == "not_found":
        status, out = await admin.replica_action(gw.replica_id, "activate")
    if status != 200:
        raise SwitchError(f"gateway refused to re-activate {gw.replica_id} ({status}): {out}")


def _unreachable(e: BaseException) -> bool:
    return isinstance(e, (aiohttp.ClientConnectionError, asyncio.TimeoutError))


class Drains:
    """The drains one switch holds on its gateways, each renewed from the moment it is granted."""

    def __init__(self, session):
        self.session = session
        self.held: list[GatewayLink] = []
        self.passed_over: list[GatewayLink] = []  # unreachable (dead, or cut off after it took the drain)
        self._renewals: list[asyncio.Task] = []

    async def take(self, gws: list[GatewayLink], timeout_s: float) -> bool:
        """Drain the replica on each gateway in turn, in one order for every agent (sorted by URL), so
        agents switching at once never hold a drain on one gateway while waiting on another. False: switch
        in place instead (a gateway refused: the replica is its last active one; or none could be reached);
        every drain taken is undone then, and on any error."""
        deadline = time.monotonic() + timeout_s  # one wait for all of them
        try:
            for gw in sorted(gws, key=lambda g: g.url):
                # Counted as passed over (re-activated quietly on release) until granted: a drain asked for
                # and then cut short (an error, a cancel, while waiting for stragglers) is undone too.
                self.passed_over.append(gw)
                try:
                    granted = await _drain(self.session, gw, deadline)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    if not _unreachable(e):
                        raise
                    log.warning(
                        "gateway %s unreachable (%s): switching %s without it", gw.url, type(e).__name__, gw.replica_id
                    )
                    continue
                if granted == HELD:  # not routed to users there: nothing to drain, nor to undo
                    self.passed_over.remove(gw)
                    log.info("gateway %s: %s is held by an operator; left as it is", gw.url, gw.replica_id)
                    continue
                if not granted:
                    await self.release(quiet=True)
                    return False
                self.passed_over.remove(gw)
                self.held.append(gw)
                self._renewals.append(asyncio.ensure_future(_renew_drain(self.session, gw)))
        except BaseException:
            await self.release(quiet=True)
            raise
        if not self.held:
            await self.release(quiet=True)
            return False
        return True

    async def release(self, quiet: bool = False) -> None:
        """Stop renewing, then route to the replica again on every gateway: those passed over too (one may
        have taken the drain before it stopped answering), quietly. A gateway that refuses to re-activate
        is an error unless quiet; one that has gone away is passed over (a gateway starts with every replica
        active)."""
        for r in self._renewals:
            r.cancel()  # and wait for them: a renewal in flight must not drain it again after
        await asyncio.gather(*self._renewals, return_exceptions=True)
        self._renewals.clear()
        held, passed = self.held, self.passed_over
        self.held, self.passed_over = [], []
        results = await asyncio.gather(*(_undrain(self.session, gw) for gw in held), return_exceptions=True)
        await asyncio.gather(*(_undrain_quietly(self.session, gw) for gw in passed))
        for gw, res in zip(held, results, strict=True):
            if isinstance(res, BaseException) and (quiet or _unreachable(res)):
                log.warning("gateway %s: %s not re-activated (%s)", gw.url, gw.replica_id, type(res).__name__)
        fatal = [r for r in results if isinstance(r, BaseException) and not (quiet or _unreachable(r))]
        if fatal:
            raise fatal[0]
