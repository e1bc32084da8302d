"""The gateway's event log under faults, each real: a spool on a full filesystem (a small tmpfs, then
grown), an event larger than the broker takes, a cursor that cannot be saved, a shipper killed with
SIGKILL. Nothing accepted is lost, nothing stalls, and health says what is wrong while it is."""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from flywheel.procs import wait_until
from serving import event_shipper as sh
from serving.event_log import EventLog, EventLogConfig
from serving.event_spool import Spool

pytestmark = pytest.mark.timeout(300)


def wait_for(cond, timeout=30.0) -> bool:
    """flywheel.procs.wait_until, as a truth value for assert."""
    try:
        wait_until(cond, timeout, interval=0.05)
    except TimeoutError:
        return False
    return True


def read_topic(bootstrap: str, topic: str, keys: set[str], timeout_ms: int = 5000) -> list[tuple[str, bytes]]:
    from kafka import KafkaConsumer

    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
                      consumer_timeout_ms=timeout_ms, group_id=None)
    try:
        return [(r.key.decode(), r.value) for r in c if r.key and r.key.decode() in keys]
    finally:
        c.close()


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs: a disk that fills up (root is available here and in CI)."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_holds_events_in_the_queue_until_it_has_room(small_fs):
    log = EventLog(EventLogConfig(spool_dir=small_fs / "spool", retry_backoff_s=0.1)).start()
    try:
        value = os.urandom(8 << 10)
        accepted = sum(log.submit("completions", f"k{i}", value) for i in range(64))  # 512 KiB > 256 KiB
        assert accepted == 64
        assert wait_for(lambda: log.health()["writer"] == "failing")
        assert "No space left" in log.health()["writer_error"] and not log.health()["ok"]
        assert log.stats.spooled < accepted and log.stats.write_failures >= 1
        subprocess.run(["mount", "-o", "remount,size=16m", str(small_fs)], check=True)  # room again
        assert wait_for(lambda: log.stats.spooled == accepted)
        assert log.health() == {"writer": "ok", "writer_error": None, "shipper": "off", "shipper_restarts": 0,
                                "ok": True}
    finally:
        log.close(timeout=5)
    spool = Spool(small_fs / "spool")
    cursor = spool.load_cursor()
    head = spool.recover_head(cursor)
    records, _, _ = spool.read(cursor, head, 1000)
    assert [k for _, k, _ in records] == [f"k{i}" for i in range(64)]  # every one, once, in order


def test_an_oversize_event_is_dead_lettered_and_the_stream_goes_on(kafka_bootstrap, tmp_path):
    from flywheel import events as ev
    from flywheel.kafka_broker import ensure_topics

    ensure_topics(kafka_bootstrap)
    topic = f"test-eventlog-{uuid.uuid4().hex[:8]}"
    log = EventLog(EventLogConfig(spool_dir=tmp_path / "spool", bootstrap=kafka_bootstrap, ship_interval_s=0.1))
    log.start()
    try:
        big = os.urandom(3 << 20)  # routed experts of a long context at a real model size
        keys = [f"small-{i}" for i in range(5)]
        log.submit(topic, keys[0], b"before")
        log.submit(topic, "big", big)
        for k in keys[1:]:
            log.submit(topic, k, b"after")
        assert log.drain(60), log.stats
        assert log.stats.deadlettered == 1
    finally:
        log.close(timeout=5)
    got = read_topic(kafka_bootstrap, topic, set(keys) | {"big"})
    assert sorted(k for k, _ in got) == sorted(keys)  # the small ones all arrived, none stuck behind it
    import json

    stubs = [json.loads(v) for k, v in read_topic(kafka_bootstrap, ev.TOPIC_DEADLETTER, {"big"})
             if json.loads(v)["topic"] == topic]
    assert len(stubs) == 1 and stubs[0]["bytes"] == len(big)
    with open(stubs[0]["file"], "rb") as f:
        assert f.read() == big  # kept whole


def test_a_cursor_that_cannot_be_saved_and_a_killed_shipper_stop_nothing(kafka_bootstrap, tmp_path):
    topic = f"test-eventlog-{uuid.uuid4().hex[:8]}"
    spool_dir = tmp_path / "spool"
    log = EventLog(EventLogConfig(spool_dir=spool_dir, bootstrap=kafka_bootstrap, ship_interval_s=0.1,
                                  segment_bytes=4096, cursor_save_interval_s=0.1))
    (spool_dir / "cursor.json.tmp").mkdir()  # where the cursor is written first: every save fails
    log.start()
    sent = []
    try:
        for i in range(200):
            sent.append(f"a{i}")
            log.submit(topic, sent[-1], os.urandom(100))
        assert log.drain(60)
        assert log.health()["shipper"] == "ok"
        assert len(Spool(spool_dir).segments()) > 1  # nothing freed behind an unsaved cursor
        shutil.rmtree(spool_dir / "cursor.json.tmp")
        cursor = (log._shared[sh.CUR_SEG], log._shared[sh.CUR_OFF])
        assert wait_for(lambda: Spool(spool_dir).load_cursor() == cursor, 10)
        assert wait_for(lambda: Spool(spool_dir).segments() == [cursor[0]], 10)  # and the segments behind it go

        os.kill(log._shipper.pid, 9)
        assert wait_for(lambda: log.stats.shipper_restarts == 1, 10)
        for i in range(50):
            sent.append(f"b{i}")
            log.submit(topic, sent[-1], os.urandom(100))
        assert log.drain(60)
        assert log.health()["ok"]
    finally:
        log.close(timeout=5)
    got = {k for k, _ in read_topic(kafka_bootstrap, topic, set(sent))}
    assert got == set(sent)  # delivered (a killed shipper may send a batch twice; consumers dedupe)
