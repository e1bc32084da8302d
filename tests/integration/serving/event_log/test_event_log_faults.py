"""The gateway's event log under faults, each real: a spool on a full filesystem (a small tmpfs, then
grown), an event larger than the broker takes, a cursor that cannot be saved, a shipper killed with
SIGKILL. Nothing accepted is lost, nothing stalls, and health says what is wrong while it is."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from infra.procs import wait_until
from serving.event_log import shipper as sh
from serving.event_log.pipeline import EventLog, EventLogConfig
from serving.event_log.spool import Spool
from tests.helpers import read_topic, small_tmpfs

pytestmark = pytest.mark.timeout(300)


def wait_for(cond, timeout=30.0) -> bool:
    """infra.procs.wait_until, as a truth value for assert."""
    try:
        wait_until(cond, timeout, interval=0.05)
    except TimeoutError:
        return False
    return True


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs: a disk that fills up (root is available here and in CI)."""
    with small_tmpfs(tmp_path / "fs", "256k") as mnt:
        yield mnt


def test_a_full_disk_holds_events_in_the_queue_until_it_has_room(small_fs):
    log = EventLog(EventLogConfig(spool_dir=small_fs / "spool", retry_backoff_s=0.1)).start()
    try:
        value = os.urandom(8 << 10)
        durable = []  # the gateway answers a client only once its event is here
        accepted = sum(
            log.submit("completions", f"k{i}", value, on_durable=lambda i=i: durable.append(i)) for i in range(64)
        )  # 512 KiB > 256 KiB
        assert accepted == 64
        assert wait_for(lambda: log.health()["writer"] == "failing")
        assert "No space left" in log.health()["writer_error"] and not log.health()["ok"]
        assert log.stats.spooled < accepted and log.stats.write_failures >= 1
        assert len(durable) == log.stats.spooled < accepted  # none reported durable that is not on disk
        subprocess.run(["mount", "-o", "remount,size=16m", str(small_fs)], check=True)  # room again
        assert wait_for(lambda: log.stats.spooled == accepted)
        assert sorted(durable) == list(range(64))
        health = log.health()
        assert health.pop("durability")["mode"] == "window"  # the default: synced within the window
        assert health == {
            "writer": "ok",
            "writer_error": None,
            "shipper": "off",
            "shipper_restarts": 0,
            "ok": True,
        }
    finally:
        log.close(timeout=5)
    spool = Spool(small_fs / "spool")
    cursor = spool.load_cursor()
    head = spool.recover_head(cursor)
    records, _, _ = spool.read(cursor, head, 1000)
    assert [k for _, k, _, _ in records] == [f"k{i}" for i in range(64)]  # every one, once, in order


def test_an_oversize_event_is_dead_lettered_and_the_stream_goes_on(kafka_bootstrap, tmp_path):
    from contracts import events as ev
    from infra.kafka_admin import ensure_topics

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

    stubs = [
        json.loads(v)
        for k, v in read_topic(kafka_bootstrap, ev.TOPIC_DEADLETTER, {"big"})
        if json.loads(v)["topic"] == topic
    ]
    assert len(stubs) == 1 and stubs[0]["bytes"] == len(big)
    with open(stubs[0]["file"], "rb") as f:
        assert f.read() == big  # kept whole


def test_a_cursor_that_cannot_be_saved_and_a_killed_shipper_stop_nothing(kafka_bootstrap, tmp_path):
    topic = f"test-eventlog-{uuid.uuid4().hex[:8]}"
    spool_dir = tmp_path / "spool"
    log = EventLog(
        EventLogConfig(
            spool_dir=spool_dir,
            bootstrap=kafka_bootstrap,
            ship_interval_s=0.1,
            segment_bytes=4096,
            cursor_save_interval_s=0.1,
        )
    )
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


def test_a_gateway_killed_mid_traffic_loses_no_event_it_answered_for(replica, test_model, tmp_path):
    """kill -9 of the gateway under streaming, plain and feedback traffic: every completion and feedback a
    client got an answer for is in the spool the next gateway ships from (answers wait for the fsync)."""
    import json
    import signal
    import threading
    import urllib.request

    import openai

    from contracts import events as ev
    from serving import gateway_process

    gw = gateway_process.start([replica.url], test_model, tmp_path / "gw", keys={"alice": "key-a"})
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="key-a", max_retries=0, timeout=30)
    answered, judged, stop, kill_now = set(), set(), threading.Event(), threading.Event()

    def traffic(stream: bool):
        while not stop.is_set():
            try:
                if stream:
                    chunks = list(client.completions.create(model="m", prompt="def f(x):\n", max_tokens=4, stream=True))
                    cid = chunks[0].id  # whole: the stream reached [DONE]
                else:
                    cid = client.completions.create(model="m", prompt="def f(x):\n", max_tokens=4).id
                answered.add(cid)
                req = urllib.request.Request(
                    f"{gw.url}/v1/feedback",
                    headers={"Authorization": "Bearer key-a"},
                    data=json.dumps({"completion_id": cid, "kind": "accept"}).encode(),
                )
                with urllib.request.urlopen(req, timeout=30):
                    judged.add(cid)
                if kill_now.is_set() and not stop.is_set():  # the instant after an answer: the worst moment
                    stop.set()
                    os.killpg(gw.pid, signal.SIGKILL)
            except Exception:  # noqa: BLE001 - requests cut by the kill are expected to fail
                pass

    threads = [threading.Thread(target=traffic, args=(s,)) for s in (False, True, False)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: len(judged) >= 20, 120)
        kill_now.set()
        assert wait_for(stop.is_set, 60)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        gw.stop()
    spool = Spool(tmp_path / "gw" / "spool")
    cursor = spool.load_cursor()
    head = spool.recover_head(cursor)
    found: dict[str, set] = {ev.TOPIC_COMPLETIONS: set(), ev.TOPIC_FEEDBACK: set()}
    while True:
        records, cursor, _ = spool.read(cursor, head, 1000)
        if not records:
            break
        for topic, key, _, _ in records:
            found[topic].add(key)
    assert answered and answered <= found[ev.TOPIC_COMPLETIONS], sorted(answered - found[ev.TOPIC_COMPLETIONS])
    assert judged <= found[ev.TOPIC_FEEDBACK], sorted(judged - found[ev.TOPIC_FEEDBACK])
