"""The shipper: a child process that delivers the spool to Kafka, so kafka-python never holds the gateway's GIL.

It reads records from the cursor up to the head the writer published, sends them with an idempotent
producer (acks=all, zstd), and moves the cursor only after every record of the batch is acknowledged. A
failed batch (broker down, slow, or gone) is sent again from the cursor after a backoff; the producer is
recreated so its buffer never holds more than one batch. An event too large for the broker (routed
experts of a long context reach megabytes at real model sizes) would fail its batch forever: it is
written whole under `deadletter/` in the spool directory and a stub naming it goes to the dead-letter
topic, counted, and the stream goes on. A cursor that cannot be saved (disk full) is kept in memory and
saved later; segments are freed only behind a saved cursor.

Records carry meta (tenant, ts, texts to scan), never sent. Before a batch goes out, the records of forgotten
tenants are left out (serving.event_log.forget), and every event whose texts hold a secret
(serving.event_log.secret_scrub) is
replaced by its withheld form (contracts.events.withhold: ids, tenant, version and timing, no content), here
rather than on the request path or under the gateway's GIL. Failing closed, an event is withheld without a
finding too when: its scan failed or went over its CPU budget ("scan_error", "scan_limit"); the undelivered
backlog after it is over `scan_backlog_bytes` ("unscanned_backlog": the shipper is one thread for every tenant,
so a client whose prompts are slow to scan must not hold everyone's events back until the spool is full; it
scans again once the backlog is under the limit); it is a completion or a feedback spooled without meta, by a
release before meta existed ("unscanned"). Other values (tenant records) without meta go out as they are.
Once the broker has acknowledged a batch, every record of it that went out withheld is redacted in the spool
too (Spool.redact_at: its content, secret and scan texts gone from the disk now, not when its segment is freed
behind the cursor), with any damaged record of the batch (a redaction a crash cut short). A batch is read,
filtered and scanned once, then sent until acknowledged (a retry through an outage does not scan again); a
forget that arrives meanwhile is applied first, and the batch read again. The scanner's memory of clean lines
(users' code) is cleared whenever forgotten.json is loaded again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from contracts.events import TOPIC_TENANTS
from infra import kafka_auth
from infra.kafka_admin import ensure_topics
from serving.event_log import forget as fg
from serving.event_log.scan import Backlog, Scrub
from serving.event_log.spool import Spool

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
    SCRUBBED,  # events delivered withheld: a secret, a failed scan, or not scanned (UNSCANNED)
    FORGOTTEN,  # records of forgotten tenants never delivered (skipped, or redacted ahead of the cursor)
    FORGET_REQ,  # the forgotten.json generation the gateway wrote last
    FORGET_GEN,  # the generation the shipper has loaded and redacted the spool for
    UNSCANNED,  # of SCRUBBED: withheld without a scan (a backlog over scan_backlog_bytes, a record without meta)
) = range(17)
SLOTS = 17


def _producer(cfg):
    from kafka import KafkaProducer

    ms = int(cfg.send_timeout_s * 1000)
    return KafkaProducer(
        bootstrap_servers=cfg.bootstrap,
        **kafka_auth.client_config(),
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
    from contracts.events import TOPIC_DEADLETTER

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


@dataclass
class _Batch:
    records: list  # (topic, key, value) to send
    end: tuple[int, int]
    nbytes: int
    full: bool
    scrubbed: int  # withheld (unscanned included)
    unscanned: int  # withheld without a scan
    skipped: int  # forgotten
    redact: list  # positions to redact in the spool once the batch is acknowledged: withheld, damaged


def _prepare(
    spool: Spool, cursor, head, cfg, forgotten: fg.Watcher, scrub: Scrub, shared, backlog: Backlog
) -> _Batch | None:
    """The next batch: forgotten records left out, secrets withheld. None if a forget came in meanwhile."""
    found, end, nbytes, damaged = spool.read_at(cursor, head, cfg.send_batch)
    match, gen = forgotten.match, forgotten.generation
    out, scrubbed, unscanned, skipped, redact = [], 0, 0, 0, list(damaged)
    for pos, (topic, key, value, meta) in found:
        withheld = blind = False
        if meta is None:
            if scrub.enabled:
                value, withheld = scrub.unscanned(value)
                blind = withheld
        else:
            if match is not None and match(meta):
                skipped += 1
                continue
            scan = meta.get("scan")
            if scan and scrub.enabled:
                if shared[FORGET_REQ] > gen:
                    return None
                if backlog.too_far(pos, _head(shared)):
                    value, withheld, blind = scrub.withhold(value, ["unscanned_backlog"]), True, True
                else:
                    value, withheld = scrub.apply(value, scan)
        if withheld:
            scrubbed += 1
            unscanned += blind
            redact.append(pos)
        out.append((topic, key, value))
    return _Batch(out, end, nbytes, len(found) == cfg.send_batch, scrubbed, unscanned, skipped, redact)


def _redact_sent(spool: Spool, batch: _Batch) -> None:
    """The acknowledged batch's withheld (and damaged) records, redacted in the spool. One that fails is left for
    the segment's deletion behind the cursor, said once per batch."""
    if not batch.redact:
        return
    try:
        spool.redact_at(batch.redact)
    except (OSError, ValueError) as e:
        log.error(
            "could not redact %d withheld record(s) in %s (%s); their content stays until the segment is freed",
            len(batch.redact),
            spool.dir,
            e,
        )


def _redact(spool: Spool, forgotten: fg.Watcher, shared, cursor) -> bool:
    """Redact the spool for the generation loaded, then acknowledge it (FORGET_GEN). False if that failed."""
    gen = forgotten.generation
    try:
        ahead = fg.redact(spool, forgotten.tenants, _head(shared), cursor)
    except OSError as e:
        log.error("could not redact forgotten tenants in %s (%s); skipping them meanwhile, retrying", spool.dir, e)
        return False
    try:
        fg.save_done(spool.dir, gen)
    except OSError as e:  # redacted and fsynced: a start after a crash only redoes it (a no-op)
        log.warning("could not save %s (%s)", fg.DONE, e)
    with shared.get_lock():
        shared[FORGOTTEN] += ahead
        shared[FORGET_GEN] = max(shared[FORGET_GEN], gen)
    return True


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


def _lower_priority(nice: int) -> None:
    """Yield the cores to serving: on a machine the gateway shares with its replicas, each burst the shipper sends
    competes with the engine's worker threads, which wait for one another at every step (benchmarks.gateway counts
    the replica's CPU per request with logging on and off). Delivery is on no request's path (the spool holds what
    waits), so it runs at a lower priority. Called before the producer's network thread starts, which inherits it
    (on Linux a thread's nice value is its own)."""
    if nice > 0:
        try:
            os.nice(nice)
        except OSError as e:  # a container that forbids it: ship at the normal priority
            log.warning("could not lower the event shipper's priority (%s)", e)


def main(cfg, shared) -> None:
    """The shipper process's entry point: `run` at a lower priority (run alone is the loop, which tests call in
    their own process)."""
    _lower_priority(cfg.shipper_nice)
    run(cfg, shared)


def run(cfg, shared) -> None:
    """The shipper's loop. `cfg` is an EventLogConfig; `shared` the int64 array above."""
    import signal

    # A SIGTERM to the gateway's process group must not kill the shipper before the gateway has flushed the
    # spool to it: the parent stops it through STOP. If the parent dies, the shipper notices and exits.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # outages are reported here, once
    spool = Spool(cfg.spool_dir)
    scrub = Scrub(cfg.scrub)
    undelivered = Backlog(spool, min(cfg.scan_backlog_bytes, cfg.max_spool_bytes * 3 // 4))
    forgotten = fg.Watcher(spool.dir, on_reload=scrub.clear_cache)  # loaded before anything is sent
    with shared.get_lock():
        cursor = (shared[CUR_SEG], shared[CUR_OFF])
    producer = None
    topics_checked = False  # the tenants topic made as it must be, before its first record
    saved_at = sent_at = redact_at = 0.0
    saved = cursor  # the cursor on disk
    backlog = False
    stop_deadline = None
    batch: _Batch | None = None  # read, filtered and scanned once; sent until acknowledged
    while True:
        head = _head(shared)
        if os.getppid() != parent:  # orphaned: whatever is unsent stays in the spool for the next start
            break
        if forgotten.changed(shared[FORGET_REQ]):
            forgotten.reload()  # and the scanner's clean lines cleared (on_reload)
            batch = None  # read again: it may hold records of a tenant forgotten now
        if shared[FORGET_GEN] < forgotten.generation and time.monotonic() >= redact_at:
            if not _redact(spool, forgotten, shared, cursor):
                redact_at = time.monotonic() + cfg.retry_backoff_s
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
        if batch is None:
            batch = _prepare(spool, cursor, head, cfg, forgotten, scrub, shared, undelivered)
            if batch is None:
                continue  # a tenant was forgotten while this batch was scanned: load that first
        backlog = batch.full
        sent_at = time.monotonic()
        if batch.records:
            try:
                records, oversize = _fit(batch.records, cfg.max_event_bytes, spool.dir)
            except OSError as e:  # the dead-letter disk, not Kafka: say so, keep the batch, try again
                log.error("could not dead-letter an oversize event under %s (%s); retrying", spool.dir, e)
                time.sleep(cfg.retry_backoff_s)
                continue
            try:
                if producer is None:
                    producer = _producer(cfg)
                if not topics_checked and any(t == TOPIC_TENANTS for t, _, _ in records):
                    # Compacted and kept forever, not what auto-creation would make of it (infra.kafka_admin). Best
                    # effort: a gateway whose Kafka user may not create topics still delivers.
                    topics_checked = True
                    try:
                        ensure_topics(cfg.bootstrap, topics=(TOPIC_TENANTS,))
                    except Exception as e:  # noqa: BLE001
                        log.warning("could not check the tenants topic's settings (%s: %s)", type(e).__name__, e)
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
        _redact_sent(spool, batch)  # before the cursor moves: after a crash the batch is read and sent again
        cursor = batch.end
        with shared.get_lock():  # a shipper started again after a kill reads the pair whole
            shared[CUR_SEG], shared[CUR_OFF] = cursor
            shared[ACKED_BYTES] += batch.nbytes
            shared[SCRUBBED] += batch.scrubbed
            shared[UNSCANNED] += batch.unscanned
            shared[FORGOTTEN] += batch.skipped
        batch = None
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
