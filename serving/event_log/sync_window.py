"""The spool's durability window: when the writer thread syncs what it wrote, and how long records waited.

Strict (a window of 0): every write is synced before its callers hear of it. A window: the oldest record written
and not synced yet is synced half a window after its write; the other half is the margin for the sync itself and
for the writer's wake-up on busy cores (a sync begun at the window less the last sync's time ended at 104 ms of a
100 ms window under a suite's load). The lag kept per sync is its oldest record's, from its write to the end of the
fdatasync: what a machine crash at that moment would have lost. The window is a target, not a promise: the writer
is a Python thread, and on cores saturated by other work its wake-ups come late (benchmarks.gateway's lag
histogram); syncs that ended past the window are counted.

A failed fdatasync is counted and raised (the writer retries after its backoff). Linux reports a writeback error
once and may drop the pages it could not write, so a retry that succeeds does not prove the records reached the
disk: what was written before a failed sync may be lost to a machine crash, and /health says how often it happened.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time

from serving.event_log.spool_writer import SegmentWriter

log = logging.getLogger(__name__)
# Upper bounds (s) of the lag histogram.
SYNC_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, float("inf"))


class SyncWindow:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self.unsynced_since: float | None = None  # when the oldest record not yet synced was written
        self.syncs = 0
        self.lag_counts = [0] * len(SYNC_LAG_BUCKETS)  # per bucket (not cumulative)
        self.lag_sum_s = self.lag_max_s = 0.0
        self.over_window = 0  # syncs that ended later than the window after their oldest record's write
        self.failures = 0  # fdatasyncs that failed (their records may not be on disk, even after a retry)

    @property
    def strict(self) -> bool:
        return self.window_s <= 0

    def wrote(self) -> bool:
        """A batch was written (strict: and synced by the write), under the writers' lock. True when it is the first
        the next sync owes (the writer thread should hear of it, if another thread wrote it)."""
        if self.strict:
            self.syncs += 1
        elif self.unsynced_since is None:
            self.unsynced_since = time.monotonic()
            return True
        return False

    def wait_s(self, idle_s: float) -> float:
        """How long the writer may wait for the next event: `idle_s`, or until the pending sync is due."""
        if self.unsynced_since is None:
            return idle_s
        return max(0.0, min(idle_s, self._due_at(self.unsynced_since) - time.monotonic()))

    def sync_if_due(self, segments: SegmentWriter, lock: threading.Lock, force: bool = False) -> None:
        """Sync what was written once its oldest record is half the window old; at once if `force`. `lock` is the
        writers' (the event loop appends too, serving.event_log.pipeline): held to note what the sync covers, not
        across the fdatasync; a record written meanwhile starts the next window."""
        with lock:
            since = self.unsynced_since
            if since is None or (not force and time.monotonic() < self._due_at(since)):
                return
            begun = segments.begin_sync()
            self.unsynced_since = None
        try:
            segments.finish_sync(begun)
        except OSError as e:
            with lock:  # still owed a sync, from its oldest record on
                self.unsynced_since = since if self.unsynced_since is None else min(since, self.unsynced_since)
            self.failures += 1
            log.error("event spool: fdatasync failed (%r): events written since may be lost if the machine crashes", e)
            raise
        lag = time.monotonic() - since  # unsynced_since stays as is: a record written during the sync opened it
        self.syncs += 1
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
            "sync_failures": self.failures,
        }

    def _due_at(self, since: float) -> float:
        return since + self.window_s / 2
