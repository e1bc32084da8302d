"""Lossless event logging off the request path: an on-disk spool in front of an idempotent Kafka producer.

    request handler --submit()--> bounded queue --writer thread--> spool segments (fdatasync within a window)
                                                                        |
                             shipper process (serving.event_log.shipper) <--'  reads from its cursor
                                   '-> KafkaProducer (idempotent, acks=all, zstd); cursor moves on ack

A caller that needs to know when its event is safe (the gateway answers a client only then) passes `on_durable`,
called once the event is written to the spool: safe from a crash of the process (the kernel holds it), synced to
disk within `sync_window_s` (a machine crash loses what was not synced yet, as with Kafka, Vector's disk buffers
and PostgreSQL's `synchronous_commit = off`; by the writer thread, or by submit() itself when the writer is late:
serving.event_log.sync_window says what is promised), or with 0 (strict) only after its fdatasync. With a window,
submit() writes the event itself (one pwrite into the page cache, ~10 us) and calls `on_durable` before it returns;
the writer thread only syncs, once per window. Handing each event to the thread instead cost a wake-up of it and
then of the caller's event loop per request (benchmarks.gateway: CPU per request and added latency, logging on vs
off). Strict mode, a write that would begin a new segment (its seal syncs), and events behind a failed write go
through the queue to the writer thread, which groups them (one write and one fdatasync per batch) and calls
`on_durable` from there. The shipper may send what is not synced yet: Kafka holding an event a machine crash took
from the spool loses nothing.
A write that fails (disk full, I/O error) is cut back to the last record written and retried after a backoff: the
queue, then submit(), takes the pressure and /health says so. A dead shipper restarts from its cursor. Every event
is written to the spool before it is sent, so a dead or slow broker fills the disk (up to `max_spool_bytes`, with
an alarm), never the heap; when the broker returns the backlog goes out in the order it was written. A batch that
fails is sent again from the cursor, so Kafka may hold an event twice; consumers drop duplicates by event_id.
An event may carry `meta` (tenant, ts, texts to scan), kept in the spool and never sent: the shipper withholds
the content of an event whose texts hold a secret (serving.event_log.secret_scrub), and skips and redacts the
records of a tenant forgotten through `forget` (serving.event_log.forget).
kafka-python runs in its own process: in a thread, its pure-Python work held the GIL often enough to add
milliseconds to the gateway's p50 (measured in benchmarks.gateway).
Why one file: the writer's two paths (submit's own write, the thread's group commit) share one lock and head.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serving.event_log import forget as fg, shipper as sh
from serving.event_log.spool import Spool
from serving.event_log.spool_writer import SegmentWriter
from serving.event_log.sync_window import SyncWindow
from serving.event_log.writer_queue import WAKE, WriterQueue

log = logging.getLogger(__name__)


class _NotInline(Exception):
    """submit() leaves this event to the writer thread (the lock busy, no segment open, a new one due, closing)."""


@dataclass
class EventLogConfig:
    spool_dir: Path
    bootstrap: str | None = None  # None: spool only (nothing is shipped until a broker is configured)
    max_spool_bytes: int = 1 << 30  # undelivered bytes on disk before new events are refused (alarm)
    segment_bytes: int = 16 << 20
    fsync_interval_s: float = 0.05  # idle: how long the writer waits for a first event before checking its state
    # Longest an event written to the spool waits for its fdatasync (the window a machine crash may lose; a killed
    # process loses nothing). 0: strict, every answer waits for the sync that covers its event.
    sync_window_s: float = 0.01
    # The request path syncs inline, before it answers, once the oldest unsynced record is 3/4 of the window old
    # (the writer late: sync_window). False: the writer thread alone, the window a target (benchmarks._sync_lag).
    sync_on_request_path: bool = True
    queue_max: int = 20_000  # events waiting for the writer thread
    send_batch: int = 2000
    ship_interval_s: float = 0.5  # the shipper sends at most this often unless a full batch is waiting
    shipper_nice: int = 10  # the shipper process's nice value: below serving on shared cores (0: as the gateway)
    send_timeout_s: float = 3.0  # a batch not acknowledged by then counts as a failed delivery
    retry_backoff_s: float = 1.0
    cursor_save_interval_s: float = 0.5
    stop_timeout_s: float = 10.0  # on close, how long the shipper keeps trying to deliver the backlog
    max_event_bytes: int = 1_000_000  # larger events go to the dead-letter topic as a stub, whole to disk
    scrub: bool = True  # withhold the content of events whose meta "scan" texts hold a secret (secret_scrub)
    # Undelivered bytes past which the shipper withholds events without scanning them (failing closed), so that
    # a scanner falling behind never fills the spool (which would drop events whole); capped at 3/4 of
    # max_spool_bytes. Near that limit only: a broker outage that leaves more than this behind withholds the
    # oldest part of it, unscanned, when the broker returns (counted in flywheel_event_unscanned_total).
    scan_backlog_bytes: int = 768 << 20


@dataclass
class Stats:
    submitted: int = 0
    spooled: int = 0  # written to the spool (every event passes through it)
    produced: int = 0  # acknowledged by the broker
    replayed: int = 0  # acknowledged after having waited through a broker outage
    dropped_queue_full: int = 0
    dropped_spool_full: int = 0
    send_failures: int = 0
    deadlettered: int = 0  # too large for the broker: a stub on the dead-letter topic, the event on disk
    write_failures: int = 0  # spool writes that failed and were retried
    shipper_restarts: int = 0
    broker_up: bool = False
    pending_bytes: int = 0  # written but not yet acknowledged
    scrubbed: int = 0  # delivered withheld: a secret in their texts, a scan that failed, or not scanned
    unscanned: int = 0  # of scrubbed: withheld without a scan (a backlog over scan_backlog_bytes, no meta)
    forgotten: int = 0  # never delivered: records of a forgotten tenant (skipped, redacted on disk or on write)
    syncs: int = 0  # fdatasyncs of the head segment
    sync_lag_max_s: float = 0.0  # longest an answered event waited for its sync (window mode), since the start


class EventLog:
    def __init__(self, cfg: EventLogConfig):
        self.cfg = cfg
        self.spool = Spool(cfg.spool_dir)
        self._q = WriterQueue(cfg.queue_max)
        self._stop = threading.Event()
        ctx = multiprocessing.get_context("spawn")
        self._shared = ctx.Array("q", sh.SLOTS)  # int64 slots, see serving.event_log.shipper
        cursor = self.spool.load_cursor()
        head = self.spool.recover_head(cursor)
        self._head = head
        self._segments = SegmentWriter(self.spool, head, cfg.segment_bytes)
        self._written_bytes = self.spool.bytes_between(cursor, head)  # a backlog from a previous run
        s = self._shared
        s[sh.CUR_SEG], s[sh.CUR_OFF] = cursor
        s[sh.HEAD_SEG], s[sh.HEAD_OFF] = head
        s[sh.OUTAGE] = 1 if self._written_bytes else 0  # delivering an old backlog counts as replay
        # Forgotten tenants: the writer redacts their records as it writes them (under this lock, so that
        # forget() sees every record written before it in the spool, and none after it unredacted).
        self._forget_lock = threading.Lock()
        self._redact_lock = threading.Lock()
        self._forget_gen, self._forgotten = fg.load(self.spool.dir)
        self._forgotten_match = fg.matcher(self._forgotten)
        self._forgotten_on_write = 0
        s[sh.FORGET_REQ] = self._forget_gen
        s[sh.FORGET_GEN] = fg.load_done(self.spool.dir)
        self._submitted = self._spooled = self._dropped_queue = self._dropped_spool = 0
        self._write_failures = self._shipper_restarts = 0
        self.writer_error: str | None = None  # the last write error, while writes fail
        self.sync_window = SyncWindow(cfg.sync_window_s)
        self._inline_ok = not self.sync_window.strict
        self._closed = False  # set by the writer thread before its last sync: no write here after it
        self._inline_failures = 0
        self._inline_failure_logged = 0.0
        self._inline_sync_retry_at = 0.0  # after a failed fdatasync here: not again before (the loop must not spin)
        self._ctx = ctx
        # Called (writer thread) once after a batch whose events had on_durable callbacks: lets a caller
        # wake its event loop once per fsync rather than once per event.
        self.after_sync: Callable[[], None] | None = None
        self._writer = threading.Thread(target=self._write_loop, name="event-spool-writer", daemon=True)
        self._shipper = self._new_shipper() if cfg.bootstrap else None
        self._shipper_checked = 0.0
        self._alarm_logged = 0.0

    # ------------------------------------------------------------------ request path
    def submit(self, topic: str, key: str, value: bytes, on_durable=None, meta: dict | None = None) -> bool:
        """Write an event to the spool (within a window: here, into the page cache, when nothing is queued ahead of
        it and no one holds the spool; else queued for the writer thread). It syncs here only when the writer thread
        is late (sync_if_late: waiting at most a window for the writers' lock, then an fdatasync). False
        if it had to be dropped (queue or spool full). `on_durable()` is called once the event is written to the
        spool (strict: and fsynced): here, or from the writer thread.
        `meta`: {"tenant", "ts", "scan": [texts]} (any may be absent), kept in the spool for the shipper, never
        sent."""
        self._submitted += 1
        if self.spool_full:
            self._dropped_spool += 1
            self._alarm()
            return False
        item = (topic, key, value, meta, on_durable)
        if self._writes_inline():
            try:
                first = self._append([item], inline=True)
            except _NotInline:
                pass  # the writer thread's: queued below
            except Exception as e:  # noqa: BLE001 - disk full, I/O error: queued, the writer retries it
                self._inline_failures += 1
                if time.monotonic() - self._inline_failure_logged > 60:
                    self._inline_failure_logged = time.monotonic()
                    log.warning("event spool: a write on the request path failed (%r); queued for the writer", e)
            else:
                self.sync_if_late(answering=True)  # before anyone is answered: the writer thread may be late
                self._written([item], inline=True)
                if first and self._q.cues == 0:
                    try:
                        self._q.put_nowait(WAKE)
                    except queue.Full:  # the writer has work queued: it wakes anyway
                        pass
                return True
        self.sync_if_late()  # this event is answered once the writer thread wrote it (EventSink checks again then)
        try:
            self._q.put_nowait(item)
            return True
        except queue.Full:
            self._dropped_queue += 1
            self._alarm()
            return False

    def sync_if_late(self, answering: bool = False) -> None:
        """The request path's share of the window: fdatasync here (~0.2 ms, without the GIL) when the oldest record
        not on disk is 3/4 of the window old, the writer thread late (serving.event_log.sync_window). Called by
        submit() (`answering`: its caller answers next; if a record older than the window is still unsynced then, it
        is counted) and by the caller's timer (serving.event_log.sink); after a failed sync the request path leaves the
        retries to the writer thread for `retry_backoff_s` (a failing disk would otherwise be synced per event)."""
        window = self.sync_window
        if not self.syncs_on_request_path or not window.late() or self._closed:
            return
        if time.monotonic() >= self._inline_sync_retry_at:
            try:
                window.sync_if_due(self._segments, self._forget_lock, inline=True)
            except OSError:  # logged and counted there; a disk that refuses is retried a backoff later, not per event
                self._inline_sync_retry_at = time.monotonic() + self.cfg.retry_backoff_s
        if answering and window.past_window():
            window.answered_past_window += 1

    def late_check_at(self) -> float | None:
        """When the request path looks for a late record next, were no event to come: not before a failed sync's
        backoff is over (None: nothing to look for)."""
        if self._closed or not self.syncs_on_request_path:
            return None
        at = self.sync_window.late_at()
        return None if at is None else max(at, self._inline_sync_retry_at)

    @property
    def syncs_on_request_path(self) -> bool:
        """Whether the request path enforces the window (a window, not strict, and the setting on)."""
        return self.cfg.sync_on_request_path and not self.sync_window.strict

    def _writes_inline(self) -> bool:
        """Whether submit() may write the event itself: a window, the writer thread running, its writes not failing,
        and nothing queued ahead of it (an event written here never passes one submitted before it)."""
        return (
            self._inline_ok
            and self.writer_error is None
            and self._q.holds_only_cues()
            and self._writer.is_alive()
            and not self._stop.is_set()
        )

    @property
    def pending_bytes(self) -> int:
        return max(0, self._written_bytes - self._shared[sh.ACKED_BYTES])

    @property
    def spool_full(self) -> bool:
        return self.pending_bytes > self.cfg.max_spool_bytes

    @property
    def stats(self) -> Stats:
        s = self._shared
        return Stats(
            submitted=self._submitted,
            spooled=self._spooled,
            produced=s[sh.PRODUCED],
            replayed=s[sh.REPLAYED],
            dropped_queue_full=self._dropped_queue,
            dropped_spool_full=self._dropped_spool,
            send_failures=s[sh.FAILURES],
            deadlettered=s[sh.DEADLETTERED],
            write_failures=self._write_failures,
            shipper_restarts=self._shipper_restarts,
            broker_up=bool(s[sh.BROKER_UP]),
            pending_bytes=self.pending_bytes,
            scrubbed=s[sh.SCRUBBED],
            unscanned=s[sh.UNSCANNED],
            forgotten=s[sh.FORGOTTEN] + self._forgotten_on_write,
            syncs=self.sync_window.syncs,
            sync_lag_max_s=self.sync_window.lag_max_s,
        )

    def health(self) -> dict:
        """Liveness of the writer thread and the shipper process, for the gateway's /health."""
        writer = (
            ("failing" if self.writer_error else "ok")
            if self._writer.is_alive()
            else ("stopped" if self._stop.is_set() else "dead")
        )
        shipper = (
            "off"
            if self._shipper is None
            else ("ok" if self._shipper.is_alive() else ("stopped" if self._shared[sh.STOP] else "dead"))
        )
        return {
            "writer": writer,
            "writer_error": self.writer_error,
            "shipper": shipper,
            "shipper_restarts": self._shipper_restarts,
            # What a machine crash may lose: events written in the last sync_window_s (0: none, strict).
            "durability": self.sync_window.health(),
            "ok": writer == "ok" and shipper in ("ok", "off"),
        }

    def _alarm(self) -> None:
        now = time.monotonic()
        if now - self._alarm_logged > 60:
            self._alarm_logged = now
            log.error(
                "event log over its limits: %d bytes undelivered in %s (limit %d), queue %d/%d; "
                "new events are being dropped",
                self.pending_bytes,
                self.spool.dir,
                self.cfg.max_spool_bytes,
                self._q.qsize(),
                self.cfg.queue_max,
            )

    # ------------------------------------------------------------------ forgetting a tenant
    def forget(self, tenants: dict[str, float], timeout: float = 10.0) -> None:
        """Forget every record of these tenants (id -> forgotten_before, a Unix time) whose event ts is at or
        before that time: none still in the spool reaches Kafka after this returns, and their bytes are gone
        from the spool's segments. Merged into forgotten.json (values only grow); returns once the shipper has
        loaded it and redacted the spool (or, with no shipper running, once that is done here). Raises
        TimeoutError if the shipper has not after `timeout` s (it will: the file is on disk; call again to wait),
        OSError if the file cannot be written (nothing changed)."""
        with self._forget_lock:
            merged, grew = fg.merge(self._forgotten, tenants)
            if grew:
                fg.save(self.spool.dir, self._forget_gen + 1, merged)
                self._forget_gen += 1
                self._forgotten, self._forgotten_match = merged, fg.matcher(merged)
                self._shared[sh.FORGET_REQ] = self._forget_gen
            gen = self._forget_gen
        if self._shared[sh.FORGET_GEN] >= gen:
            return
        if self._shipper is None or self._shipper.pid is None:  # no reader: redact here
            with self._redact_lock:
                if self._shared[sh.FORGET_GEN] < gen:
                    with self._shared.get_lock():
                        head, cursor = (self._shared[sh.HEAD_SEG], self._shared[sh.HEAD_OFF]), self._cursor()
                    ahead = fg.redact(self.spool, self._forgotten, head, cursor)
                    fg.save_done(self.spool.dir, gen)
                    with self._shared.get_lock():
                        self._shared[sh.FORGOTTEN] += ahead
                        self._shared[sh.FORGET_GEN] = max(self._shared[sh.FORGET_GEN], gen)
            return
        deadline = time.monotonic() + timeout
        while self._shared[sh.FORGET_GEN] < gen:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the event shipper has not applied forgotten tenants (generation {gen}) yet")
            time.sleep(0.01)

    def _cursor(self) -> tuple[int, int]:
        return self._shared[sh.CUR_SEG], self._shared[sh.CUR_OFF]

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "EventLog":
        if self._shipper is None and self._shared[sh.FORGET_GEN] < self._forget_gen:
            self.forget({})  # a redaction cut short by a crash, finished here (no shipper to do it)
        self._writer.start()
        if self._shipper is not None:
            self._shipper.start()
        return self

    def close(self, timeout: float | None = None) -> None:
        """Write out everything queued; the shipper delivers what it can within its stop timeout."""
        self._stop.set()
        if self._writer.is_alive():
            self._writer.join(timeout=timeout or 10.0)
        self._shared[sh.STOP] = 1
        if self._shipper is not None and self._shipper.is_alive():
            self._shipper.join(timeout=(timeout or self.cfg.stop_timeout_s) + 5)
            if self._shipper.is_alive():
                self._shipper.kill()

    def drain(self, timeout: float) -> bool:
        """Wait until every submitted event is acknowledged by the broker (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Spooled (not merely taken off the queue by the writer) and acknowledged.
            written = self._spooled + self._dropped_queue + self._dropped_spool >= self._submitted
            if written and self.pending_bytes == 0:
                return True
            time.sleep(0.05)
        return False

    # ------------------------------------------------------------------ writer thread
    def _new_shipper(self):
        return self._ctx.Process(target=sh.main, args=(self.cfg, self._shared), name="event-shipper", daemon=True)

    def _watch_shipper(self) -> None:
        """A shipper that died (killed, crashed) is started again; it resumes from the shared cursor."""
        now = time.monotonic()
        if self._shipper is None or now - self._shipper_checked < 1.0 or self._shared[sh.STOP]:
            return
        self._shipper_checked = now
        if self._shipper.pid is not None and not self._shipper.is_alive():
            log.error("event shipper exited (code %s); starting it again from the cursor", self._shipper.exitcode)
            shipper = self._new_shipper()
            shipper.start()  # if this raises, the dead one stays and the next check tries again
            self._shipper = shipper
            self._shipper_restarts += 1

    def _write_loop(self) -> None:
        try:
            self._write_batches()
        finally:
            with self._forget_lock:
                self._closed = True  # no write on the request path after the last sync
            try:
                self.sync_window.sync_if_due(self._segments, self._forget_lock, force=True)
            except OSError as e:
                log.error("event spool: the last sync failed on close (%r)", e)
            with self._forget_lock:
                self._segments.close()

    def _write_batches(self) -> None:
        batch: list = []
        stopping_since = None
        while True:
            try:
                self._watch_shipper()
            except Exception as e:  # cannot start a process now (EMFILE, ENOMEM): the writer goes on
                log.error("could not restart the event shipper: %s", e)
            if not batch:
                batch = self._group_commit_batch(self.sync_window.wait_s(self.cfg.fsync_interval_s))
            try:
                if batch:
                    self._append(batch)  # written (strict: and synced), or raises with the head where it was
                    self._written(batch)
                    batch = []
                self.sync_window.sync_if_due(self._segments, self._forget_lock)  # window: what was written, once due
            except Exception as e:  # disk full, I/O error: an unwritten batch is kept, cut back, tried again
                self._write_failures += 1
                if self.writer_error is None:
                    log.error("event spool write failed (%r); retrying, events wait in the queue", e)
                self.writer_error = f"{type(e).__name__}: {e}"
                if self._stop.is_set():
                    stopping_since = stopping_since or time.monotonic()
                    if time.monotonic() - stopping_since > self.cfg.stop_timeout_s:
                        log.error("closing, %d events unwritten (%s)", len(batch) + self._q.qsize(), self.writer_error)
                        return
                time.sleep(self.cfg.retry_backoff_s)
                continue
            if self.writer_error is not None:
                log.info("event spool writable again")
                self.writer_error = None
            if self._stop.is_set() and self._q.empty():
                return  # the last sync is _write_loop's

    def _written(self, batch: list, inline: bool = False) -> None:
        """Calls the batch's on_durable callbacks; and (the writer thread's batches) after_sync once."""
        called = False
        for *_, on_durable in batch:
            if on_durable is not None:
                called = True
                try:
                    on_durable()
                except Exception:  # noqa: BLE001 - a caller's callback never stops the writer
                    log.exception("on_durable callback failed")
        if called and not inline and self.after_sync is not None:
            try:
                self.after_sync()
            except Exception:  # noqa: BLE001
                log.exception("after_sync callback failed")

    def _append(self, batch: list, inline: bool = False) -> bool:
        """Write a batch after the head (strict: and sync it), then show it to the shipper. On any error the head
        stays where it was (what the attempt left past it is cut before the retry: serving.event_log.spool_writer).
        `inline` (submit's own write, on the event loop): raises _NotInline, nothing written, where it would wait
        for the lock (forget() saving, the writer sealing a segment), open a file or begin a new segment (the writer
        thread seals the full one, an fsync), or after the last sync. True when the next sync owes this batch first."""
        # forget() sees every record written before it, none after it unredacted
        if not self._forget_lock.acquire(blocking=not inline):
            raise _NotInline("the spool is busy")
        try:
            if inline and (self._closed or not self._segments.is_open):
                raise _NotInline("closed, or no segment open")
            match = self._forgotten_match
            records, redacted = [], 0
            for topic, key, value, meta, _ in batch:
                if match is not None and meta is not None and match(meta):  # forgotten before it was written
                    records.append(Spool.frame(topic, key, None, {"redacted": True}))
                    redacted += 1
                else:
                    records.append(Spool.frame(topic, key, value, meta))
            size = sum(map(len, records))
            if inline and self._segments.head[1] >= self.cfg.segment_bytes:  # SegmentWriter.write would rotate
                raise _NotInline("a new segment: the writer thread's")
            head = self._segments.write(records, sync=self.sync_window.strict)  # or raises, the head where it was
            first = self.sync_window.wrote(head)
            self._spooled += len(batch)
            self._written_bytes += size
            self._forgotten_on_write += redacted
            self._head = head
            with self._shared.get_lock():  # visible to the shipper once written
                self._shared[sh.HEAD_SEG], self._shared[sh.HEAD_OFF] = head
        finally:
            self._forget_lock.release()
        return first

    def _group_commit_batch(self, timeout: float) -> list:
        """The first event (waiting up to `timeout`) and everything queued behind it: one write (strict: one
        fsync) for all of them. No waiting for more: callers wait on the write, and under load the next batch
        gathers while this one is written."""
        try:
            batch = [self._q.get(timeout=timeout)]
        except queue.Empty:
            return []
        while len(batch) < 4096:
            try:
                batch.append(self._q.get_nowait())
            except queue.Empty:
                break
        return [item for item in batch if item is not WAKE]
