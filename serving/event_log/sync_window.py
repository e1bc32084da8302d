"""The spool's durability window: who syncs what was written, when, and how long records waited.

Strict (a window of 0): every write is synced before its callers hear of it. A window: records are answered once
written, and the fdatasync that covers them is owed within the window. Two threads pay it:
- the writer thread syncs the oldest group of records no sync has begun on half a window after its first write
  (fdatasync without the GIL, off the event loop);
- the thread that writes (the event loop: EventLog.submit, and a loop timer, serving.event_log.sink) syncs inline,
  before it answers anything more, once the oldest record not on disk is 3/4 of a window old: the writer thread is
  late. It is a Python thread: on saturated cores its wake-up, and each time it takes the GIL back from the busy event
  loop, came 5-18 ms late at the median (benchmarks._sync_lag, records/spool_sync_lag_split.json: the fdatasync
  itself took 0.17-0.45 ms; the event loop ran its own timers 5-19 ms late, up to 0.45 s, the process starved).

What that guarantees: no answer is released while a record written more than the window before it is still unsynced
(the request path syncs from 3/4 of it on, first; a breach, its sync failed or the lock held a whole window, is
counted in answered_past_window); and while the process runs, no record waits past the window. What it does not: a
record answered just before the process stops running (preempted, stopped, swapped) or before the disk's fdatasync
stalls waits as long as that lasts; no code in the process runs meanwhile, and no answer either. The lag kept per
sync is honest about it: its oldest record's, from the write to the end of the fdatasync that covered it (read when
the syncing thread runs again), whoever synced; syncs past the window are counted, and so are the request path's own
syncs (what enforcing it cost the loop).

A failed fdatasync is counted and raised (the writer retries after its backoff). Linux reports a writeback error
once and may drop the pages it could not write, so a retry that succeeds does not prove the records reached the
disk: what was written before a failed sync may be lost to a machine crash, and /health says how often it happened.
"""

from __future__ import annotations

import bisect
import collections
import logging
import threading
import time

from serving.event_log.spool import Position
from serving.event_log.spool_writer import SegmentWriter

log = logging.getLogger(__name__)
# Upper bounds (s) of the lag histogram.
SYNC_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, float("inf"))
WRITER_DUE = 0.5  # of the window after a group's first write: the writer thread syncs it
LATE = 0.75  # of the window after the oldest unsynced write: the writing thread syncs inline (the writer is late)


class SyncWindow:
    def __init__(self, window_s: float):
        self.window_s = window_s
        # Records written and not known to be on disk, in groups: [end position, first write's time, open]. The last
        # group is open until a sync begins on it; the ones before it are being synced (or their sync failed).
        self._groups: collections.deque[list] = collections.deque()
        self._in_flight = 0  # syncs begun and not finished
        self.syncs = 0
        self.inline_syncs = 0  # of syncs: run by the writing thread (the event loop) because the writer was late
        self.lag_counts = [0] * len(SYNC_LAG_BUCKETS)  # per bucket (not cumulative)
        self.lag_sum_s = self.lag_max_s = 0.0
        self.over_window = 0  # syncs that ended later than the window after their oldest record's write
        self.failures = 0  # fdatasyncs that failed (their records may not be on disk, even after a retry)
        # Events written (their answers released) while a record older than the window was still unsynced: the
        # request path's sync failed or could not take the lock. The promise kept is this at 0.
        self.answered_past_window = 0

    @property
    def strict(self) -> bool:
        return self.window_s <= 0

    @property
    def unsynced_since(self) -> float | None:
        """When the oldest record not known to be on disk was written (a sync may be under way)."""
        try:
            return self._groups[0][1]
        except IndexError:
            return None

    def wrote(self, head: Position) -> bool:
        """A batch ending at `head` was written (strict: and synced by the write), under the writers' lock. True when
        it began a group the next sync owes (the writer thread should hear of it, if another thread wrote it)."""
        if self.strict:
            self.syncs += 1
            return False
        groups = self._groups
        if groups and groups[-1][2]:
            groups[-1][0] = head
            return False
        groups.append([head, time.monotonic(), True])
        return True

    def wait_s(self, idle_s: float) -> float:
        """How long the writer may wait for the next event: `idle_s`, or until the pending sync is due."""
        since = self._owed_since()
        if since is None:
            return idle_s
        return max(0.0, min(idle_s, since + self.window_s * WRITER_DUE - time.monotonic()))

    def late(self, now: float | None = None) -> bool:
        """Whether the oldest record not on disk is 3/4 of the window old: the writing thread must sync it."""
        since = self.unsynced_since
        return since is not None and not self.strict and (now or time.monotonic()) >= since + self.window_s * LATE

    def past_window(self) -> bool:
        """Whether a record written more than the window ago is not on disk yet."""
        since = self.unsynced_since
        return since is not None and not self.strict and time.monotonic() > since + self.window_s

    def late_at(self) -> float | None:
        """When late() becomes true, for what is unsynced now (None: nothing)."""
        since = self.unsynced_since
        return None if since is None or self.strict else since + self.window_s * LATE

    def sync_if_due(
        self, segments: SegmentWriter, lock: threading.Lock, force: bool = False, inline: bool = False
    ) -> None:
        """The writer thread: sync what no sync has begun on once its first record is half the window old; at once
        if `force`. `inline` (the writing thread, once late()): sync everything written, whatever is under way
        (a sync begun by a stalled writer thread still counts against the window), waiting at most a window for the
        lock. `lock` is the writers' (the event loop appends too,
        serving.event_log.pipeline): held to note what the sync covers, not across the fdatasync; a record written
        meanwhile begins the next group."""
        if not lock.acquire(timeout=self.window_s if inline else -1):
            return  # the writer thread held it a whole window (a forget() saving): the caller counts what that cost
        try:
            since = self._owed_since() if not inline else self.unsynced_since
            if since is None or (not (force or inline) and time.monotonic() < since + self.window_s * WRITER_DUE):
                return
            begun = segments.begin_sync()  # None: everything written is synced (by another thread) already
            target = segments.head
            if self._groups and self._groups[-1][2]:
                self._groups[-1][2] = False
            self._in_flight += 1
        finally:
            lock.release()
        try:
            segments.finish_sync(begun)
        except OSError as e:
            with lock:  # its groups stay owed; with no sync in flight, due at once for the writer
                self._in_flight -= 1
            self.failures += 1
            log.error("event spool: fdatasync failed (%r): events written since may be lost if the machine crashes", e)
            raise
        ended = time.monotonic()
        with lock:
            self._in_flight -= 1
            oldest = self._covered(max(target, segments.synced))
        self.syncs += 1
        self.inline_syncs += inline
        if oldest is not None:  # None: another sync covered them first (and counted their lag)
            lag = ended - oldest
            self.lag_max_s = max(self.lag_max_s, lag)
            self.lag_sum_s += lag
            self.lag_counts[bisect.bisect_left(SYNC_LAG_BUCKETS, lag)] += 1
            self.over_window += lag > self.window_s

    def health(self) -> dict:
        return {
            "mode": "strict" if self.strict else "window",
            "sync_window_s": self.window_s,
            "sync_lag_max_s": round(self.lag_max_s, 6),
            "syncs": self.syncs,
            "syncs_over_window": self.over_window,
            "syncs_on_request_path": self.inline_syncs,
            "answered_past_window": self.answered_past_window,
            "sync_failures": self.failures,
            # What the window promises (serving.event_log.sync_window)
            "guarantee": "strict: each answer after its fdatasync"
            if self.strict
            else "an event is answered only once every record written over the window before it is on disk "
            "(breaches: answered_past_window); a record's own sync comes within the window while the process runs, "
            "later by as long as it does not (CPU starved, stopped) or the disk stalls: sync_lag_max_s, "
            "syncs_over_window",
        }

    def _owed_since(self) -> float | None:
        """The first write of the oldest group no sync covers: the open group's, or the oldest's when no sync is
        under way (one failed)."""
        groups = self._groups
        if not groups:
            return None
        return groups[0][1] if self._in_flight == 0 else (groups[-1][1] if groups[-1][2] else None)

    def _covered(self, synced: Position) -> float | None:
        """Drops the groups now on disk (ending at or before `synced`); the oldest one's first write, if any."""
        oldest = None
        while self._groups and self._groups[0][0] <= synced:
            first = self._groups.popleft()[1]
            oldest = first if oldest is None else oldest
        return oldest
