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
refuses (the replica is its last active one) makes the whole switch one in place (weight_sync.agent.gateway_drains).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal, get_args

import aiohttp

from contracts import replica_keys
from contracts.events import parse_version
from weight_sync.agent.gateway_drains import ADMIN_TIMEOUT_S, Drains, GatewayLink, SwitchError, post_json

log = logging.getLogger(__name__)

# drain: the gateway routes around the replica while it loads; no_pause: load while serving (a request spans
# both versions); retract: pause, retract running requests, load, resume (facts.md: hot-switch modes)
SwitchMode = Literal["drain", "no_pause", "retract"]
MODES = get_args(SwitchMode)


class LoadRefused(SwitchError):
    """The replica answered the load itself with an error (a checkpoint or patch it would not take).
    partial: a patch's loader had written some tensors before it failed (the weights are neither version)."""

    def __init__(self, message: str, partial: bool = False):
        super().__init__(message)
        self.partial = partial


async def _admin_post(session, url: str, body=None, timeout: float = 300.0) -> tuple[int, dict]:
    """A control call on the replica: with its admin key, held by this agent only (contracts.replica_keys)."""
    return await post_json(session, url, body, headers=replica_keys.admin_headers(), timeout=timeout)


async def served_version(session: aiohttp.ClientSession, replica_url: str) -> int | None:
    async with session.get(
        f"{replica_url}/model_info", headers=replica_keys.inference_headers(), timeout=aiohttp.ClientTimeout(total=10)
    ) as r:
        return parse_version((await r.json()).get("weight_version"))


async def _load(
    session, replica_url: str, model_dir: str | None, version: int, patch: InPlace | None = None
) -> tuple[float, dict]:
    """Load a checkpoint directory from disk, or apply a patch file in place (weight_sync.agent.inplace). Returns
    the seconds it took and, for a patch, what the engine's loader reported."""
    t = time.monotonic()
    if patch is None:
        status, out = await _admin_post(
            session,
            f"{replica_url}/update_weights_from_disk",
            {"model_path": model_dir, "weight_version": str(version), "flush_cache": True, "abort_all_requests": False},
        )
    else:
        status, out = await _load_patch(session, replica_url, patch, None if patch.warmup else version)
    engine = out.get("engine") or {}  # what the patch's loader did (a flush below answers with other fields)
    if status == 400 and "cache was not flushed" in str(out.get("message", "")):
        # The weights did change, but a request still running or queued in SGLang (one finishing as the
        # drain ended) kept the prefix cache, which holds KV of the old weights: flush it once that is done
        # (SGLang waits up to `timeout` for it).
        status, out = await _admin_post(session, f"{replica_url}/flush_cache?timeout=30", timeout=60)
        out["success"] = status == 200
    if status != 200 or not out.get("success"):
        how = "update_weights_from_disk" if patch is None else "in-place patch"
        raise LoadRefused(f"{how} failed ({status}): {out.get('message', out)}", partial=bool(out.get("partial")))
    return time.monotonic() - t, engine


class InPlace:
    """A patch file (weight_sync.agent.inplace) for the replica to apply in place, and the version it applies to.
    Serialized when made, before any drain or pause: the agent's first import of torch takes seconds."""

    def __init__(self, path: str, base_version: int, warmup: bool = False):
        import base64
        import io
        from multiprocessing.reduction import ForkingPickler

        import torch
        import torch.multiprocessing

        from weight_patch import format as weight_patch

        if not weight_patch.valid_path(path):
            raise ValueError(f"a patch is an absolute path to a .safetensors file, not {path!r}")
        # warmup: a patch that changes nothing (weight_sync.agent.inplace.warmup_patch): the label and the prefix
        # cache stay; the loader only places every tensor and loads its loops.
        self.path, self.base_version, self.warmup = path, base_version, warmup
        torch.multiprocessing.set_sharing_strategy("file_system")  # facts.md: how CPU tensors reach SGLang
        self._marker = torch.zeros(1)  # the engine opens its shared memory: kept alive as long as this is
        buf = io.BytesIO()
        ForkingPickler(buf).dump([(weight_patch.PATH_PREFIX + path, self._marker)])
        self.payload = base64.b64encode(buf.getvalue()).decode()


async def _load_patch(session, replica_url: str, patch: InPlace, version: int | None) -> tuple[int, dict]:
    """SGLang takes tensors from an HTTP caller only inside a weight-update session, serialized for its
    multiprocessing unpickler; the patch itself stays in its file, named by the one tensor sent. version
    None: a warm-up patch (InPlace.warmup): the label and the prefix cache stay."""
    from weight_patch import format as weight_patch

    Path(weight_patch.result_path(patch.path)).unlink(missing_ok=True)  # an earlier attempt's is not this one's
    status, out = await _admin_post(session, f"{replica_url}/begin_weight_update", {})
    if status == 400 and "already open" in str(out.get("message", "")):  # left open by an agent that died
        await _admin_post(session, f"{replica_url}/end_weight_update", {})
        status, out = await _admin_post(session, f"{replica_url}/begin_weight_update", {})
    if status != 200:
        return status, out
    try:
        status, out = await _admin_post(
            session,
            f"{replica_url}/update_weights_from_tensor",
            {
                "serialized_named_tensors": [patch.payload],
                "load_format": weight_patch.LOADER,
                "weight_version": None if version is None else str(version),
                "flush_cache": version is not None,
                "abort_all_requests": False,
            },
        )
    finally:
        await _admin_post(session, f"{replica_url}/end_weight_update", {})
    result = weight_patch.read_result(patch.path)
    Path(weight_patch.result_path(patch.path)).unlink(missing_ok=True)
    out["engine"] = result  # what the loader did, and how long it took
    if not result.get("ok") and version is not None:
        # SGLang has put the new version's label on weights the loader did not change (or, if writing itself
        # failed, changed only in part), also when it answers 400 for a prefix cache a running request kept:
        # the label goes back while the replica is still drained or paused, and the caller reloads the version
        # from disk (never a flush and a "switch" to base weights labelled new).
        await _admin_post(
            session,
            f"{replica_url}/update_weight_version",
            {"new_version": str(patch.base_version), "abort_all_requests": False},
            timeout=ADMIN_TIMEOUT_S,
        )
        return 400, {
            "success": False,
            "partial": result.get("written", 0) > 0,
            # The loader's error; SGLang's own when it answered an error before the loader ran (no outcome).
            "message": f"the engine refused the patch ({result.get('written', 0)} tensors written): "
            f"{result.get('error') if status == 200 or 'written' in result else out.get('message', out)}",
        }
    return status, out


async def takes_patches(session, replica_url: str) -> bool:
    """Whether the replica was started with our in-place loader (serving.replica.process does; one started by hand
    may not be, and SGLang's scheduler stops on a load format it does not know), on a single rank."""
    from weight_patch import format as weight_patch

    async with session.get(
        f"{replica_url}/server_info", headers=replica_keys.inference_headers(), timeout=aiohttp.ClientTimeout(total=10)
    ) as r:
        if r.status != 200:
            return False
        info = await r.json(content_type=None)
    # One rank holding the whole model: the loader places whole tensors, and SGLang reads the one
    # serialized payload as rank 0's (a second rank would find none).
    single = all(int(info.get(k) or 1) == 1 for k in ("tp_size", "pp_size", "dp_size", "ep_size"))
    return single and weight_patch.LOADER in (info.get("custom_weight_loader") or [])


async def _load_or_restore(
    session, replica_url: str, model_dir: str | None, version: int, patch: InPlace | None, restore_dir: str | None
) -> tuple[float, dict]:
    """_load; a patch refused after it wrote part of the weights reloads `restore_dir` (the base, on disk) at
    once, before the switch lets users back (drain, retract). In no_pause mode (no gateway would drain it)
    requests run on between the refusal and this reload; if the reload fails too, the agent's own reload of
    the version from disk follows."""
    try:
        return await _load(session, replica_url, model_dir, version, patch)
    except LoadRefused as e:
        if patch is not None and e.partial and restore_dir is not None:
            log.error("%s: a refused patch changed part of the weights; reloading v%d", replica_url, patch.base_version)
            await _load(session, replica_url, restore_dir, patch.base_version)
        raise


async def switch(
    replica_url: str,
    model_dir: str | None,
    version: int,
    mode: SwitchMode = "drain",
    gateway: GatewayLink | list[GatewayLink] | None = None,
    drain_timeout_s: float = 120.0,
    patch: InPlace | None = None,
    restore_dir: str | None = None,
) -> dict:
    """Switch the replica to a checkpoint directory, or by a patch file applied in place; returns the mode
    used and the time of each phase (ms). `gateway`: the one, or every one, that routes to the replica
    (drain mode). A load the replica refuses raises LoadRefused; `restore_dir`: the patch's base on disk,
    reloaded before the drain ends if a refused patch changed part of the weights."""
    if mode not in MODES:
        raise ValueError(f"unknown switch mode {mode!r}; choose from {MODES}")
    gws = [gateway] if isinstance(gateway, GatewayLink) else list(gateway or [])
    timings: dict = {}
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as session:
        used, drains = mode, Drains(session)
        if mode == "drain":
            if not gws:
                used = "no_pause"
            else:
                t = time.monotonic()
                if not await drains.take(gws, drain_timeout_s):
                    used = "no_pause"  # the last active replica somewhere: it keeps serving
                timings["drain_ms"] = 1000 * (time.monotonic() - t)
                if drains.passed_over:  # those hold their requests during the load (a switch in place there)
                    timings["gateways_passed_over"] = len(drains.passed_over)
        try:
            if used == "retract":
                t = time.monotonic()
                await _admin_post(session, f"{replica_url}/pause_generation", {"mode": "retract"})
                try:
                    seconds, engine = await _load_or_restore(
                        session, replica_url, model_dir, version, patch, restore_dir
                    )
                    timings["load_ms"] = 1000 * seconds
                finally:  # a failed load must not leave the replica paused
                    await _admin_post(session, f"{replica_url}/continue_generation", {})
                timings["pause_ms"] = 1000 * (time.monotonic() - t)
            else:
                seconds, engine = await _load_or_restore(session, replica_url, model_dir, version, patch, restore_dir)
                timings["load_ms"] = 1000 * seconds
                # drain: nothing was routed here meanwhile; no_pause: requests were held during the load.
                timings["pause_ms"] = 0.0 if used == "drain" else timings["load_ms"]
        finally:
            await drains.release()
        now = await served_version(session, replica_url)
        if now != version:
            raise SwitchError(f"replica reports version {now} after switching to {version}")
    timings["total_ms"] = 1000 * (time.monotonic() - t0)
    report = {"mode": used, **{k: round(v, 1) for k, v in timings.items()}}
    return {**report, "engine": engine} if engine else report
