"""The event spool on its own (no broker): durable, crash-tolerant, bounded."""

import time

from serving.event_log import EventLog, EventLogConfig
from serving.event_spool import Spool


def _wait(cond, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def _all_records(spool_dir):
    spool = Spool(spool_dir)
    cursor = spool.load_cursor()
    head = spool.recover_head(cursor)
    out = []
    while True:
        recs, cursor, _ = spool.read(cursor, head, 100)
        out += recs
        if not recs and cursor >= head:
            return out


def test_everything_submitted_is_on_disk_and_survives_a_restart(tmp_path):
    log = EventLog(EventLogConfig(spool_dir=tmp_path)).start()
    for i in range(1000):
        assert log.submit("completions", f"k{i % 7}", f"v{i}".encode())
    assert _wait(lambda: log.stats.spooled == 1000)
    log.close(timeout=2)
    assert log.stats.produced == 0 and log.pending_bytes > 0
    again = EventLog(EventLogConfig(spool_dir=tmp_path))
    assert again.pending_bytes == log.pending_bytes  # the backlog is found again
    assert [v for _, _, v in _all_records(tmp_path)] == [f"v{i}".encode() for i in range(1000)]


def test_torn_tail_is_cut_and_earlier_records_kept(tmp_path):
    log = EventLog(EventLogConfig(spool_dir=tmp_path)).start()
    for _ in range(10):
        log.submit("feedback", "k", b"x" * 100)
    assert _wait(lambda: log.stats.spooled == 10)
    log.close(timeout=2)
    seg = sorted(tmp_path.glob("*.log"))[-1]
    good = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\x40\x00\x00\x00garbage")  # a crash in the middle of a record
    again = EventLog(EventLogConfig(spool_dir=tmp_path))
    assert seg.stat().st_size == good and again._head == (int(seg.stem), good)
    assert len(_all_records(tmp_path)) == 10


def test_spool_limit_refuses_new_events_and_raises_the_alarm(tmp_path):
    log = EventLog(EventLogConfig(spool_dir=tmp_path, max_spool_bytes=2000, fsync_interval_s=0.001)).start()
    accepted = 0
    for _ in range(50):
        accepted += log.submit("completions", "k", b"y" * 200)
        time.sleep(0.01)
    assert _wait(lambda: log.stats.spooled == accepted)
    assert log.spool_full and log.stats.dropped_spool_full > 0
    assert accepted < 50 and log.pending_bytes < 2000 + 10 * 220
    log.close(timeout=2)


def test_full_queue_drops_instead_of_blocking(tmp_path):
    log = EventLog(EventLogConfig(spool_dir=tmp_path, queue_max=5))  # writer not started: nothing drains
    t = time.monotonic()
    results = [log.submit("completions", "k", b"z") for _ in range(8)]
    assert time.monotonic() - t < 0.5
    assert results == [True] * 5 + [False] * 3 and log.stats.dropped_queue_full == 3


def test_segments_rotate_and_read_across_them(tmp_path):
    log = EventLog(EventLogConfig(spool_dir=tmp_path, segment_bytes=4096)).start()
    for i in range(200):
        log.submit("completions", "k", i.to_bytes(4, "big") + bytes(96))
    assert _wait(lambda: log.stats.spooled == 200)
    log.close(timeout=2)
    assert len(list(tmp_path.glob("*.log"))) > 3
    values = [v for _, _, v in _all_records(tmp_path)]
    assert [int.from_bytes(v[:4], "big") for v in values] == list(range(200))
