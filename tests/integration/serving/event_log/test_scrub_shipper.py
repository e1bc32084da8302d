"""Secrets and forgotten tenants through a real EventLog, its shipper process and a real Kafka broker.

Every record goes to a topic of its own test (unique names) and is a valid event, so nothing here can trip a
consumer of the shared session broker's topics.
"""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

from contracts import events as ev
from infra.procs import wait_until
from serving.event_log.pipeline import EventLog, EventLogConfig
from tests.helpers import read_topic

pytestmark = pytest.mark.timeout(300)

AWS_ID = "".join(("AKIA", "Q3EGRDFJ7XM2KZ4P"))  # a fake, in pieces (no scanner takes this file for a leak)


def completion(cid: str, tenant: str, ts: float | None = None) -> ev.CompletionEvent:
    return ev.CompletionEvent(
        completion_id=cid,
        choice_index=0,
        tenant=tenant,
        model_version=1,
        prompt_ids=np.arange(12, dtype=np.int32),
        output_ids=np.array([5, 6, 7], np.int32),
        logprobs=np.array([-0.5, -0.25, -0.1], np.float32),
        routed_experts=np.ones((14, 2, 2), np.uint8),
        sampling={"temperature": 0.0},
        finish_reason="stop",
        latency={"e2e_ms": 10.0},
        **({"ts": ts} if ts is not None else {}),
    )


def test_an_event_whose_texts_hold_a_secret_is_shipped_withheld_and_a_clean_one_unchanged(kafka_bootstrap, tmp_path):
    topic = f"test-scrub-{uuid.uuid4().hex[:8]}"
    log = EventLog(EventLogConfig(spool_dir=tmp_path / "spool", bootstrap=kafka_bootstrap, ship_interval_s=0.1))
    log.start()
    sent = {}
    try:
        cases = {
            "secret-in-prompt": [f'aws_access_key_id = "{AWS_ID}"\nclient = boto3.client("s3")\n', "", "pass"],
            "secret-in-output": [
                "def connect():\n",
                "",
                '    return psycopg.connect("postgres://app:Tr0ub4dor3x@db/app")',
            ],
            "clean": ["def add(a, b):\n", "\n", "    return a + b\n"],
            "no-scan": None,  # a tenant that denies training: nothing to scan, sent as it is
        }
        for cid, scan in cases.items():
            e = completion(cid, "tenant-a")
            sent[cid] = e.encode()
            assert log.submit(topic, cid, sent[cid], meta={"tenant": "tenant-a", "ts": e.ts, "scan": scan})
        fb = ev.FeedbackEvent(completion_id="fb-secret", choice_index=0, tenant="tenant-a", kind="comment")
        fb.text = f"it leaked my key {AWS_ID}, remove it"
        sent["fb-secret"] = fb.encode()
        log.submit(topic, "fb-secret", sent["fb-secret"], meta={"tenant": "tenant-a", "ts": fb.ts, "scan": [fb.text]})
        assert log.drain(60), log.stats
        assert log.stats.scrubbed == 3 and log.stats.produced == 5 and log.stats.unscanned == 0
        # Acknowledged: the withheld records are redacted in the spool too, not left until the segment is freed.
        raw = b"".join(p.read_bytes() for p in sorted((tmp_path / "spool").glob("*.log")))
        assert AWS_ID.encode() not in raw and b"Tr0ub4dor3x" not in raw
        assert b"return a + b" in raw  # the clean one went out whole: its record stays as it was
    finally:
        log.close(timeout=5)
    got = dict(read_topic(kafka_bootstrap, topic))
    assert got.keys() == sent.keys()
    for cid in ("secret-in-prompt", "secret-in-output"):
        e = ev.decode(got[cid])
        assert e.withheld == "secret" and e.secret_types, cid
        assert len(e.prompt_ids) == len(e.output_ids) == len(e.logprobs) == e.routed_experts.size == 0
        assert e.completion_id == cid and e.tenant == "tenant-a"  # still counted
    assert ev.decode(got["secret-in-prompt"]).secret_types == ["AWS Access Key"]
    assert "Basic Auth Credentials" in ev.decode(got["secret-in-output"]).secret_types
    f = ev.decode(got["fb-secret"])
    assert f.withheld == "secret" and f.text is None and f.kind == "comment"
    assert got["clean"] == sent["clean"] and got["no-scan"] == sent["no-scan"]  # byte for byte
    assert AWS_ID.encode() not in b"".join(got.values())


def test_a_tenant_forgotten_mid_stream_never_reaches_kafka_and_later_records_do(kafka_bootstrap, tmp_path):
    topic = f"test-forget-{uuid.uuid4().hex[:8]}"
    spool_dir = tmp_path / "spool"
    # Sends come in bursts 5 s apart: what is submitted right after one burst is still in the spool when
    # the tenant is forgotten.
    log = EventLog(EventLogConfig(spool_dir=spool_dir, bootstrap=kafka_bootstrap, ship_interval_s=5.0))
    log.start()
    keys: dict[str, tuple[str, float]] = {}  # key -> (tenant, ts)

    def submit(tenant: str, n: int, tag: str) -> None:
        for i in range(n):
            e = completion(f"{tenant}-{tag}-{i}", tenant)
            e.prompt_ids = np.frombuffer(f"{tenant.upper()}-{tag}-MARK".encode().ljust(32), np.int32)
            keys[e.completion_id] = (tenant, e.ts)
            meta = {"tenant": tenant, "ts": e.ts, "scan": [f"# {tenant.upper()}-{tag}-MARK", "", "pass"]}
            assert log.submit(topic, e.completion_id, e.encode(), meta=meta)

    try:
        submit("gone", 5, "first")
        submit("stays", 5, "first")
        assert log.drain(60) and log.stats.produced == 10  # delivered before anyone asked to forget
        submit("gone", 200, "queued")
        submit("stays", 200, "queued")
        wait_until(lambda: log.stats.spooled == 410, 10, interval=0.02, what="410 events spooled")
        stop = threading.Event()

        def traffic():  # both tenants keep coming while the forget is applied
            i = 0
            while not stop.is_set():
                submit("gone", 1, f"during{i}")
                submit("stays", 1, f"during{i}")
                i += 1
                time.sleep(0.002)

        t = threading.Thread(target=traffic)
        t.start()
        time.sleep(0.1)
        cut = time.time()
        log.forget({"gone": cut})
        produced_at_forget = log.stats.produced
        time.sleep(0.1)
        stop.set()
        t.join()
        assert produced_at_forget == 10, "a burst went out before the forget: the test's timing did not hold"
        raw = b"".join(p.read_bytes() for p in sorted(spool_dir.glob("*.log")))
        assert b"GONE-queued-MARK" not in raw  # redacted in place, value and scan text
        submit("gone", 5, "after")  # after the forget: ts > cut
        submit("stays", 5, "after")
        assert log.drain(60), log.stats
    finally:
        log.close(timeout=5)
    got = {k for k, _ in read_topic(kafka_bootstrap, topic)}
    forgotten = {k for k, (tenant, ts) in keys.items() if tenant == "gone" and ts <= cut and "first" not in k}
    expected = set(keys) - forgotten
    assert forgotten and not (got & forgotten)  # none of those reached Kafka
    assert got == expected  # every other one did: "stays", "gone" before the forget's burst and after the cut
    assert any(k.startswith("gone-after") for k in got)
    assert log.stats.forgotten == len(forgotten)
