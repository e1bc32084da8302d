"""Kafka as a 3-node KRaft cluster on three test hosts (flywheel.kafka.cluster): topics replicated three
ways with min.insync.replicas=2. A broker killed -9 while the gateway's event log ships and the trainer's
stream reader reads: no event lost, none left duplicated after dedupe by event_id, no submit blocked, and
the cluster heals when the broker returns."""

from __future__ import annotations

import threading
import time

import pytest

from contracts import events as ev
from flywheel.kafka import cluster as kafka_cluster
from infra.kafka_admin import ensure_topics
from infra.procs import wait_until
from online_rl.data.reader import StreamReader
from serving.event_log.pipeline import EventLog, EventLogConfig

pytestmark = pytest.mark.timeout(600)


def test_a_broker_killed_under_load_loses_nothing(tmp_path, make_hosts):
    hosts = make_hosts(3)
    cluster = kafka_cluster.start(hosts.hosts, kafka_cluster.ClusterConfig(data_root=tmp_path / "kafka"))
    log = None
    try:
        assert cluster.broker_ids() == [1, 2, 3]
        ensure_topics(cluster.bootstrap)
        assert all(isr == [1, 2, 3] for isr in cluster.in_sync(ev.TOPIC_FEEDBACK).values())

        log = EventLog(EventLogConfig(spool_dir=tmp_path / "spool", bootstrap=cluster.bootstrap)).start()
        reader = StreamReader(cluster.bootstrap, "cluster-test", poll_ms=200)
        seen: list[str] = []
        broken: list[BaseException] = []
        stop = threading.Event()

        def read():  # the trainer's reader, through the leader change
            while not stop.is_set():
                try:
                    batch = reader.fetch()
                except Exception:  # a broker away: the trainer backs off the same way
                    time.sleep(0.5)
                    continue
                try:
                    seen.extend(ev.decode(v).event_id for t, v in reader.read(batch) if t == ev.TOPIC_FEEDBACK)
                except BaseException as e:  # anything else is a failure of the test, at once
                    broken.append(e)
                    return

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        led = [p for p, leader in cluster.leaders(ev.TOPIC_FEEDBACK).items() if leader == 1]
        assert led, "node 1 leads no partition: its death would change no leader"
        sent, slowest = [], 0.0
        for i in range(600):
            fb = ev.FeedbackEvent(completion_id=f"cl-{i}", choice_index=0, tenant="t", kind="accept")
            t0 = time.monotonic()
            assert log.submit(ev.TOPIC_FEEDBACK, fb.completion_id, fb.encode())
            slowest = max(slowest, time.monotonic() - t0)
            sent.append(fb.event_id)
            if i == 200:
                cluster.kill(0)  # node 1, a voter and a leader of some partitions
            if i == 400:
                cluster.restart(0)
            time.sleep(0.01)
        assert log.drain(120), log.stats
        wait_until(lambda: broken or set(sent) <= set(seen), 120, what="every event read back")
        assert not broken, broken
        stop.set()
        thread.join(10)
        reader.close()
        dupes = len(seen) - len(set(seen))
        print(f"cluster: {len(sent)} sent, {len(seen)} read, {dupes} dupes, slowest submit {slowest * 1e3:.0f} ms")
        assert slowest < 0.5  # the request path never waits on Kafka: the spool takes the event
        assert set(seen) == set(sent)  # none lost, nothing else: re-sent copies collapse by event_id
        topics = (ev.TOPIC_FEEDBACK, ev.TOPIC_COMPLETIONS, ev.TOPIC_WEIGHTS)
        wait_until(
            lambda: all(isr == [1, 2, 3] for t in topics for isr in cluster.in_sync(t).values()),
            120,
            what="node 1 back in every in-sync set",
        )
    finally:
        if log is not None:
            log.close(5)
        stopped = cluster.stop()
    assert stopped
