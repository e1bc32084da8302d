"""Kafka stopped mid-traffic and restarted: no request fails and every event arrives afterwards, in the
order the gateway logged it (DESIGN: the spool is replayed in order)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid

import openai
import pytest
from kafka import KafkaConsumer

from contracts import events as ev
from flywheel.kafka import broker as kafka_broker
from infra import kafka_auth
from serving import gateway_process

pytestmark = pytest.mark.timeout(600)

PROMPT = 'def times_two(n):\n    """Return n multiplied by 2."""\n'


def _health(url):
    with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
        return json.loads(r.read())


def test_broker_outage_loses_nothing(replica, test_model, tmp_path):
    broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path / "kafka"))
    gw = gateway_process.start(
        [replica.url], test_model, tmp_path / "gw", kafka=broker.bootstrap, keys={"alice": "key-a"}
    )
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="key-a", max_retries=0)
    issued, errors, feedback = [], [], []
    phase = {"name": "before"}
    stop = threading.Event()

    def traffic():
        i = 0
        while not stop.is_set():
            try:
                r = client.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=1.0)
                issued.append((phase["name"], r.id))
                if i % 2 == 0:
                    req = urllib.request.Request(
                        f"{gw.url}/v1/feedback",
                        headers={"Authorization": "Bearer key-a"},
                        data=json.dumps({"completion_id": r.id, "kind": "accept"}).encode(),
                    )
                    with urllib.request.urlopen(req, timeout=30):
                        feedback.append(r.id)
            except Exception as e:  # any failure is a test failure, reported below
                errors.append(repr(e))
            i += 1

    t = threading.Thread(target=traffic)
    t.start()
    try:
        time.sleep(3)
        phase["name"] = "outage"
        assert broker.stop()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _health(gw.url)["kafka_up"]:
            time.sleep(0.5)
        time.sleep(3)  # more traffic while the broker is down
        during = _health(gw.url)
        phase["name"] = "after"
        broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path / "kafka"))  # same ports
        time.sleep(3)
        stop.set()
        t.join(timeout=60)
        assert not errors, errors[:3]
        assert {p for p, _ in issued} == {"before", "outage", "after"}
        assert during["kafka_up"] is False and during["spool_pending_bytes"] > 0

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and _health(gw.url)["spool_pending_bytes"] > 0:
            time.sleep(0.5)
        assert _health(gw.url)["spool_pending_bytes"] == 0, "the spool drained after the broker came back"

        want_c = {cid for _, cid in issued}
        seen_c, seen_f, event_ids = set(), set(), []
        arrived: dict[int, list[tuple[int, str]]] = {}  # completions partition -> (offset, completion id)
        consumer = KafkaConsumer(
            ev.TOPIC_COMPLETIONS,
            ev.TOPIC_FEEDBACK,
            bootstrap_servers=broker.bootstrap,
            **kafka_auth.client_config(),
            group_id=f"t-{uuid.uuid4().hex[:6]}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (seen_c != want_c or seen_f != set(feedback)):
            for recs in consumer.poll(timeout_ms=500).values():
                for r in recs:
                    e = ev.decode(r.value)
                    event_ids.append(e.event_id)
                    if r.topic == ev.TOPIC_COMPLETIONS:
                        arrived.setdefault(r.partition, []).append((r.offset, e.completion_id))
                    (seen_c if r.topic == ev.TOPIC_COMPLETIONS else seen_f).add(e.completion_id)
        consumer.close()
        assert seen_c == want_c, f"{len(want_c - seen_c)} completion events missing"
        assert seen_f == set(feedback)
        # Re-sent batches may duplicate an event in Kafka; by event_id every event is there once.
        assert len(set(event_ids)) == len(want_c) + len(feedback)
        # One client thread: each completion was logged before the next was asked for, so in every partition
        # the completions first appear in the order they were issued (re-sent duplicates come after).
        order = {cid: i for i, (_, cid) in enumerate(issued)}
        for part, recs in arrived.items():
            firsts = list(dict.fromkeys(cid for _, cid in sorted(recs)))
            ranks = [order[c] for c in firsts]
            assert ranks == sorted(ranks), f"partition {part}: completions out of the order they were logged"
        status = gw_metrics(gw.url)
        assert status["replayed"] > 0
    finally:
        stop.set()
        t.join(timeout=60)
        gw.stop()
        broker.stop()


def gw_metrics(url) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("flywheel_events_total{"):
            state = line.split('state="')[1].split('"')[0]
            out[state] = float(line.rsplit(" ", 1)[1])
    return out
