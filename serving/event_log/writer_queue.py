"""The spool writer thread's queue: events for it to write, and cues (WAKE) that a write of the request path's own
opened a group the next sync owes (serving.event_log.pipeline).

A cue must not make the request path queue what it would have written itself: the writer thread, late on busy cores,
would then hold every answer behind it until it ran (and the request path's own syncs, serving.event_log.sync_window,
could not keep the window for events not written yet). The queue counts its cues under its own mutex, so that
`holds_only_cues` is exact: an event queued is never passed by one written after it.
"""

from __future__ import annotations

import queue

WAKE = None  # the writer thread's cue: a sync is owed


class WriterQueue(queue.Queue):
    def __init__(self, maxsize: int):
        super().__init__(maxsize)
        self.cues = 0  # WAKE items in the queue (under self.mutex)

    def holds_only_cues(self) -> bool:
        """Whether no event waits in the queue (cues may)."""
        with self.mutex:
            return len(self.queue) == self.cues

    def _put(self, item) -> None:  # under self.mutex (queue.Queue)
        self.cues += item is WAKE
        self.queue.append(item)

    def _get(self):
        item = self.queue.popleft()
        self.cues -= item is WAKE
        return item
