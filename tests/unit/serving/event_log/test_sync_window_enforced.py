"""The window enforced by the request path (serving.event_log.sync_window): a writer thread that is late, paused here,
must not let an answered record stay unsynced past the window: the thread that writes (submit(), the sink's loop
timer) syncs it at 3/4 of the window. The lag stays honest: from a record's write to the end of the fdatasync that
covered it, whoever ran it, counted once."""

import asyncio
import threading
import time

import pytest

from serving.event_log import sync_window as sw
from serving.event_log.pipeline import EventLog, EventLogConfig
from serving.event_log.sync_window import SyncWindow
from tests.spool_helpers import wait_for


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Segments:
    """SegmentWriter's sync protocol over positions; the writer thread's finish_sync blocks while `hold` is clear
    (a writer stalled in its fdatasync or taking the GIL back after it)."""

    def __init__(self):
        self.head = self.synced = (0, 0)
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fdatasyncs = 0

    def write(self, n: int) -> tuple[int, int]:
        self.head = (0, self.head[1] + n)
        return self.head

    def begin_sync(self):
        return None if self.synced == self.head else self.head

    def finish_sync(self, begun):
        if begun is None:
            return
        if threading.current_thread().name == "writer":
            self.entered.set()
            self.hold.wait(5)
        self.fdatasyncs += 1
        self.synced = max(self.synced, begun)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(sw.time, "monotonic", c)
    return c


def test_the_writing_thread_syncs_at_three_quarters_of_the_window(clock):
    window, segments, lock = SyncWindow(0.1), Segments(), threading.Lock()
    window.wrote(segments.write(10))
    clock.now += 0.07
    window.wrote(segments.write(10))
    assert not window.late()
    clock.now += 0.006  # 76 ms after the first write
    assert window.late()
    window.sync_if_due(segments, lock, inline=True)
    assert window.unsynced_since is None and segments.synced == segments.head
    assert window.inline_syncs == window.syncs == 1 and window.lag_max_s == pytest.approx(0.076)
    assert window.over_window == 0 and not window.past_window()


def test_a_sync_the_writer_thread_began_and_stalled_in_is_overtaken_and_counted_once(clock):
    """The writer thread took the group and stalls before its fdatasync ends (waiting for the GIL, preempted): the
    request path syncs everything itself when it is late; the writer's sync, ending later, counts no lag again."""
    window, segments, lock = SyncWindow(0.1), Segments(), threading.Lock()
    window.wrote(segments.write(10))
    clock.now += 0.05  # due for the writer
    segments.hold.clear()
    writer = threading.Thread(target=window.sync_if_due, args=(segments, lock), name="writer")
    writer.start()
    assert segments.entered.wait(5)
    assert window.unsynced_since == 100.0  # in flight is not on disk
    clock.now += 0.03
    assert window.late()
    window.wrote(segments.write(5))  # a write after the writer's sync began: the request path's covers it too
    window.sync_if_due(segments, lock, inline=True)  # its own fdatasync, not waiting on the writer's
    assert window.unsynced_since is None and segments.synced == (0, 15) and window.syncs == 1
    assert window.lag_max_s == pytest.approx(0.08) and window.inline_syncs == 1
    segments.hold.set()
    writer.join(5)
    assert window.syncs == 2 and sum(window.lag_counts) == 1  # one lag, the oldest record's, counted once


def test_a_late_writer_thread_does_not_let_an_answered_record_stay_unsynced(tmp_path, monkeypatch):
    """The real pipeline with its writer thread paused before every sync it would run: records written every 20 ms
    for 1.5 s are synced by submit() itself; an answer never leaves while a record older than the window is
    unsynced. Without the request path's syncs (the setting off) the same run leaves them unsynced past it.
    The lag: the first submit() from 3/4 of the window on syncs, so a record waits at most 3/4 of the window, the
    longest gap between two submits' starts and the longest submit (its fdatasync): on a busy machine this thread's
    own wake-ups stretch the gaps (what the process is not running for, the window cannot bound)."""
    window = 0.2
    for enforce in (True, False):
        log = EventLog(
            EventLogConfig(spool_dir=tmp_path / str(enforce), sync_window_s=window, sync_on_request_path=enforce)
        )
        log.start()
        log.submit("completions", "open", b"v")  # the first event opens the segment (the writer thread's)
        assert wait_for(lambda log=log: log.stats.syncs == 1 and log._q.empty())
        resume = _pause_the_writer(log, monkeypatch)
        past, starts, longest = [], [], 0.0
        try:
            stop = time.monotonic() + 1.5
            while time.monotonic() < stop:
                starts.append(time.monotonic())
                assert log.submit("completions", "k", b"x" * 900)
                longest = max(longest, time.monotonic() - starts[-1])
                past.append(log.sync_window.past_window())  # what the answer would leave behind
                time.sleep(0.02)
            w = log.sync_window
            if enforce:
                assert not any(past) and w.answered_past_window == 0 and w.inline_syncs >= 2
                gap = max(b - a for a, b in zip(starts, starts[1:]))
                assert w.lag_max_s <= window * 0.75 + gap + longest, (w.lag_max_s, gap, longest)
            else:
                assert any(past) and w.inline_syncs == 0
        finally:
            resume.set()
            log.close(timeout=5)
        assert log.stats.spooled == log.stats.submitted


async def _sink_with_the_writer_paused(cfg: EventLogConfig, monkeypatch):
    """An EventSink over a real EventLog whose first event is synced by the writer thread, which is then paused
    before every sync it would run: (sink, log, resume)."""
    from prometheus_client import CollectorRegistry, Counter

    from serving.event_log.sink import EventSink

    late = Counter("late", "answered before durable", ["topic"], registry=CollectorRegistry())
    log = EventLog(cfg)
    sink = EventSink(log, late)
    sink.start()
    try:
        await sink.wait([sink.submit("completions", "open", b"v")], "completions")
        while log.stats.syncs < 1:
            await asyncio.sleep(0.01)
        return sink, log, _pause_the_writer(log, monkeypatch)
    except BaseException:
        await sink.close(5.0)
        raise


def test_the_sinks_timer_syncs_when_no_event_follows(tmp_path, monkeypatch):
    """One event, then nothing: the writer thread paused, the sink's loop timer syncs it, from 3/4 of the window on
    (when the loop runs it: within the two windows the test waits)."""
    window = 0.2

    async def run() -> SyncWindow:
        cfg = EventLogConfig(spool_dir=tmp_path, sync_window_s=window)
        sink, log, resume = await _sink_with_the_writer_paused(cfg, monkeypatch)
        try:
            await sink.wait([sink.submit("completions", "k", b"v")], "completions")
            await asyncio.sleep(window * 2)
            return log.sync_window
        finally:
            resume.set()
            await sink.close(5.0)

    w = asyncio.run(run())
    # synced by the loop (the writer thread never ran a sync), not before the late point, within the wait
    assert w.inline_syncs == 1 and w.lag_max_s >= window * 0.75 and w.unsynced_since is None, w.lag_max_s


def test_strict_mode_never_syncs_on_the_request_path(tmp_path):
    log = EventLog(EventLogConfig(spool_dir=tmp_path, sync_window_s=0)).start()
    try:
        for i in range(5):
            log.submit("completions", f"k{i}", b"v")
        assert wait_for(lambda: log.stats.spooled == 5)
        assert not log.syncs_on_request_path and log.sync_window.inline_syncs == 0
        assert log.health()["durability"]["guarantee"].startswith("strict")
    finally:
        log.close(timeout=2)


def _pause_the_writer(log: EventLog, monkeypatch) -> threading.Event:
    """The writer thread waits (until the returned event is set) before each sync it would run on time: a thread
    whose wake-ups come late."""
    resume, real = threading.Event(), log.sync_window.sync_if_due

    def late_writer(segments, lock, force=False, inline=False):
        if threading.current_thread().name == "event-spool-writer" and not force:
            resume.wait()
        return real(segments, lock, force, inline)

    monkeypatch.setattr(log.sync_window, "sync_if_due", late_writer)
    return resume


def test_a_failing_disk_is_not_synced_per_event_or_per_timer_tick(tmp_path, monkeypatch):
    """fdatasync failing (EIO) with the writer thread paused: the request path tries, fails, and leaves the disk
    alone for retry_backoff_s; neither the sink's timer nor each submit() retries it in between."""
    import errno
    import os

    window, backoff, attempts, failing = 0.02, 0.3, [0], threading.Event()
    real = os.fdatasync

    def fdatasync(fd):
        if failing.is_set():
            attempts[0] += 1
            raise OSError(errno.EIO, "I/O error")
        return real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)

    async def run() -> float:
        cfg = EventLogConfig(spool_dir=tmp_path, sync_window_s=window, retry_backoff_s=backoff)
        sink, log, resume = await _sink_with_the_writer_paused(cfg, monkeypatch)
        try:
            failing.set()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 1.0:  # events and the timer, a second long
                sink.submit("completions", "k", b"v")
                await asyncio.sleep(0.005)
            return time.monotonic() - t0
        finally:
            failing.clear()
            resume.set()
            await sink.close(5.0)

    spent = asyncio.run(run())
    # one try, then one per backoff at most (before the fix: hundreds, one per event and per 0.5 ms timer tick)
    assert 1 <= attempts[0] <= spent / backoff + 2, attempts[0]
