"""The agent's in-place switch (weight_sync.agent.inplace builds and persists the patch): when a version can go to
the replica as only what changed over the version it serves, the switch that hands it over, and the warm-up
of that path; the loop (weight_sync.agent.loop) falls back to a reload from disk whenever this says None."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp

from weight_sync.agent import inplace
from weight_sync.agent.fetch import FetchError, StoreClient
from weight_sync.agent.rejected import Rejected
from weight_sync.agent.switch import InPlace, LoadRefused, served_version, switch, takes_patches

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from weight_sync.agent.config import AgentConfig
    from weight_sync.agent.local import LocalCopies
    from weight_sync.agent.metrics import AgentMetrics
    from weight_sync.agent.switch import GatewayLink

log = logging.getLogger(__name__)


@dataclass
class InPlaceParts:
    """What the in-place switch uses of its agent (weight_sync.agent.loop builds one)."""

    cfg: AgentConfig
    metrics: AgentMetrics
    local: LocalCopies
    pool: Executor
    gateways: Callable[[], list[GatewayLink]]


async def apply(agent: InPlaceParts, client: StoreClient, session, version: int, t0: float) -> dict | None:
    """Switch by handing the replica only what changed (weight_sync.agent.inplace), when `version` is a delta
    against the version the replica serves. None: not possible here, or it failed in a way a reload
    from disk repairs (the engine refused the patch, the local base is damaged): the caller reloads."""
    if not agent.cfg.inplace or agent.local.path(version).exists():
        return None
    manifest = await agent.local.manifest(client, version)
    base_dir = agent.local.path(manifest.base_version or 0)
    if (
        manifest.kind != "delta"
        or manifest.base_version != agent.local.state["version"]
        or not base_dir.exists()
        or not inplace.supported(manifest)
        # what the replica serves, not what this agent last did: one restarted by its supervisor serves
        # its launch checkpoint until the agent notices
        or await served_version(session, agent.cfg.replica_url) != manifest.base_version
        or not await takes_patches(session, agent.cfg.replica_url)
    ):
        return None
    out, t_patch = agent.local.work / "patches" / f"v{version}.safetensors", time.monotonic()
    try:
        patch = await inplace.build_patch(client, manifest, base_dir, agent.pool, out)
    except FetchError as e:
        raise Rejected("fetch_failed", str(e)) from None
    except (ValueError, KeyError) as e:  # the base or the delta: the rebuild from disk tells which
        agent.metrics.inplace_fallbacks.labels("patch_failed").inc()
        log.warning("v%d: no in-place patch (%s: %s); rebuilding it whole", version, type(e).__name__, e)
        out.unlink(missing_ok=True)
        return None
    patch_ms = 1000 * (time.monotonic() - t_patch)
    try:
        agent.metrics.phase.labels("patch").observe(patch_ms / 1000)
        t = time.monotonic()
        try:
            load = InPlace(str(patch.path.resolve()), manifest.base)
            report = await switch(
                agent.cfg.replica_url,
                None,
                version,
                agent.cfg.switch_mode,
                agent.gateways(),
                patch=load,
                restore_dir=str(base_dir.resolve()),
            )
        except LoadRefused as e:
            agent.metrics.inplace_fallbacks.labels("refused").inc()
            log.warning("replica %s refused the in-place patch of v%d (%s): reloading it", agent.cfg.name, version, e)
            return None
        agent.metrics.phase.labels("switch").observe(time.monotonic() - t)
        serving_ms = 1000 * (time.monotonic() - t0)
        t = time.monotonic()
        if not await agent.local.persist_patch(version, manifest.base, patch):
            return None  # over a damaged base: the caller rebuilds the version from the store, reloads it
    finally:
        patch.path.unlink(missing_ok=True)
    return {
        "apply": "in_place",
        **report,
        "serving_ms": round(serving_ms, 1),
        "patch_ms": round(patch_ms, 1),  # fetching what changed and writing the patch
        "persist_ms": round(1000 * (time.monotonic() - t), 1),
        "patch_tensors": patch.tensors,
        "patch_bytes": patch.bytes,
        "patch_sparse_elems": patch.sparse_elems,
        "patch_full_elems": patch.full_elems,
    }


async def warm(agent: InPlaceParts) -> dict | None:
    """Warm the replica's in-place path so that its first patch costs what later ones do: a patch that
    changes nothing but names every tensor (weight_sync.agent.inplace.warmup_patch), handed over in the agent's
    switch mode (drained or paused like a switch: SGLang holds requests while its loader runs), which
    keeps the label and the prefix cache. At agent start, and after the agent puts a restarted replica
    back on its version. Best effort: a failure is logged, and the first switch pays for it (or falls
    back to a reload). Returns the loader's outcome (or the error), None when there is no in-place path."""
    version = agent.local.state["version"]
    base = agent.local.path(version)
    if not agent.cfg.inplace or not base.exists():
        return None
    out = agent.local.work / "patches" / "warmup.safetensors"
    t = time.monotonic()
    try:
        async with aiohttp.ClientSession() as session:
            if not await takes_patches(session, agent.cfg.replica_url):
                return None
        await asyncio.get_running_loop().run_in_executor(agent.pool, inplace.warmup_patch, base, out)
        load = InPlace(str(out.resolve()), version, warmup=True)
        report = await switch(agent.cfg.replica_url, None, version, agent.cfg.switch_mode, agent.gateways(), patch=load)
        result = report.get("engine") or {"ok": False, "error": "no outcome from the engine's loader"}
    except Exception as e:  # best effort, never the agent's end
        log.warning("replica %s: could not warm its in-place path (%s: %s)", agent.cfg.name, type(e).__name__, e)
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    finally:
        out.unlink(missing_ok=True)
    result["warm_s"] = round(time.monotonic() - t, 3)
    (log.info if result.get("ok") else log.warning)("replica %s: in-place path warmed: %s", agent.cfg.name, result)
    return result
