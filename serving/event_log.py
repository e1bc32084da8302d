"""Lossless event logging off the request path: an on-disk spool in front of an idempotent Kafka producer.

    request handler --submit()--> bounded queue --writer thread--> spool segments (group-committed fsync)
                                                                        |
                             shipper process (serving.event_shipper) <--'  reads from its cursor
                                   '-> KafkaProducer (idempotent, acks=all, zstd); cursor moves on ack

The request path only does a non-blocking queue put. Every event is written to the spool before it is
sent, so a dead or slow broker fills the disk (up to `max_spool_bytes`, with an alarm), never the heap;
when the broker returns the backlog goes out in the order it was written. A batch that fails is sent
again from the cursor, so Kafka may hold an event twice; consumers drop duplicates by event_id.
kafka-python runs in its own process: in a thread, its pure-Python work held the GIL often enough to add
milliseconds to the gateway's p50 (measured in benchmarks.gateway).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from serving import event_shipper as sh
from serving.event_spool import Spool

log = logging.getLogger(__name__)


@dataclass
class EventLogConfig:
    spool_dir: Path
    bootstrap: str | None = None  # None: spool only (nothing is shipped until a broker is configured)
    max_spool_bytes: int = 1 << 30  # undelivered bytes on disk before new events are refused (alarm)
    segment_bytes: int = 16 << 20
    fsync_interval_s: float = 0.05  # group commit: one fsync for everything that arrives within this
    queue_max: int = 20_000  # events waiting for the writer thread
    send_batch: int = 2000
    ship_interval_s: float = 0.5  # the shipper sends at most this often unless a full batch is waiting
    send_timeout_s: float = 3.0  # a batch not acknowledged by then counts as a failed delivery
    retry_backoff_s: float = 1.0
    cursor_save_interval_s: float = 0.5
    stop_timeout_s: float = 10.0  # on close, how long the shipper keeps trying to deliver the backlog


@dataclass
class Stats:
    submitted: int = 0
    spooled: int = 0  # written to the spool (every event passes through it)
    produced: int = 0  # acknowledged by the broker
    replayed: int = 0  # acknowledged after having waited through a broker outage
    dropped_queue_full: int = 0
    dropped_spool_full: int = 0
    send_failures: int = 0
    broker_up: bool = False
    pending_bytes: int = 0  # written but not yet acknowledged


class EventLog:
    def __init__(self, cfg: EventLogConfig):
        self.cfg = cfg
        self.spool = Spool(cfg.spool_dir)
        self._q: queue.Queue = queue.Queue(maxsize=cfg.queue_max)
        self._stop = threading.Event()
        ctx = multiprocessing.get_context("spawn")
        self._shared = ctx.Array("q", sh.SLOTS)  # int64 slots, see serving.event_shipper
        cursor = self.spool.load_cursor()
        head = self.spool.recover_head(cursor)
        self._head = head
        self._written_bytes = self.spool.bytes_between(cursor, head)  # a backlog from a previous run
        s = self._shared
        s[sh.CUR_SEG], s[sh.CUR_OFF] = cursor
        s[sh.HEAD_SEG], s[sh.HEAD_OFF] = head
        s[sh.OUTAGE] = 1 if self._written_bytes else 0  # delivering an old backlog counts as replay
        self._submitted = self._spooled = self._dropped_queue = self._dropped_spool = 0
        self._writer = threading.Thread(target=self._write_loop, name="event-spool-writer", daemon=True)
        self._shipper = ctx.Process(target=sh.run, args=(cfg, self._shared), name="event-shipper", daemon=True) \
            if cfg.bootstrap else None
        self._alarm_logged = 0.0

    # ------------------------------------------------------------------ request path
    def submit(self, topic: str, key: str, value: bytes) -> bool:
        """Queue an event; never blocks. False if it had to be dropped (queue or spool full)."""
        self._submitted += 1
        if self.spool_full:
            self._dropped_spool += 1
            self._alarm()
            return False
        try:
            self._q.put_nowait((topic, key, value))
            return True
        except queue.Full:
            self._dropped_queue += 1
            self._alarm()
            return False

    @property
    def pending_bytes(self) -> int:
        return max(0, self._written_bytes - self._shared[sh.ACKED_BYTES])

    @property
    def spool_full(self) -> bool:
        return self.pending_bytes > self.cfg.max_spool_bytes

    @property
    def stats(self) -> Stats:
        s = self._shared
        return Stats(submitted=self._submitted, spooled=self._spooled, produced=s[sh.PRODUCED],
                     replayed=s[sh.REPLAYED], dropped_queue_full=self._dropped_queue,
                     dropped_spool_full=self._dropped_spool, send_failures=s[sh.FAILURES],
                     broker_up=bool(s[sh.BROKER_UP]), pending_bytes=self.pending_bytes)

    def _alarm(self) -> None:
        now = time.monotonic()
        if now - self._alarm_logged > 60:
            self._alarm_logged = now
            log.error("event log over its limits: %d bytes undelivered in %s (limit %d), queue %d/%d; "
                      "new events are being dropped", self.pending_bytes, self.spool.dir, self.cfg.max_spool_bytes,
                      self._q.qsize(), self.cfg.queue_max)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "EventLog":
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
            if self._q.empty() and self.pending_bytes == 0:
                return True
            time.sleep(0.05)
        return False

    # ------------------------------------------------------------------ writer thread
    def _write_loop(self) -> None:
        seg, off = self._head
        f = open(self.spool.path(seg), "ab")
        try:
            while True:
                batch = self._group_commit_batch()
                if not batch:
                    if self._stop.is_set() and self._q.empty():
                        return
                    continue
                for topic, key, value in batch:
                    if off >= self.cfg.segment_bytes:  # rotate: seal this segment, open the next
                        self._sync(f, seg, off)
                        f.close()
                        seg, off = seg + 1, 0
                        f = open(self.spool.path(seg), "ab")
                    record = Spool.frame(topic, key, value)
                    f.write(record)
                    off += len(record)
                    self._written_bytes += len(record)
                self._sync(f, seg, off)
                self._spooled += len(batch)
        finally:
            f.close()

    def _group_commit_batch(self) -> list:
        """Everything that arrives within fsync_interval of the first event: one fsync for all of them."""
        try:
            batch = [self._q.get(timeout=self.cfg.fsync_interval_s)]
        except queue.Empty:
            return []
        deadline = time.monotonic() + self.cfg.fsync_interval_s
        while len(batch) < 4096 and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(self._q.get(timeout=left))
            except queue.Empty:
                break
        return batch

    def _sync(self, f, seg: int, off: int) -> None:
        """Make the records durable, then visible to the shipper."""
        f.flush()
        os.fsync(f.fileno())
        self._head = (seg, off)
        with self._shared.get_lock():
            self._shared[sh.HEAD_SEG], self._shared[sh.HEAD_OFF] = seg, off
