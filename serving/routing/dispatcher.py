"""Runs one choice of a request on the fleet: pick a replica, hold a lease on it, retry on another if it
fails before the first byte, and log the completion event.

    pick (canary arm, routing policy) -> Lease -> engine.generate[_stream] -> policy.on_complete
        EngineUnavailable (before any output) -> replica out of rotation, next replica
        ReplicaBroke (after output started)   -> replica out of rotation, the request fails (502)
        client gone / cancelled               -> the connection to the replica closes: SGLang aborts it

Aborting is closing the connection: SGLang aborts a request whose client went away (a stream when its
response ends, a plain request at its next disconnect check), and /abort_request takes the replica's
admin key, which only its weight agent holds (contracts.replica_keys).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import numpy as np

from contracts import events as ev
from serving.auth import Tenant
from serving.canary_split import CanarySplit
from serving.event_log import completion
from serving.event_log.sink import EventSink
from serving.protocol.openai import GenerationSpec
from serving.protocol.schema import ApiError
from serving.replica import engine
from serving.routing.policy import RouteRequest
from serving.routing.pool import Lease, NoReplica, ReplicaPool
from serving.routing.replica import ReplicaHandle, ReplicaState
from serving.tenants.cache_scope import CacheScopes

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client closed its connection mid-stream (IDE clients cancel all the time)."""


@dataclass
class DispatchConfig:
    max_attempts: int = 3  # replicas tried for one request that fails before its first byte
    request_timeout_s: float = 300.0
    layers: int = 0  # of the served model: the shape of routed experts
    top_k: int = 0


class Dispatcher:
    def __init__(self, pool: ReplicaPool, sink: EventSink, metrics, cfg: DispatchConfig):
        self.pool, self.sink, self.metrics, self.cfg = pool, sink, metrics, cfg
        self.canary: CanarySplit | None = None  # a trial in progress (weight_sync.canary.controller starts and ends it)
        self.session: aiohttp.ClientSession | None = None
        # A tenant's training policy now, when its completion is logged (the gateway reads it from its key
        # store): a long request that began before a `train: deny` is logged under the deny.
        self.train_policy: Callable[[Tenant], str] = lambda tenant: tenant.train
        # Told of every user completion served (the gateway's index for clients' own telemetry:
        # serving.signals.served_index)
        self.on_served: Callable[[Tenant, GenerationSpec, str, int, str], None] | None = None
        # Each tenant's prefix-cache scope (the gateway sets it from its id secret; None: one shared scope)
        self.cache_scopes = CacheScopes(None)

    # ------------------------------------------------------------------ choosing
    def pick(
        self,
        tried: set[str],
        rollout: bool,
        borrowed_only: bool = False,
        tenant: str | None = None,
        req: RouteRequest | None = None,
    ):
        if not rollout:
            prefer = None
            if self.canary is not None and tenant is not None:  # a user stays on its arm during a trial
                ids = set(self.pool.replicas)
                prefer = (
                    self.canary.replicas
                    if self.canary.arm_of(tenant) == "canary"
                    else frozenset(ids - self.canary.replicas)
                )
            return self.pool.pick(exclude=tried, prefer=prefer, req=req)
        try:  # rollouts go to borrowed replicas; without an off-peak scheduler lending some, to any replica
            return self.pool.pick(exclude=tried, rollout=True)
        except NoReplica:
            if borrowed_only:
                raise
            return self.pool.pick(exclude=tried)  # no prompt: rollouts spread by load, not by cache

    def pool_version(self) -> str:
        """The weight versions users are being served from now (the streaming header)."""
        versions = sorted(
            {
                r.weight_version
                for r in self.pool.replicas.values()
                if r.healthy and r.state == ReplicaState.ACTIVE and r.weight_version is not None
            }
        )
        return ",".join(map(str, versions))

    # ------------------------------------------------------------------ running
    async def run_choice(
        self,
        body: dict,
        stream: bool,
        on_chunk=None,
        rollout: bool = False,
        borrowed_only: bool = False,
        tenant: str | None = None,
    ) -> tuple[engine.EngineResult, str, dict]:
        """One choice on one replica; retried on another if the replica fails before its first byte.
        Returns the result, the replica's id and the timings (ttft_ms when streamed, e2e_ms)."""
        tried: set[str] = set()
        last: Exception | None = None
        # The replica reuses a prefix only within the tenant's scope, and the router's index names it the same
        scope = self.cache_scopes.of(tenant)
        if scope is not None:
            body["cache_salt"] = scope
        req = RouteRequest(tokens=body["input_ids"], tenant=tenant, scope=scope)
        for attempt in range(self.cfg.max_attempts):
            try:
                replica = self.pick(tried, rollout, borrowed_only, tenant, req)
            except NoReplica as e:
                last = e
                break
            tried.add(replica.id)
            if attempt:
                self.metrics.retries.inc()
            t0 = time.monotonic()
            timing: dict[str, float | None] = {"ttft_ms": None}
            try:
                with Lease(replica, rollout=rollout):
                    run = self._generate(replica, body, stream, on_chunk, t0, timing)
                    res = await (self._stoppable(replica, body["rid"], run) if rollout else run)
            except engine.EngineUnavailable as e:  # before any output: another replica takes it
                self.pool.mark_failed(replica, str(e))
                last = e
                continue
            except engine.ReplicaBroke as e:  # after output started: the request fails, the replica is out
                self.pool.mark_failed(replica, str(e))
                raise ApiError(502, f"engine: {e}", "server_error", code="replica_failed") from None
            except engine.EngineError as e:
                raise ApiError(
                    400 if e.status < 500 else 502,
                    f"engine: {e}",
                    "invalid_request_error" if e.status < 500 else "server_error",
                ) from None
            self.pool.served(replica, res.latest_version)
            if not rollout:
                self.pool.policy.on_complete(replica, req, res.cached_tokens)
                self.metrics.count_prompt(replica.id, self.pool.policy.name, res.prompt_tokens, res.cached_tokens)
            timing["e2e_ms"] = 1000 * (time.monotonic() - t0)
            return res, replica.id, timing
        if self.canary is not None and tenant is not None:
            self.canary.failed(tenant)
        raise ApiError(503, f"no replica could serve the request ({last})", "server_error", code="no_replica")

    async def _generate(self, replica: ReplicaHandle, body, stream, on_chunk, t0, timing) -> engine.EngineResult:
        assert self.session is not None, "start() opened it"
        args = (self.session, replica.url, body, self.cfg.layers, self.cfg.top_k, self.cfg.request_timeout_s)
        if not stream:
            return await engine.generate(*args)
        res = None
        async for delta, res in engine.generate_stream(*args):
            if timing["ttft_ms"] is None:
                timing["ttft_ms"] = 1000 * (time.monotonic() - t0)
            await on_chunk(delta, res)
        if res is None:
            raise engine.EngineUnavailable("stream ended before any output")
        return res

    # ------------------------------------------------------------------ aborting
    async def _stoppable(self, replica: ReplicaHandle, rid: str, run) -> engine.EngineResult:
        """A rollout that users coming back can stop (abort_rollouts): its connection to the replica closes
        (SGLang aborts it) and the trainer gets finish_reason abort, to redo it."""
        task = asyncio.ensure_future(run)
        replica.rollout_tasks[rid] = task
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if task.cancelled() and me is not None and me.cancelling() == 0:  # stopped here, not by our caller
                return engine.EngineResult(finish={"type": "abort", "message": "the replica went back to users"})
            raise
        finally:
            replica.rollout_tasks.pop(rid, None)

    async def abort_rollouts(self, replica: ReplicaHandle) -> None:
        for task in list(replica.rollout_tasks.values()):
            task.cancel()

    # ------------------------------------------------------------------ logging
    def log_completion(
        self,
        tenant: Tenant,
        spec: GenerationSpec,
        cid: str,
        i: int,
        prompt_ids: list[int],
        res: engine.EngineResult,
        replica_id: str,
        timing: dict,
        source: str = "user",
    ) -> asyncio.Future | None:
        """Counts the completion (and, in a canary trial, on its arm) and submits its event; the future
        resolves when the event is on disk."""
        self.metrics.completions.labels(source).inc()
        arm = ""
        if self.canary is not None and source == "user":
            arm = self.canary.served(cid, replica_id, timing.get("e2e_ms") or 0.0)
        if source == "user":
            e2e_ms = timing.get("e2e_ms")
            latency_s = None if e2e_ms is None else e2e_ms / 1000
            self.metrics.versions.served(cid, i, res.weight_version, latency_s, spec.kind)
        self.metrics.completion_tokens.labels(source).inc(len(res.output_ids))
        if source == "user" and self.on_served is not None:
            self.on_served(tenant, spec, cid, i, res.text)
        if not self.sink.enabled:
            return None
        event, meta = completion.completion_record(
            spec,
            res,
            completion_id=cid,
            choice_index=i,
            tenant=tenant.id,
            prompt_ids=prompt_ids,
            replica=replica_id,
            timing=timing,
            source=source,
            arm=arm,
            withheld=self.train_policy(tenant) == "deny",  # served and counted; nothing the code wrote or saw is logged
            experts_shape=(self.cfg.layers, self.cfg.top_k),
        )
        return self.sink.submit(ev.TOPIC_COMPLETIONS, cid, event.encode(), meta=meta)

    def experts(self, res: engine.EngineResult) -> np.ndarray:
        """(tokens, layers, top_k) uint8; empty when the replica returned none."""
        if res.routed_experts is not None:
            return res.routed_experts
        return np.zeros((0, self.cfg.layers, self.cfg.top_k), np.uint8)
