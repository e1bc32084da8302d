"""Tenants' policies put into effect: the keys file is the source (serving.auth), this gateway's spool and
the tenants topic follow it.

A change, whichever way it came (this gateway's admin API, another gateway's, `flywheel keys policy` on the
file), is applied once: a tenant forgotten has its records skipped and redacted in this gateway's spool first
(serving.event_log.pipeline.EventLog.forget), then a TenantRecord per key id goes on the tenants topic, where the
trainer (online_rl.data.tenants) drops what it holds of the tenant and skips the rest. At start every tenant with a
policy is announced again: a change made while this gateway was down still reaches the trainer. Each record
carries its policy's version (serving.auth.Policy.version) and readers keep the highest, so a gateway restarted
on a stale keys file re-announces an older policy that cannot undo a newer deny or forget.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from contracts import events as ev
from serving.auth import Policy

if TYPE_CHECKING:
    from serving.auth import KeyStore
    from serving.event_log.pipeline import EventLog
    from serving.event_log.sink import EventSink
    from serving.response_store import ResponseStore

log = logging.getLogger(__name__)


class TenantPolicies:
    def __init__(
        self,
        keys: KeyStore,
        responses: ResponseStore,
        events: EventLog,
        sink: EventSink,
        log_events: bool,
        durable_wait_s: float,
        poll_s: float = 1.0,
        sweep_s: float = 600.0,
    ):
        """keys: the source; responses: the stored answers a policy keeps or forgets; events and sink: this
        gateway's spool (log_events False: nothing is logged, so nothing to redact or announce);
        durable_wait_s: how long a record may take to reach the disk (at least 5 s)."""
        self.keys, self.responses, self.events, self.sink = keys, responses, events, sink
        self.log_events, self.durable_wait_s = log_events, durable_wait_s
        self.poll_s, self.sweep_s = poll_s, sweep_s
        self.applied: dict[str, Policy] = {}  # name -> the policy this gateway has put into effect
        self.applied_ids: dict[str, list[str]] = {}  # name -> its key ids when it was applied (a new key: again)
        self.retry: dict[str, Policy] = {}  # name -> a policy not yet in effect (a slow or full spool): tried again
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self._apply(dict(self.keys.policies), announce_all=True)
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def sync(self) -> None:
        """Read the keys file now and apply what changed (and what failed to apply before); returns once it
        is in effect (the spool redacted, the records on disk for Kafka)."""
        async with self._lock:
            changed = {**self.retry, **(self.keys.reload_if_changed(min_interval_s=0) or {})}
            self.retry = {}
            if changed:
                await self._apply(changed)

    async def _poll(self) -> None:
        swept = 0.0
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.sync()
            except Exception:  # noqa: BLE001 - a bad file or a slow spool must not end the polling
                log.exception("applying tenant policies failed; retrying")
            if time.monotonic() - swept > self.sweep_s:  # stored responses past their retention
                swept = time.monotonic()
                try:
                    await self.responses.run(self.responses.expire)
                except Exception:  # noqa: BLE001 - a locked or full store must not end the polling
                    log.exception("expiring stored responses failed; retrying")

    async def _apply(self, changed: dict[str, Policy], announce_all: bool = False) -> None:
        tenants = self.keys.tenants()
        for name, policy in changed.items():
            ids = tenants.get(name, [])
            if policy == self.applied.get(name) and ids == self.applied_ids.get(name) and not announce_all:
                continue
            try:
                done = await self._apply_one(name, policy, ids)
            except Exception:  # noqa: BLE001 - one tenant's trouble must not stop the others'
                log.exception("applying tenant %s's policy failed", name)
                done = False
            if done:
                self.applied[name], self.applied_ids[name] = policy, ids
            else:  # not in effect: the keys file says so, this gateway keeps trying (the admin API answers 503)
                self.retry[name] = policy

    async def _apply_one(self, name: str, policy: Policy, ids: list[str]) -> bool:
        """Put one tenant's policy into effect: forget in the spool first, then its records durably on the
        spool for the tenants topic. False when either could not be done now."""
        before = self.applied.get(name, Policy())
        for i in ids:  # stored Responses answers: kept as long as the tenant lets us, forgotten with the rest
            self.responses.retention[i] = policy.retention_days
        if policy.forgotten_before is not None:
            gone = await self.responses.run(self.responses.forget, ids, policy.forgotten_before)
            if gone:
                log.info("tenant %s: %d stored responses forgotten", name, gone)
        if not self.log_events:  # nothing is logged, so nothing to redact or announce
            return True
        if policy.forgotten_before is not None and policy.forgotten_before != before.forgotten_before:
            forgotten = {i: policy.forgotten_before for i in ids}
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.events.forget, forgotten)
            except (OSError, TimeoutError) as e:  # its record waits: the spool must be clean of it first
                log.error("forgetting tenant %s in the spool failed (%s); retrying", name, e)
                return False
            log.info("tenant %s forgotten up to %.3f (%d key ids)", name, policy.forgotten_before, len(ids))
        if policy.train != before.train:
            log.info("tenant %s: train %s", name, policy.train)
        records = [
            ev.TenantRecord(
                tenant=i,
                name=name,
                train=policy.train,
                retention_days=policy.retention_days,
                forgotten_before=policy.forgotten_before,
                version=policy.version,  # as read: an older one re-announced from a stale file loses to a newer
            )
            for i in ids
        ]
        futures = [self.sink.submit(ev.TOPIC_TENANTS, r.key, r.encode()) for r in records]
        if any(f is None for f in futures):  # the spool refused it (full): the trainer would never hear of it
            log.error("tenant %s's policy record could not be spooled (the spool is full); retrying", name)
            return False
        if futures:
            _, late = await asyncio.wait([f for f in futures if f is not None], timeout=max(self.durable_wait_s, 5.0))
            if late:  # written later all the same; sending it again costs a duplicate the topic compacts away
                log.error("tenant %s's policy record is not on disk yet; retrying", name)
                return False
        return True
