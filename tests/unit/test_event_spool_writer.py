"""serving.event_spool_writer: batches appended through one open descriptor, durable, and a failed attempt cut
back to the head before the retry."""

import os

import pytest

from serving import event_spool_writer as sw
from serving.event_spool import Spool


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
    assert w.head == head and spool.path(1).stat().st_size > head[1]
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
