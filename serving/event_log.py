"""Lossless event logging off the request path: an on-disk spool in front of an idempotent Kafka producer.

    request handler --submit()--> bounded queue --writer thread--> spool segments (fsync'd in batches)
                                                   sender thread <-- reads from its cursor --'
                                                        |-> KafkaProducer (idempotent, acks=all, zstd)
                                                        '-> cursor advances only after the broker acked

The request path only does a non-blocking queue put. Every event is written to the spool before it is
sent, so a dead or slow broker fills the disk (up to `max_spool_bytes`, with an alarm), never the heap;
when the broker returns the backlog goes out in the order it was written. A batch that fails is sent
again from the cursor, so Kafka may hold an event twice; consumers drop duplicates by event_id.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgpack

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")  # payload length, crc32 of payload


@dataclass
class EventLogConfig:
    spool_dir: Path
    bootstrap: str | None = None  # None: spool only (the sender idles until a broker is configured)
    max_spool_bytes: int = 1 << 30  # undelivered bytes on disk before new events are refused (alarm)
    segment_bytes: int = 16 << 20
    fsync_interval_s: float = 0.05
    queue_max: int = 20_000  # events waiting for the writer thread
    send_batch: int = 500
    send_timeout_s: float = 10.0
    retry_backoff_s: float = 1.0


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
        self.dir = Path(cfg.spool_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stats = Stats()
        self._q: queue.Queue = queue.Queue(maxsize=cfg.queue_max)
        self._stop = threading.Event()
        self._written = threading.Condition()
        self._lock = threading.Lock()  # pending_bytes: the writer adds, the sender subtracts
        self._cursor = self._load_cursor()  # (segment, offset) of the first unacknowledged record
        self._head = self._scan_head()  # (segment, offset) just past the last fsync'd record
        self.stats.pending_bytes = self._bytes_between(self._cursor, self._head)
        self._outage = self.stats.pending_bytes > 0  # a backlog from a previous run counts as replay
        self._writer = threading.Thread(target=self._write_loop, name="event-spool-writer", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="event-sender", daemon=True)
        self._spool_full_logged = 0.0

    # ------------------------------------------------------------------ request path (any thread)
    def submit(self, topic: str, key: str, value: bytes) -> bool:
        """Queue an event; never blocks. False if it had to be dropped (queue or spool full)."""
        self.stats.submitted += 1
        if self.stats.pending_bytes > self.cfg.max_spool_bytes:
            self.stats.dropped_spool_full += 1
            self._alarm()
            return False
        try:
            self._q.put_nowait((topic, key, value))
            return True
        except queue.Full:
            self.stats.dropped_queue_full += 1
            self._alarm()
            return False

    def _alarm(self) -> None:
        now = time.monotonic()
        if now - self._spool_full_logged > 60:
            self._spool_full_logged = now
            log.error("event log over its limits: %d bytes undelivered in %s (limit %d), queue %d/%d; "
                      "new events are being dropped", self.stats.pending_bytes, self.dir, self.cfg.max_spool_bytes,
                      self._q.qsize(), self.cfg.queue_max)

    @property
    def spool_full(self) -> bool:
        return self.stats.pending_bytes > self.cfg.max_spool_bytes

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "EventLog":
        self._writer.start()
        self._sender.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Write out everything queued, try to deliver it for up to `timeout`; the rest stays spooled."""
        self._stop.set()
        self._writer.join(timeout=timeout)
        deadline = time.monotonic() + timeout
        while self._sender.is_alive() and time.monotonic() < deadline:
            self._sender.join(timeout=0.1)

    def drain(self, timeout: float) -> bool:
        """Wait until every submitted event is acknowledged by the broker (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._q.empty() and self.stats.pending_bytes == 0 and self._cursor == self._head:
                return True
            time.sleep(0.05)
        return False

    # ------------------------------------------------------------------ spool files
    def _segment_path(self, seg: int) -> Path:
        return self.dir / f"{seg:012d}.log"

    def _segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob("*.log"))

    def _load_cursor(self) -> tuple[int, int]:
        try:
            c = json.loads((self.dir / "cursor.json").read_text())
            return int(c["segment"]), int(c["offset"])
        except (OSError, ValueError, KeyError):
            segs = self._segments()
            return (segs[0] if segs else 1), 0

    def _save_cursor(self) -> None:
        tmp = self.dir / "cursor.json.tmp"
        tmp.write_text(json.dumps({"segment": self._cursor[0], "offset": self._cursor[1]}))
        os.replace(tmp, self.dir / "cursor.json")

    def _scan_head(self) -> tuple[int, int]:
        """End of the last complete record; a torn tail from a crash is cut off."""
        segs = self._segments()
        if not segs:
            return self._cursor
        last = segs[-1]
        path = self._segment_path(last)
        good = 0
        with open(path, "rb") as f:
            data = f.read()
        while good + _HEADER.size <= len(data):
            n, crc = _HEADER.unpack_from(data, good)
            end = good + _HEADER.size + n
            if end > len(data) or zlib.crc32(data[good + _HEADER.size:end]) != crc:
                break
            good = end
        if good != len(data):
            log.warning("spool %s: cutting a torn tail of %d bytes", path, len(data) - good)
            with open(path, "r+b") as f:
                f.truncate(good)
        return last, good

    def _bytes_between(self, a: tuple[int, int], b: tuple[int, int]) -> int:
        if a[0] == b[0]:
            return max(0, b[1] - a[1])
        total = 0
        for seg in self._segments():
            if a[0] <= seg <= b[0]:
                size = self._segment_path(seg).stat().st_size
                total += (b[1] if seg == b[0] else size) - (a[1] if seg == a[0] else 0)
        return total

    # ------------------------------------------------------------------ writer thread
    def _write_loop(self) -> None:
        seg, off = self._head
        f = open(self._segment_path(seg), "ab")
        try:
            while True:
                batch = []
                try:
                    batch.append(self._q.get(timeout=self.cfg.fsync_interval_s))
                    while len(batch) < 4096:
                        batch.append(self._q.get_nowait())
                except queue.Empty:
                    pass
                if batch:
                    for topic, key, value in batch:
                        payload = msgpack.packb((topic, key, value), use_bin_type=True)
                        f.write(_HEADER.pack(len(payload), zlib.crc32(payload)))
                        f.write(payload)
                        off += _HEADER.size + len(payload)
                        with self._lock:
                            self.stats.pending_bytes += _HEADER.size + len(payload)
                    f.flush()
                    os.fsync(f.fileno())
                    self.stats.spooled += len(batch)
                    with self._written:
                        self._head = (seg, off)
                        self._written.notify_all()
                    if off >= self.cfg.segment_bytes:
                        f.close()
                        seg, off = seg + 1, 0
                        f = open(self._segment_path(seg), "ab")
                        os.fsync(os.open(self.dir, os.O_RDONLY))
                        with self._written:
                            self._head = (seg, off)
                elif self._stop.is_set() and self._q.empty():
                    return
        finally:
            f.close()

    # ------------------------------------------------------------------ sender thread
    def _read_batch(self) -> tuple[list, tuple[int, int]]:
        """Up to send_batch records from the cursor; returns them and the position after them."""
        seg, off = self._cursor
        head = self._head
        records = []
        while len(records) < self.cfg.send_batch and (seg, off) < head:
            path = self._segment_path(seg)
            with open(path, "rb") as f:
                f.seek(off)
                limit = head[1] if seg == head[0] else None
                while len(records) < self.cfg.send_batch and (limit is None or off < limit):
                    hdr = f.read(_HEADER.size)
                    if len(hdr) < _HEADER.size:
                        break
                    n, crc = _HEADER.unpack(hdr)
                    payload = f.read(n)
                    if len(payload) < n or zlib.crc32(payload) != crc:
                        break
                    records.append((msgpack.unpackb(payload, raw=False), _HEADER.size + n))
                    off += _HEADER.size + n
            if len(records) < self.cfg.send_batch and (seg, off) < head and seg < head[0]:
                seg, off = seg + 1, 0  # this segment is exhausted; continue with the next
            else:
                break
        return records, (seg, off)

    def _make_producer(self):
        from kafka import KafkaProducer

        return KafkaProducer(bootstrap_servers=self.cfg.bootstrap, acks="all", enable_idempotence=True,
                             compression_type="zstd", linger_ms=5, max_block_ms=int(self.cfg.send_timeout_s * 1000),
                             request_timeout_ms=int(self.cfg.send_timeout_s * 1000),
                             delivery_timeout_ms=int(self.cfg.send_timeout_s * 1000) + 1000,
                             reconnect_backoff_max_ms=2000, client_id="flywheel-gateway")

    def _send_loop(self) -> None:
        producer = None
        while True:
            with self._written:
                if self._cursor >= self._head:
                    if self._stop.is_set() and not self._writer.is_alive():
                        break
                    self._written.wait(timeout=0.2)
                    continue
            if self.cfg.bootstrap is None:
                if self._stop.wait(0.5):
                    break
                continue
            records, end = self._read_batch()
            if not records:  # the cursor sat at the end of a finished segment: step into the next
                self._advance(end, 0, 0)
                continue
            try:
                if producer is None:
                    producer = self._make_producer()
                futures = [producer.send(t, key=k.encode(), value=v) for (t, k, v), _ in records]
                producer.flush(timeout=self.cfg.send_timeout_s)
                for fut in futures:
                    fut.get(timeout=0)
            except Exception as e:  # broker down, slow, or gone: keep the batch, retry from the cursor
                self.stats.send_failures += 1
                if self.stats.broker_up or not self._outage:
                    log.warning("Kafka unreachable (%s: %s); events stay in the spool at %s", type(e).__name__, e,
                                self.dir)
                self.stats.broker_up = False
                self._outage = True
                if producer is not None:
                    try:
                        producer.close(timeout=0)  # drop its buffer: the spool holds every record
                    except Exception:
                        pass
                    producer = None
                if self._stop.wait(self.cfg.retry_backoff_s):
                    break
                continue
            if not self.stats.broker_up:
                log.info("Kafka reachable; delivering from the spool")
            self.stats.broker_up = True
            nbytes = sum(n for _, n in records)
            self._advance(end, len(records), nbytes)
        if producer is not None:
            try:
                producer.close(timeout=2)
            except Exception:
                pass

    def _advance(self, end: tuple[int, int], n: int, nbytes: int) -> None:
        self._cursor = end
        self._save_cursor()
        self.stats.produced += n
        if self._outage:
            self.stats.replayed += n
        with self._lock:
            self.stats.pending_bytes = max(0, self.stats.pending_bytes - nbytes)
            if self.stats.pending_bytes == 0 and self._q.empty():
                self._outage = False
        for seg in self._segments():  # fully delivered segments are deleted
            if seg < end[0]:
                self._segment_path(seg).unlink(missing_ok=True)
