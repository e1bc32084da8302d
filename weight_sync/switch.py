"""Hot-switch one SGLang replica to a checkpoint directory, without failing or cutting short a request.

Modes (facts.md measured all three on a machine like ours; benchmarks.delta compares them again):
  drain     the gateway stops routing to the replica, in-flight requests finish, the weights load with
            the prefix cache flushed, the gateway routes to it again. No request waits on the switch;
            the fleet default (DESIGN: p99 during a fleet switch <= 1.1x steady).
  no_pause  SGLang's update takes its writer lock: it waits for running requests and holds new ones
            while loading; no request mixes versions. The default for a lone replica (the gateway will
            not drain its last active replica).
  retract   pause with retract (running requests are requeued, their KV recomputed after the update),
            load, continue. A request's tokens then span two versions, and its meta_info says so.
Never `abort` (drops requests), never `in_place` without a flush (keeps KV computed by the old weights).

More than one gateway (behind a load balancer) routes to the same replica, so a drain is asked of each.
One that cannot be reached is passed over: a dead gateway routes nothing, and one that is alive but cut off
sees a switch in place (SGLang holds its requests during the load; none mixes versions). A gateway that
refuses (the replica is its last active one) makes the whole switch one in place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Literal, get_args

import aiohttp

from flywheel.core.events import parse_version

log = logging.getLogger(__name__)

# drain: the gateway routes around the replica while it loads; no_pause: load while serving (a request spans
# both versions); retract: pause, retract running requests, load, resume (facts.md: hot-switch modes)
SwitchMode = Literal["drain", "no_pause", "retract"]
MODES = get_args(SwitchMode)
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


async def _post(session, url, body=None, headers=None, timeout=300.0) -> tuple[int, dict]:
    async with session.post(
        url, json=body or {}, headers=headers or {}, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as r:
        try:
            data = await r.json(content_type=None)
        except ValueError:
            data = {"text": await r.text()}
        return r.status, data or {}


async def served_version(session: aiohttp.ClientSession, replica_url: str) -> int | None:
    async with session.get(f"{replica_url}/model_info", timeout=aiohttp.ClientTimeout(total=10)) as r:
        return parse_version((await r.json()).get("weight_version"))


async def _load(session, replica_url: str, model_dir: str, version: int) -> float:
    t = time.monotonic()
    status, out = await _post(
        session,
        f"{replica_url}/update_weights_from_disk",
        {"model_path": model_dir, "weight_version": str(version), "flush_cache": True, "abort_all_requests": False},
    )
    if status != 200 or not out.get("success"):
        raise SwitchError(f"update_weights_from_disk failed ({status}): {out.get('message', out)}")
    return time.monotonic() - t


async def _drain(session, gw: GatewayLink, timeout_s: float) -> bool:
    """Ask the gateway to drain the replica; False if it refuses (the last active replica)."""
    headers = {"Authorization": f"Bearer {gw.admin_token}"}
    deadline = time.monotonic() + timeout_s
    while True:
        status, out = await _post(
            session,
            f"{gw.url}/admin/replicas/{gw.replica_id}/drain",
            {"lease_s": DRAIN_LEASE_S},
            headers=headers,
            timeout=ADMIN_TIMEOUT_S,
        )
        if status != 409:
            break
        # Refused as the last active replica. If another one is draining (switching), wait for our turn:
        # replicas switch one at a time. If none will come back, switch in place.
        async with session.get(f"{gw.url}/admin/replicas", headers=headers, timeout=_admin_timeout()) as r:
            others = [x for x in (await r.json())["replicas"] if x["id"] != gw.replica_id]
        if not any(x["state"] == "draining" and x["healthy"] for x in others) or time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    if status != 200:
        raise SwitchError(f"gateway refused to drain {gw.replica_id} ({status}): {out}")
    renewed = time.monotonic()
    while time.monotonic() < deadline:
        async with session.get(f"{gw.url}/admin/replicas", headers=headers, timeout=_admin_timeout()) as r:
            reps = {x["id"]: x for x in (await r.json())["replicas"]}
        if reps[gw.replica_id]["outstanding"] == 0:
            return True
        if time.monotonic() - renewed > DRAIN_LEASE_S / 3:  # a long wait for stragglers keeps the lease
            await _post(
                session,
                f"{gw.url}/admin/replicas/{gw.replica_id}/drain",
                {"lease_s": DRAIN_LEASE_S},
                headers=headers,
                timeout=ADMIN_TIMEOUT_S,
            )
            renewed = time.monotonic()
        await asyncio.sleep(0.05)
    return True  # still busy: the update's writer lock waits for the stragglers


async def _renew_drain(session, gw: GatewayLink) -> None:
    """Keep the drain's lease alive while this agent works: if the agent dies mid-switch, the lease runs
    out and the gateway routes to the replica again by itself."""
    headers = {"Authorization": f"Bearer {gw.admin_token}"}
    while True:
        await asyncio.sleep(DRAIN_LEASE_S / 3)
        try:
            await _post(
                session,
                f"{gw.url}/admin/replicas/{gw.replica_id}/drain",
                {"lease_s": DRAIN_LEASE_S},
                headers=headers,
                timeout=ADMIN_TIMEOUT_S,
            )
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass


async def _activate_quietly(session, gw: GatewayLink) -> None:
    try:
        await _activate(session, gw)
    except (SwitchError, aiohttp.ClientError, asyncio.TimeoutError):
        pass


async def _activate(session, gw: GatewayLink) -> None:
    status, out = await _post(
        session,
        f"{gw.url}/admin/replicas/{gw.replica_id}/activate",
        headers={"Authorization": f"Bearer {gw.admin_token}"},
        timeout=ADMIN_TIMEOUT_S,
    )
    if status != 200:
        raise SwitchError(f"gateway refused to re-activate {gw.replica_id} ({status}): {out}")


def _admin_timeout() -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=ADMIN_TIMEOUT_S)


def _unreachable(e: BaseException) -> bool:
    return isinstance(e, (aiohttp.ClientConnectionError, asyncio.TimeoutError))


async def _drain_all(session, gws: list[GatewayLink], timeout_s: float) -> list[GatewayLink] | None:
    """Drain the replica on every gateway. Returns those that drained it, or None when it is to be switched
    in place (a gateway refused, or none could be reached); the ones drained then route to it again."""
    results = await asyncio.gather(*(_drain(session, gw, timeout_s) for gw in gws), return_exceptions=True)
    drained = [gw for gw, r in zip(gws, results, strict=True) if r is True]
    errors = [r for r in results if isinstance(r, BaseException)]
    for gw, r in zip(gws, results, strict=True):
        if isinstance(r, BaseException) and _unreachable(r):
            log.warning("gateway %s unreachable (%s): switching %s without it", gw.url, type(r).__name__, gw.replica_id)
    fatal = [e for e in errors if not _unreachable(e)]
    if fatal or any(r is False for r in results) or not drained:
        await asyncio.gather(*(_activate_quietly(session, gw) for gw in gws))  # drains it may have begun
        if fatal:
            raise fatal[0]
        return None
    return drained


async def _activate_all(session, gws: list[GatewayLink]) -> None:
    """Route to the replica again on every gateway that drained it. One that has gone away since is passed
    over (a gateway starts with every replica active); a refusal is an error."""
    results = await asyncio.gather(*(_activate(session, gw) for gw in gws), return_exceptions=True)
    for gw, r in zip(gws, results, strict=True):
        if isinstance(r, BaseException) and _unreachable(r):
            log.warning("gateway %s unreachable to re-activate %s (%s)", gw.url, gw.replica_id, type(r).__name__)
    fatal = [r for r in results if isinstance(r, BaseException) and not _unreachable(r)]
    if fatal:
        raise fatal[0]


async def switch(
    replica_url: str,
    model_dir: str,
    version: int,
    mode: SwitchMode = "drain",
    gateway: GatewayLink | list[GatewayLink] | None = None,
    drain_timeout_s: float = 120.0,
) -> dict:
    """Switch the replica; returns the mode used and the time of each phase (ms). `gateway`: the one, or
    every one, that routes to the replica (drain mode)."""
    if mode not in MODES:
        raise ValueError(f"unknown switch mode {mode!r}; choose from {MODES}")
    gws = [gateway] if isinstance(gateway, GatewayLink) else list(gateway or [])
    timings: dict = {}
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as session:
        used, drained = mode, []
        if mode == "drain":
            if not gws:
                used = "no_pause"
            else:
                t = time.monotonic()
                try:
                    drained = await _drain_all(session, gws, drain_timeout_s)
                except asyncio.CancelledError:
                    await asyncio.gather(*(_activate_quietly(session, gw) for gw in gws))
                    raise
                timings["drain_ms"] = 1000 * (time.monotonic() - t)
                if drained is None:
                    used, drained = "no_pause", []  # the last active replica somewhere: it keeps serving
        renew = [asyncio.ensure_future(_renew_drain(session, gw)) for gw in drained]
        try:
            if used == "retract":
                t = time.monotonic()
                await _post(session, f"{replica_url}/pause_generation", {"mode": "retract"})
                try:
                    timings["load_ms"] = 1000 * await _load(session, replica_url, model_dir, version)
                finally:  # a failed load must not leave the replica paused
                    await _post(session, f"{replica_url}/continue_generation", {})
                timings["pause_ms"] = 1000 * (time.monotonic() - t)
            else:
                timings["load_ms"] = 1000 * await _load(session, replica_url, model_dir, version)
                # drain: nothing was routed here meanwhile; no_pause: requests were held during the load.
                timings["pause_ms"] = 0.0 if used == "drain" else timings["load_ms"]
        finally:
            for r in renew:
                r.cancel()  # and wait for them: a renewal in flight must not drain it again after
            await asyncio.gather(*renew, return_exceptions=True)
            if drained:
                await _activate_all(session, drained)
        now = await served_version(session, replica_url)
        if now != version:
            raise SwitchError(f"replica reports version {now} after switching to {version}")
    timings["total_ms"] = 1000 * (time.monotonic() - t0)
    return {"mode": used, **{k: round(v, 1) for k, v in timings.items()}}
