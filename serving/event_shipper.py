"""The shipper: a child process that delivers the spool to Kafka, so kafka-python never holds the gateway's GIL.

It reads records from the cursor up to the head the writer published, sends them with an idempotent
producer (acks=all, zstd), and moves the cursor only after every record of the batch is acknowledged. A
failed batch (broker down, slow, or gone) is sent again from the cursor after a backoff; the producer is
recreated so its buffer never holds more than one batch. An event too large for the broker (routed
experts of a long context reach megabytes at real model sizes) would fail its batch forever: it is
written whole under `deadletter/` in the spool directory and a stub naming it goes to the dead-letter
topic, counted, and the stream goes on. A cursor that cannot be saved (disk full) is kept in memory and
saved later; segments are freed only behind a saved cursor.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

from serving.event_spool import Spool

log = logging.getLogger(__name__)

# Slots of the shared int64 array between the gateway process and the shipper.
(
    HEAD_SEG,
    HEAD_OFF,
    CUR_SEG,
    CUR_OFF,
    PRODUCED,
    REPLAYED,
    FAILURES,
    BROKER_UP,
    ACKED_BYTES,
    STOP,
    OUTAGE,
    DEADLETTERED,
) = range(12)
SLOTS = 12


def _producer(cfg):
    from kafka import KafkaProducer

    ms = int(cfg.send_timeout_s * 1000)
    return KafkaProducer(
        bootstrap_servers=cfg.bootstrap,
        acks="all",
        enable_idempotence=True,
        compression_type="zstd",
        linger_ms=5,
        max_block_ms=ms,
        request_timeout_ms=ms,
        delivery_timeout_ms=ms + 1000,
        reconnect_backoff_max_ms=2000,
        client_id="flywheel-gateway",
        max_request_size=max(1 << 20, cfg.max_event_bytes + (64 << 10)),
    )


def dead_letter(spool_dir: Path, topic: str, key: str, value: bytes) -> tuple[str, bytes]:
    """Keep an oversize event whole on disk (fsynced; named by its content, so a retry writes the same
    file) and return the stub that goes to the dead-letter topic in its place."""
    from flywheel.core.events import TOPIC_DEADLETTER

    d = Path(spool_dir) / "deadletter"
    d.mkdir(exist_ok=True)
    name = f"{topic}-{hashlib.sha256(value).hexdigest()[:24]}.bin"
    path = d / name
    if not path.exists():
        tmp = d / (name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(value)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    stub = {"topic": topic, "key": key, "bytes": len(value), "file": str(path), "ts": time.time()}
    return TOPIC_DEADLETTER, json.dumps(stub).encode()


def _fit(records: list, max_bytes: int, spool_dir: Path) -> tuple[list, int]:
    """The batch with every oversize event replaced by its dead-letter stub; and how many were."""
    out, n = [], 0
    for t, k, v in records:
        if len(v) + len(k) > max_bytes:
            t, v = dead_letter(spool_dir, t, k, v)
            n += 1
        out.append((t, k, v))
    return out, n


def _save_cursor(spool: Spool, cursor) -> bool:
    try:
        spool.save_cursor(cursor)
    except OSError as e:  # keep shipping; the cursor is saved at the next interval that works
        log.warning("could not save the spool cursor (%s); segments stay until it can be", e)
        return False
    spool.delete_before(cursor[0])
    return True


def _head(shared) -> tuple[int, int]:
    with shared.get_lock():  # the writer publishes (segment, offset) as a pair
        return shared[HEAD_SEG], shared[HEAD_OFF]


def run(cfg, shared) -> None:
    """Process entry point. `cfg` is an EventLogConfig; `shared` the int64 array above."""
    import signal

    # A SIGTERM to the gateway's process group must not kill the shipper before the gateway has flushed the
    # spool to it: the parent stops it through STOP. If the parent dies, the shipper notices and exits.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # outages are reported here, once
    spool = Spool(cfg.spool_dir)
    with shared.get_lock():
        cursor = (shared[CUR_SEG], shared[CUR_OFF])
    producer = None
    saved_at = sent_at = 0.0
    saved = cursor  # the cursor on disk
    backlog = False
    stop_deadline = None
    while True:
        head = _head(shared)
        if os.getppid() != parent:  # orphaned: whatever is unsent stays in the spool for the next start
            break
        if shared[STOP]:
            stop_deadline = stop_deadline or time.monotonic() + cfg.stop_timeout_s
            if cursor >= head or time.monotonic() > stop_deadline:
                break
        if cursor >= head:
            if saved != cursor and time.monotonic() - saved_at >= cfg.cursor_save_interval_s:
                saved = cursor if _save_cursor(spool, cursor) else saved  # caught up: a save that failed, again
                saved_at = time.monotonic()
            time.sleep(0.05)
            continue
        if not shared[STOP] and not backlog and time.monotonic() - sent_at < cfg.ship_interval_s:
            # Ship in bursts, not per event: on a machine shared with the engine each send costs the
            # requests in flight a little (measured in benchmarks.gateway); a full batch goes at once.
            time.sleep(0.05)
            continue
        records, end, nbytes = spool.read(cursor, head, cfg.send_batch)
        backlog = len(records) == cfg.send_batch
        sent_at = time.monotonic()
        if records:
            try:
                records, oversize = _fit(records, cfg.max_event_bytes, spool.dir)
            except OSError as e:  # the dead-letter disk, not Kafka: say so, keep the batch, try again
                log.error("could not dead-letter an oversize event under %s (%s); retrying", spool.dir, e)
                time.sleep(cfg.retry_backoff_s)
                continue
            try:
                if producer is None:
                    producer = _producer(cfg)
                futures = [producer.send(t, key=k.encode(), value=v) for t, k, v in records]
                producer.flush(timeout=cfg.send_timeout_s)
                for fut in futures:
                    fut.get(timeout=0)
            except Exception as e:  # keep the batch; try again from the cursor
                shared[FAILURES] += 1
                if shared[BROKER_UP] or not shared[OUTAGE]:
                    log.warning(
                        "Kafka unreachable (%s: %s); events stay in the spool at %s", type(e).__name__, e, spool.dir
                    )
                shared[BROKER_UP] = 0
                shared[OUTAGE] = 1
                if producer is not None:
                    try:
                        producer.close(timeout=0)  # drop its buffer: the spool holds every record
                    except Exception:
                        pass
                    producer = None
                time.sleep(cfg.retry_backoff_s)
                continue
            if not shared[BROKER_UP]:
                log.info("Kafka reachable; delivering from %s", spool.dir)
            shared[BROKER_UP] = 1
            shared[PRODUCED] += len(records)
            if oversize:
                shared[DEADLETTERED] += oversize
                log.error(
                    "%d event(s) over %d bytes dead-lettered (kept under %s/deadletter)",
                    oversize,
                    cfg.max_event_bytes,
                    spool.dir,
                )
            if shared[OUTAGE]:
                shared[REPLAYED] += len(records)
        cursor = end
        with shared.get_lock():  # a shipper started again after a kill reads the pair whole
            shared[CUR_SEG], shared[CUR_OFF] = cursor
            shared[ACKED_BYTES] += nbytes
        if cursor >= _head(shared):
            shared[OUTAGE] = 0  # caught up
        now = time.monotonic()
        if now - saved_at >= cfg.cursor_save_interval_s:
            # Saved at intervals, not per batch: after a crash at most that much is sent again
            # (duplicates, which consumers drop by event_id), never lost.
            saved = cursor if _save_cursor(spool, cursor) else saved
            saved_at = now
    _save_cursor(spool, cursor)
    if producer is not None:
        try:
            producer.close(timeout=2)
        except Exception:
            pass
