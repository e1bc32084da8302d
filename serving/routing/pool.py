"""The replica pool: states, health, and which replica takes a request (a policy of serving.routing).

A replica is `active` (takes user traffic), `draining` (finishes what it has, takes nothing new) or
`borrowed` (lent to the trainer for rollouts; no user traffic). Health checks take a replica that stops
answering out of rotation and bring it back when it answers again; a request that fails to connect
marks it unhealthy at once. Every change of state goes through the pool's methods (drain, end_lease,
activate, borrow, mark_failed, check, expire_drain_leases): nothing else writes `state`. An agent's drain
(with a lease) is refused on a replica an operator holds (drained without one, or borrowed).

    active --drain--> draining --activate--> active
    active --borrow--> draining (borrow pending) --last request done--> borrowed --activate--> active
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import aiohttp

from contracts.events import parse_version
from serving.config import PoolConfig, RoutingConfig
from serving.routing.cache_aware import CacheAware
from serving.routing.least_outstanding import LeastOutstanding
from serving.routing.policy import RouteRequest, RoutingPolicy
from serving.routing.replica import ReplicaHandle, ReplicaState

log = logging.getLogger(__name__)


def sglang_gauges(text: str) -> dict[str, float]:
    """Sum the samples of each metric in a Prometheus text page (SGLang labels them per model/engine)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        except ValueError:
            continue
    return out


def make_policy(cfg: RoutingConfig) -> RoutingPolicy:
    """The policy a configuration names (RoutingConfig.policy)."""
    policies = {"least_outstanding": LeastOutstanding, "cache_aware": CacheAware}
    if cfg.policy not in policies:
        raise ValueError(f"unknown routing policy {cfg.policy!r}; one of {sorted(policies)}")
    return policies[cfg.policy](cfg)


class NoReplica(Exception):
    """No healthy active replica can take the request."""


class LastActive(Exception):
    """Taking this replica from users would leave none serving them."""


class HeldByOperator(Exception):
    """An agent asked to drain a replica an operator holds (drained without a lease, or borrowed for
    rollouts): the agent's drain, and the re-activation that ends it, would undo the operator's decision."""


class ReplicaPool:
    def __init__(self, urls: list[str], cfg: PoolConfig | None = None, routing: RoutingConfig | None = None):
        self.cfg = cfg or PoolConfig()
        self.replicas: dict[str, ReplicaHandle] = {
            f"r{i}": ReplicaHandle(id=f"r{i}", url=u.rstrip("/")) for i, u in enumerate(urls)
        }
        self.policy: RoutingPolicy = make_policy(routing or RoutingConfig())  # user requests
        self._rollouts = LeastOutstanding(load=lambda r: r.rollout_outstanding)  # borrowed replicas
        self.lapsed_drains = 0
        self._task: asyncio.Task | None = None
        self._pending: set[asyncio.Task] = set()  # borrows settling
        self._session: aiohttp.ClientSession | None = None

    def get(self, replica_id: str) -> ReplicaHandle:
        if replica_id not in self.replicas:
            raise KeyError(replica_id)
        return self.replicas[replica_id]

    def pick(
        self,
        exclude: AbstractSet[str] = frozenset(),
        rollout: bool = False,
        prefer: frozenset[str] | None = None,
        req: RouteRequest | None = None,
    ) -> ReplicaHandle:
        """A healthy replica in the right state, chosen by the routing policy among the candidates.

        User requests go to active replicas (the policy's choice); rollout requests to borrowed ones
        (least outstanding rollouts). `prefer` (a canary arm's replicas) narrows the choice while one of
        them can serve; otherwise any replica serves.
        """
        want = ReplicaState.BORROWED if rollout else ReplicaState.ACTIVE
        candidates = [r for r in self.replicas.values() if r.healthy and r.state == want and r.id not in exclude]
        if prefer is not None and any(r.id in prefer for r in candidates):
            candidates = [r for r in candidates if r.id in prefer]
        if not candidates:
            raise NoReplica(f"no healthy {want.value} replica")
        if rollout:
            return self._rollouts.pick(candidates)
        return self.policy.pick(candidates, req or RouteRequest())

    # ------------------------------------------------------------------ state transitions
    def _leave_users(self, replica: ReplicaHandle, why: str) -> None:
        if replica.state == ReplicaState.ACTIVE and not any(
            r.state == ReplicaState.ACTIVE for r in self.replicas.values() if r is not replica
        ):
            raise LastActive(f"refusing to {why} {replica.id}: it is the last active replica")

    def drain(self, replica_id: str, lease_s: float | None = None) -> ReplicaHandle:
        """No new user requests; those in flight finish. With a lease (an agent switching weights) the
        drain lapses unless renewed; without (an SRE's), it holds until activated."""
        r = self.get(replica_id)
        held = r.state == ReplicaState.BORROWED or r.borrow_pending
        held = held or (r.state == ReplicaState.DRAINING and r.drain_lease_until is None)
        if lease_s is not None and held:
            raise HeldByOperator(
                f"replica {r.id} is {'borrowed' if r.borrow_pending else r.state.value} by an operator"
            )
        self._leave_users(r, "drain")
        r.state, r.borrow_pending = ReplicaState.DRAINING, False
        r.drain_lease_until = time.monotonic() + lease_s if lease_s is not None else None
        return r

    def borrow(self, replica_id: str, settle_timeout_s: float = 300.0) -> ReplicaHandle:
        """Lend to rollouts: users first, so the replica drains, and is borrowed once its last user
        request is done (within settle_timeout_s; past it, borrowed all the same)."""
        r = self.get(replica_id)
        if r.state != ReplicaState.BORROWED:
            self._leave_users(r, "borrow")
            r.state, r.borrow_pending, r.drain_lease_until = ReplicaState.DRAINING, True, None
            task = asyncio.ensure_future(self._settle_borrow(r, settle_timeout_s))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        return r

    async def _settle_borrow(self, r: ReplicaHandle, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while r.borrow_pending and r.outstanding > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if r.borrow_pending:  # not activated meanwhile
            r.state, r.borrow_pending = ReplicaState.BORROWED, False
            log.info("replica %s drained: borrowed for rollouts", r.id)

    def end_lease(self, replica_id: str) -> ReplicaHandle:
        """An agent's drain ends: users come back, unless an operator drained or borrowed the replica since
        (their decision stands; the agent's lease had become theirs)."""
        r = self.get(replica_id)
        if r.state == ReplicaState.DRAINING and r.drain_lease_until is not None:
            r.state, r.drain_lease_until = ReplicaState.ACTIVE, None
        return r

    def activate(self, replica_id: str) -> ReplicaHandle:
        """Users come back at once (from draining, borrowed, or a borrow still pending). The caller stops
        the rollouts still running there (`rollout_tasks`) for the trainer to redo."""
        r = self.get(replica_id)
        r.state, r.borrow_pending, r.drain_lease_until = ReplicaState.ACTIVE, False, None
        return r

    def served(self, replica: ReplicaHandle, weight_version: int | None) -> None:
        replica.served += 1
        if weight_version is not None:
            replica.weight_version = weight_version

    def mark_failed(self, replica: ReplicaHandle, error: str) -> None:
        if replica.healthy:
            log.warning("replica %s (%s) taken out of rotation: %s", replica.id, replica.url, error)
        replica.healthy = False
        replica.failures += 1
        replica.last_error = error
        self.policy.on_load_update(replica)

    async def check(self, replica: ReplicaHandle) -> bool:
        assert self._session is not None
        try:
            timeout = aiohttp.ClientTimeout(total=self.cfg.health_timeout_s)
            async with self._session.get(f"{replica.url}/model_info", timeout=timeout) as r:
                ok = r.status == 200
                if ok:
                    replica.weight_version = parse_version((await r.json()).get("weight_version"))
            if ok:
                async with self._session.get(f"{replica.url}/metrics", timeout=timeout) as r:
                    if r.status == 200:
                        gauges = sglang_gauges(await r.text())
                        replica.queue_depth = int(gauges.get("sglang:num_queue_reqs", 0))
                        replica.running = int(gauges.get("sglang:num_running_reqs", 0))
                        capacity = gauges.get("sglang:max_total_num_tokens")
                        replica.kv_capacity_tokens = int(capacity) if capacity else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            ok = False
            replica.last_error = f"health check: {type(e).__name__}: {e}"
        if ok and not replica.healthy:
            log.info("replica %s (%s) healthy", replica.id, replica.url)
        elif not ok and replica.healthy:
            log.warning("replica %s (%s) failed its health check: %s", replica.id, replica.url, replica.last_error)
        replica.healthy = ok
        replica.last_check = time.time()
        self.policy.on_load_update(replica)
        return ok

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(r) for r in self.replicas.values()))

    async def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        await self.check_all()
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.health_interval_s)
            try:
                self.expire_drain_leases()
                await self.check_all()
            except Exception:  # never let the health loop die
                log.exception("health check round failed")

    def expire_drain_leases(self, now: float | None = None) -> list[str]:
        """Replicas an agent drained and then went quiet about (it died mid-switch) take users again."""
        now = time.monotonic() if now is None else now
        lapsed = []
        for r in self.replicas.values():
            if r.state == ReplicaState.DRAINING and r.drain_lease_until is not None and now > r.drain_lease_until:
                log.warning(
                    "replica %s: the drain lease ran out (the agent that drained it went quiet); "
                    "routing users to it again",
                    r.id,
                )
                r.state, r.drain_lease_until, r.borrow_pending = ReplicaState.ACTIVE, None, False
                self.lapsed_drains += 1
                lapsed.append(r.id)
        return lapsed

    async def stop(self) -> None:
        for task in [self._task, *self._pending]:
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass


@dataclass
class Lease:
    """Counts a request against a replica's outstanding load for as long as it is held."""

    replica: ReplicaHandle
    rollout: bool = False
    started: float = field(default_factory=time.monotonic)

    def __enter__(self) -> ReplicaHandle:
        if self.rollout:
            self.replica.rollout_outstanding += 1
        else:
            self.replica.outstanding += 1
            self.replica.count_request()
        return self.replica

    def __exit__(self, *exc) -> None:
        if self.rollout:
            self.replica.rollout_outstanding -= 1
        else:
            self.replica.outstanding -= 1
