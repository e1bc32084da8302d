"""serving.event_log.spool_writer: batches appended through one open descriptor, durable, and a failed attempt cut
back to the head before the retry; segments allocated ahead and cut back to the head when closed or recovered."""

import errno
import logging
import os

import pytest

from serving.event_log import spool_writer as sw
from serving.event_log.spool import Spool


def _frames(*values):
    return [Spool.frame("completions", f"k{v}", f"v{v}".encode()) for v in values]


def _values(spool, head):
    records, _, _ = spool.read((1, 0), head, 1000)
    return [v.decode() for _, _, v, _ in records]


def test_batches_share_one_descriptor_and_each_is_one_write_and_one_fdatasync(tmp_path, monkeypatch):
    calls = {"open": 0, "pwrite": 0, "fdatasync": 0}
    for name in calls:
        real = getattr(os, name)
        monkeypatch.setattr(
            sw.os, name, lambda *a, _real=real, _name=name: calls.__setitem__(_name, calls[_name] + 1) or _real(*a)
        )
    spool = Spool(tmp_path)
    w = sw.SegmentWriter(spool, (1, 0), segment_bytes=1 << 20)
    for i in range(10):
        head = w.write(_frames(2 * i, 2 * i + 1))
    w.close()
    assert calls == {"open": 2, "pwrite": 10, "fdatasync": 10}  # the segment, and once its directory (created)
    assert head == (1, spool.path(1).stat().st_size)
    assert _values(spool, head) == [f"v{i}" for i in range(20)]


def test_a_failed_sync_keeps_the_head_and_the_retry_cuts_what_it_left(tmp_path, monkeypatch):
    spool = Spool(tmp_path)
    w = sw.SegmentWriter(spool, (1, 0), segment_bytes=1 << 20)
    head = w.write(_frames(0))
    real = os.fdatasync

    def failing(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sw.os, "fdatasync", failing)
    with pytest.raises(OSError):
        w.write(_frames(*range(1, 50)))  # written, never made durable
    assert w.head == head and spool.path(1).stat().st_size == head[1]  # what it wrote is cut back at once
    monkeypatch.setattr(sw.os, "fdatasync", real)
    head = w.write(_frames(1))  # shorter than what the failed attempt left
    w.close()
    assert spool.path(1).stat().st_size == head[1]
    assert _values(spool, (1, spool.path(1).stat().st_size)) == ["v0", "v1"]


def test_segments_are_sealed_at_their_size_and_a_batch_goes_on_in_the_next(tmp_path):
    spool = Spool(tmp_path)
    w = sw.SegmentWriter(spool, (1, 0), segment_bytes=200)
    head = (1, 0)
    for i in range(0, 30, 3):
        head = w.write(_frames(i, i + 1, i + 2))
    w.close()
    sizes = [spool.path(s).stat().st_size for s in spool.segments()]
    assert len(sizes) > 3 and all(size >= 200 for size in sizes[:-1]) and head == (spool.segments()[-1], sizes[-1])
    assert _values(spool, head) == [f"v{i}" for i in range(30)]


def test_a_segment_is_allocated_ahead_and_cut_back_to_the_head_when_closed(tmp_path):
    spool = Spool(tmp_path)
    w = sw.SegmentWriter(spool, (1, 0), segment_bytes=1 << 16)
    head = w.write(_frames(0, 1))
    assert spool.path(1).stat().st_size == 1 << 16  # appends change neither its size nor its block map
    assert spool.path(1).read_bytes()[head[1] :] == bytes((1 << 16) - head[1])
    head = w.write(_frames(2))
    assert _values(spool, head) == ["v0", "v1", "v2"]
    w.close()
    assert spool.path(1).stat().st_size == head[1]


def test_a_crash_with_the_segment_allocated_ahead_recovers_the_exact_head_quietly(tmp_path, caplog):
    spool = Spool(tmp_path)
    w = sw.SegmentWriter(spool, (1, 0), segment_bytes=1 << 16)
    head = w.write(_frames(0, 1, 2))
    os.close(w._fd)  # a crash: never closed, the zeros allocated ahead still on disk
    with caplog.at_level(logging.WARNING):
        assert Spool(tmp_path).recover_head((1, 0)) == head
    assert not [r for r in caplog.records if "torn tail" in r.getMessage()]  # zeros are not a torn record
    assert spool.path(1).stat().st_size == head[1]
    w2 = sw.SegmentWriter(spool, head, segment_bytes=1 << 16)
    head = w2.write(_frames(3))
    w2.close()
    assert _values(spool, head) == ["v0", "v1", "v2", "v3"]


def test_a_torn_record_before_the_allocated_zeros_is_still_cut_with_a_warning(tmp_path, caplog):
    spool = Spool(tmp_path)
    w = sw.SegmentWriter(spool, (1, 0), segment_bytes=1 << 16)
    head = w.write(_frames(0, 1))
    os.pwrite(w._fd, _frames(2)[0][:-3], head[1])  # a crash in the middle of the next record
    os.close(w._fd)
    with caplog.at_level(logging.WARNING):
        assert Spool(tmp_path).recover_head((1, 0)) == head
    assert [r for r in caplog.records if "torn tail" in r.getMessage()]
    assert spool.path(1).stat().st_size == head[1]


def test_a_disk_too_full_to_allocate_ahead_still_takes_the_writes(tmp_path, monkeypatch):
    def full(fd, offset, length):
        os.ftruncate(fd, length // 2)  # part of it allocated before it failed
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sw.os, "posix_fallocate", full)
    spool = Spool(tmp_path)
    w = sw.SegmentWriter(spool, (1, 0), segment_bytes=1 << 16)
    head = w.write(_frames(0, 1))
    assert spool.path(1).stat().st_size == head[1]  # appended as before the allocation
    w.close()
    assert _values(spool, head) == ["v0", "v1"]


def test_a_write_that_fails_after_beginning_the_next_segment_removes_it_and_a_crash_then_reads_clean(
    tmp_path, monkeypatch
):
    spool = Spool(tmp_path)
    w = sw.SegmentWriter(spool, (1, 0), segment_bytes=200)
    head = w.write(_frames(*range(12)))  # past 200 bytes: segment 2 begun and allocated
    assert spool.segments() == [1, 2] and head[0] == 2
    real = os.fdatasync
    monkeypatch.setattr(sw.os, "fdatasync", lambda fd: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    with pytest.raises(OSError):
        w.write(_frames(*range(12, 40)))  # seals 2, fills 3 and 4, begins 5, fails
    assert w.head == head and spool.segments() == [1, 2]  # the head's segment is the last again
    monkeypatch.setattr(sw.os, "fdatasync", real)
    w._open(*head)  # the retry opens the head's segment (allocated ahead again) ...
    os.close(w._fd)  # ... and the process dies before writing
    assert Spool(tmp_path).recover_head((1, 0)) == head
    found, end, _, damaged = Spool(tmp_path).read_at((1, 0), head, 1000)
    assert [r[2].decode() for _, r in found] == [f"v{i}" for i in range(12)] and damaged == [] and end == head


def test_zeros_after_a_sealed_segment_end_it_for_every_reader(tmp_path, caplog):
    spool = Spool(tmp_path)
    w = sw.SegmentWriter(spool, (1, 0), segment_bytes=200)
    head = w.write(_frames(*range(12)))
    w.close()
    with open(spool.path(1), "ab") as f:  # as a segment left allocated ahead would read
        f.write(bytes(4096))
    with caplog.at_level(logging.WARNING):
        found, end, _, damaged = spool.read_at((1, 0), head, 1000)
        assert spool.redact(lambda meta: True, head) == 0
    assert [r[2].decode() for _, r in found] == [f"v{i}" for i in range(12)] and damaged == [] and end == head
    # The spool's own warnings (a Kafka client another test left retrying may log beside it meanwhile)
    assert not [r for r in caplog.records if r.name.startswith("serving.")], caplog.records
