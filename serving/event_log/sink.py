"""The gateway's side of the event log: submit an event, and wait (boundedly) until it is spooled.

A response waits until its completion or feedback event is written to the spool, so a gateway that crashes never
loses an event its client was answered for (a machine crash: at most the spool's sync window, or nothing in strict
mode: serving.event_log.pipeline); past `durable_wait_s` (disk full, failing) the response goes out anyway,
counted: serving does not stop for the spool.

Within a window the loop also keeps a timer for when the oldest unsynced record turns late (3/4 of the window): were
the writer thread late and no event submitted meanwhile, the loop syncs it then (serving.event_log.sync_window).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time

from serving.event_log.pipeline import EventLog


class EventSink:
    def __init__(self, events: EventLog, answered_before_durable, enabled: bool = True, durable_wait_s: float = 2.0):
        self.events, self.enabled, self.durable_wait_s = events, enabled, durable_wait_s
        self._late = answered_before_durable  # a prometheus counter labelled by topic
        self._durable: collections.deque = collections.deque()  # futures on disk, for the loop to resolve
        self._loop_thread: int | None = None
        self._late_timer: asyncio.TimerHandle | None = None  # the loop's check for a late writer thread

    def start(self) -> None:
        if self.enabled:
            loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
            self.events.after_sync = lambda: self._wake(loop)
            self.events.start()

    async def close(self, timeout_s: float = 10.0) -> None:
        if self._late_timer is not None:
            self._late_timer.cancel()
            self._late_timer = None
        if self.enabled:
            await asyncio.get_running_loop().run_in_executor(None, self.events.close, timeout_s)

    def submit(self, topic: str, key: str, value: bytes, meta: dict | None = None) -> asyncio.Future | None:
        """Queue an event for the log; the future resolves once it is spooled (None: off, or dropped and
        counted there). Within a sync window the log writes it before submit returns, and the future is done
        already. Otherwise the writer thread only appends the future to a deque; after each write it wakes the
        loop once (`after_sync`), which resolves all of them: one wake-up per batch, not per event. `meta`
        (tenant, ts, texts to scan for secrets) stays in the spool: see EventLog.submit."""
        if not self.enabled:
            return None
        fut = asyncio.get_running_loop().create_future()

        def durable() -> None:
            if threading.get_ident() == self._loop_thread:  # written by submit itself, on this loop
                fut.set_result(True)
            else:
                self._durable.append(fut)

        if not self.events.submit(topic, key, value, on_durable=durable, meta=meta):
            return None
        if self._late_timer is None:
            self._arm_late_check()
        return fut

    def _arm_late_check(self) -> None:
        """A loop timer for when what is unsynced now turns late, were no submit() to check it first."""
        at = self.events.late_check_at()
        if at is not None:  # a lock busy at the last check (its holder is syncing): look again shortly
            delay = max(at - time.monotonic(), 0.0005)
            self._late_timer = asyncio.get_running_loop().call_later(delay, self._late_check)

    def _late_check(self) -> None:
        self._late_timer = None
        self.events.sync_if_late()
        self._arm_late_check()

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:  # the writer thread
        try:
            loop.call_soon_threadsafe(self._resolve)
        except RuntimeError:  # the loop has closed (shutdown)
            pass

    def _resolve(self) -> None:
        if self._durable:  # answers about to be released: not while a late record is unsynced
            self.events.sync_if_late(answering=True)
        while self._durable:
            fut = self._durable.popleft()
            if not fut.done():
                fut.set_result(True)

    async def wait(self, futures: list, topic: str) -> None:
        futures = [f for f in futures if f is not None and not f.done()]
        if not futures:  # written already (a sync window): no wait, no turn of the loop
            return
        # A spool that is failing (disk full) would make every answer wait the whole bound: do not wait.
        timeout = 0 if self.events.writer_error else self.durable_wait_s
        _, late = await asyncio.wait(futures, timeout=timeout)
        if late:
            self._late.labels(topic).inc(len(late))
