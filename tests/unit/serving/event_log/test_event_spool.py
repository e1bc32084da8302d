"""The event spool on its own (no broker): durable, crash-tolerant, bounded; records with meta, the old format
read, a forgotten tenant redacted in place."""

import json
import time
import zlib

import msgpack
import pytest

from serving.event_log import forget as fg, shipper as sh
from serving.event_log.pipeline import EventLog, EventLogConfig
from serving.event_log.spool import HEADER, Spool, _redacted
from tests.spool_helpers import raw_records, segment_bytes, wait_for


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
    assert wait_for(lambda: log.stats.spooled == 1000)
    log.close(timeout=2)
    assert log.stats.produced == 0 and log.pending_bytes > 0
    again = EventLog(EventLogConfig(spool_dir=tmp_path))
    assert again.pending_bytes == log.pending_bytes  # the backlog is found again
    assert [v for _, _, v, _ in _all_records(tmp_path)] == [f"v{i}".encode() for i in range(1000)]


def test_torn_tail_is_cut_and_earlier_records_kept(tmp_path):
    log = EventLog(EventLogConfig(spool_dir=tmp_path)).start()
    for _ in range(10):
        log.submit("feedback", "k", b"x" * 100)
    assert wait_for(lambda: log.stats.spooled == 10)
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
    assert wait_for(lambda: log.stats.spooled == accepted)
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
    assert wait_for(lambda: log.stats.spooled == 200)
    log.close(timeout=2)
    assert len(list(tmp_path.glob("*.log"))) > 3
    values = [v for _, _, v, _ in _all_records(tmp_path)]
    assert [int.from_bytes(v[:4], "big") for v in values] == list(range(200))


def test_meta_is_kept_and_the_old_three_element_format_still_reads(tmp_path):
    old = b"".join(  # records as the previous release wrote them
        HEADER.pack(len(p), zlib.crc32(p)) + p
        for p in (msgpack.packb(("completions", f"old{i}", b"v"), use_bin_type=True) for i in range(3))
    )
    Spool(tmp_path).path(1).write_bytes(old)
    log = EventLog(EventLogConfig(spool_dir=tmp_path)).start()
    meta = {"tenant": "t1", "ts": 12.5, "scan": ["prompt", "", "output"]}
    log.submit("completions", "new", b"w", meta=meta)
    log.submit("feedback", "plain", b"x")
    assert wait_for(lambda: log.stats.spooled == 2)
    log.close(timeout=2)
    assert _all_records(tmp_path) == [
        ("completions", "old0", b"v", None),
        ("completions", "old1", b"v", None),
        ("completions", "old2", b"v", None),
        ("completions", "new", b"w", meta),
        ("feedback", "plain", b"x", None),
    ]


def _tenant_events(log, n, t0):
    """n records each of tenants "gone" and "stays" (a distinctive string in value and scan text), and events
    without meta; "gone"'s ts run from t0 to t0 + n - 1."""
    for i in range(n):
        for tenant in ("gone", "stays"):
            marker = f"{tenant.upper()}-MARKER-{i:04d}"
            meta = {"tenant": tenant, "ts": t0 + i, "scan": [f"def f():  # {marker}", "", "pass"]}
            log.submit("completions", f"{tenant}-{i}", f"value {marker} ".encode() * (1 + i % 40), meta=meta)
        log.submit("tenants", f"no-meta-{i}", b"GONE-MARKER in a record without meta stays")


def test_forgetting_redacts_every_segment_in_place_and_keeps_the_rest_byte_identical(tmp_path):
    log = EventLog(EventLogConfig(spool_dir=tmp_path, segment_bytes=8192)).start()  # no broker: no shipper
    _tenant_events(log, 120, t0=1000.0)
    assert wait_for(lambda: log.stats.spooled == 360)
    # the cursor halfway: redaction covers what was already sent as well as what was not
    log._shared[sh.CUR_SEG], log._shared[sh.CUR_OFF] = sorted(raw_records(tmp_path))[180]
    before = raw_records(tmp_path)
    sizes = {p.name: p.stat().st_size for p in tmp_path.glob("*.log")}
    assert len(sizes) > 3 and b"GONE-MARKER-0000" in segment_bytes(tmp_path)

    log.forget({"gone": 1000.0 + 99})  # ts 1000..1099 forgotten, 1100..1119 not
    assert {p.name: p.stat().st_size for p in tmp_path.glob("*.log")} == sizes
    after = raw_records(tmp_path)
    assert after.keys() == before.keys()  # no offset moved
    changed = {pos for pos in before if before[pos] != after[pos]}
    assert len(changed) == 100
    for pos in before:
        _, key, _, meta = _dec(before[pos])
        if pos in changed:
            assert key.startswith("gone-") and meta["ts"] <= 1099 and len(after[pos]) == len(before[pos])
            assert _dec(after[pos])[2] is None  # no content; its CRC is valid (decoded by _dec)
        else:
            assert not (key.startswith("gone-") and meta["ts"] <= 1099)
    raw = segment_bytes(tmp_path)
    for i in range(100):
        assert f"GONE-MARKER-{i:04d}".encode() not in raw  # neither in the value nor in the scan text
    assert b"GONE-MARKER-0100" in raw and b"STAYS-MARKER-0000" in raw
    keys = [k for _, k, _, _ in _all_records(tmp_path)]
    assert len(keys) == 260 and not any(k.startswith("gone-") and int(k[5:]) < 100 for k in keys)
    assert log.stats.forgotten == 100 - 60  # the ones ahead of the cursor: never sent (60 were, before)

    # after forget(): a record of the tenant up to its time is written redacted, a later one as it comes
    log.submit("completions", "gone-late", b"GONE-MARKER-LATE", meta={"tenant": "gone", "ts": 1050.0})
    log.submit("completions", "gone-new", b"GONE-MARKER-NEW", meta={"tenant": "gone", "ts": 2000.0})
    assert wait_for(lambda: log.stats.spooled == 362)
    log.close(timeout=2)
    raw = segment_bytes(tmp_path)
    assert b"GONE-MARKER-LATE" not in raw and b"GONE-MARKER-NEW" in raw
    assert log.stats.forgotten == 41
    assert fg.load(tmp_path) == (1, {"gone": 1099.0}) and fg.load_done(tmp_path) == 1

    # values only grow, the file is merged; a forget that changes nothing returns at once
    again = EventLog(EventLogConfig(spool_dir=tmp_path))
    again.forget({"gone": 5.0, "other": 7.0})
    assert fg.load(tmp_path) == (2, {"gone": 1099.0, "other": 7.0})
    t = time.monotonic()
    again.forget({"gone": 1099.0})
    assert time.monotonic() - t < 0.1 and fg.load(tmp_path)[0] == 2


def _dec(framed: bytes):
    n, crc = HEADER.unpack_from(framed)
    payload = framed[HEADER.size :]
    assert len(payload) == n and zlib.crc32(payload) == crc
    r = msgpack.unpackb(payload, raw=False)
    return r[0], r[1], r[2], r[3] if len(r) == 4 else None


def test_a_redacted_record_has_the_length_it_replaces_across_msgpack_size_seams():
    for n in [*range(11, 320), *range(65_500, 65_600), 1 << 20]:
        framed = _redacted("completions", "k" * 32, n)
        assert len(framed) == HEADER.size + n and _dec(framed)[2] is None, n


def test_a_record_torn_by_a_crash_while_it_was_redacted_is_skipped_and_the_rest_read(tmp_path):
    log = EventLog(EventLogConfig(spool_dir=tmp_path)).start()
    for i in range(10):
        log.submit("completions", f"k{i}", b"x" * 50, meta={"tenant": "t", "ts": float(i)})
    assert wait_for(lambda: log.stats.spooled == 10)
    log.close(timeout=2)
    pos = sorted(raw_records(tmp_path))[4]
    path = Spool(tmp_path).path(pos[0])
    data = bytearray(path.read_bytes())
    data[pos[1] + HEADER.size + 3] ^= 0xFF  # half overwritten: its length whole, its CRC wrong
    path.write_bytes(bytes(data))
    again = EventLog(EventLogConfig(spool_dir=tmp_path))
    assert again._head == (pos[0], len(data))  # not cut there: the records after it are kept
    assert [k for _, k, _, _ in _all_records(tmp_path)] == [f"k{i}" for i in range(10) if i != 4]


def test_the_forgotten_file_is_never_half_written(tmp_path, monkeypatch):
    from infra import files

    fg.save(tmp_path, 3, {"a": 1.0})
    real = files.os.replace

    def crash(*a):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", crash)
    log = EventLog(EventLogConfig(spool_dir=tmp_path))
    with pytest.raises(OSError):
        log.forget({"b": 2.0})
    monkeypatch.setattr(files.os, "replace", real)
    assert json.loads((tmp_path / fg.FILE).read_text()) == {"generation": 3, "tenants": {"a": 1.0}}


def test_a_redaction_torn_by_a_crash_is_finished_by_the_next_one_that_covers_it(tmp_path):
    log = EventLog(EventLogConfig(spool_dir=tmp_path)).start()
    for i in range(10):
        log.submit("completions", f"k{i}", b"x" * 80 + f"TORN-{i}-PLAINTEXT".encode(), meta={"tenant": "t", "ts": 1.0})
    assert wait_for(lambda: log.stats.spooled == 10)
    log.close(timeout=2)
    positions = sorted(raw_records(tmp_path))
    path = Spool(tmp_path).path(positions[0][0])

    def tear(pos):  # the first half of its redacted form written, the rest still the old bytes
        data = bytearray(path.read_bytes())
        n, _ = HEADER.unpack_from(data, pos[1])
        new = _redacted("completions", "k", n)
        data[pos[1] : pos[1] + len(new) // 2] = new[: len(new) // 2]
        path.write_bytes(bytes(data))

    tear(positions[3])
    tear(positions[7])
    assert b"TORN-3-PLAINTEXT" in segment_bytes(tmp_path) and b"TORN-7-PLAINTEXT" in segment_bytes(tmp_path)
    spool = Spool(tmp_path)
    head = spool.recover_head(spool.load_cursor())
    found, end, _, damaged = spool.read_at((positions[0][0], 0), head, 100)
    assert damaged == [positions[3], positions[7]] and end == head
    assert [pos for pos, _ in found] == [p for i, p in enumerate(positions) if i not in (3, 7)]
    # a forget's redaction over the range, matching none of the records: the torn ones are overwritten whole
    assert spool.redact(lambda meta: False, positions[5], start=positions[0]) == 0
    raw = segment_bytes(tmp_path)
    assert b"TORN-3-PLAINTEXT" not in raw and b"TORN-7-PLAINTEXT" in raw  # 7 lies past `upto`
    # the shipper's redaction of a batch: damaged positions it read are overwritten too
    assert spool.redact_at([positions[7]]) == 1 and b"TORN-7-PLAINTEXT" not in segment_bytes(tmp_path)
    after = raw_records(tmp_path)
    assert after.keys() == set(positions)
    for i in (3, 7):
        assert _dec(after[positions[i]])[2] is None  # a whole record now, its CRC valid, no content
    assert [k for _, k, _, _ in _all_records(tmp_path)] == [f"k{i}" for i in range(10) if i not in (3, 7)]
    assert spool.redact_at([positions[7]]) == 0  # already redacted: left as it is


def test_a_redacted_record_fits_even_the_shortest_record():
    for n in range(4, 40):
        framed = _redacted("completions", "k" * 32, n)
        assert len(framed) == HEADER.size + n and _dec(framed)[2] is None, n
