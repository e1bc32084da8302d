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
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Literal, get_args

import aiohttp

from flywheel.core.events import parse_version

# drain: the gateway routes around the replica while it loads; no_pause: load while serving (a request spans
# both versions); retract: pause, retract running requests, load, resume (facts.md: hot-switch modes)
SwitchMode = Literal["drain", "no_pause", "retract"]
MODES = get_args(SwitchMode)
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
            session, f"{gw.url}/admin/replicas/{gw.replica_id}/drain", {"lease_s": DRAIN_LEASE_S}, headers=headers
        )
        if status != 409:
            break
        # Refused as the last active replica. If another one is draining (switching), wait for our turn:
        # replicas switch one at a time. If none will come back, switch in place.
        async with session.get(f"{gw.url}/admin/replicas", headers=headers) as r:
            others = [x for x in (await r.json())["replicas"] if x["id"] != gw.replica_id]
        if not any(x["state"] == "draining" and x["healthy"] for x in others) or time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    if status != 200:
        raise SwitchError(f"gateway refused to drain {gw.replica_id} ({status}): {out}")
    renewed = time.monotonic()
    while time.monotonic() < deadline:
        async with session.get(f"{gw.url}/admin/replicas", headers=headers) as r:
            reps = {x["id"]: x for x in (await r.json())["replicas"]}
        if reps[gw.replica_id]["outstanding"] == 0:
            return True
        if time.monotonic() - renewed > DRAIN_LEASE_S / 3:  # a long wait for stragglers keeps the lease
            await _post(
                session, f"{gw.url}/admin/replicas/{gw.replica_id}/drain", {"lease_s": DRAIN_LEASE_S}, headers=headers
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
                timeout=10,
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
    )
    if status != 200:
        raise SwitchError(f"gateway refused to re-activate {gw.replica_id} ({status}): {out}")


async def switch(
    replica_url: str,
    model_dir: str,
    version: int,
    mode: SwitchMode = "drain",
    gateway: GatewayLink | None = None,
    drain_timeout_s: float = 120.0,
) -> dict:
    """Switch the replica; returns the mode used and the time of each phase (ms)."""
    if mode not in MODES:
        raise ValueError(f"unknown switch mode {mode!r}; choose from {MODES}")
    timings: dict = {}
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as session:
        used = mode
        if mode == "drain":
            if gateway is None:
                used = "no_pause"
            else:
                t = time.monotonic()
                try:
                    drained = await _drain(session, gateway, drain_timeout_s)
                except BaseException:
                    await _activate_quietly(session, gateway)  # a drain it may have begun
                    raise
                timings["drain_ms"] = 1000 * (time.monotonic() - t)
                if not drained:
                    used = "no_pause"  # the last active replica: the gateway keeps routing to it
        renew = asyncio.ensure_future(_renew_drain(session, gateway)) if used == "drain" else None
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
            if renew is not None:
                renew.cancel()  # and wait for it: a renewal in flight must not drain it again after
                await asyncio.gather(renew, return_exceptions=True)
            if used == "drain":
                await _activate(session, gateway)
        now = await served_version(session, replica_url)
        if now != version:
            raise SwitchError(f"replica reports version {now} after switching to {version}")
    timings["total_ms"] = 1000 * (time.monotonic() - t0)
    return {"mode": used, **{k: round(v, 1) for k, v in timings.items()}}
