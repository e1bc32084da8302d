"""The shipper in this process over a fake producer (no broker): what it withholds is redacted in the spool once
acknowledged, and past the backlog limit events go out withheld without a scan. Against a real broker:
tests/integration/serving/event_log/test_scrub_shipper.py."""

from contracts import events as ev
from serving.event_log import shipper as sh
from serving.event_log.pipeline import EventLog, EventLogConfig
from serving.event_log.spool import Spool
from tests.spool_helpers import raw_records, segment_bytes, wait_for


class _FakeFuture:
    def get(self, timeout=None):
        return None


class _FakeProducer:
    def __init__(self):
        self.sent = []

    def send(self, topic, key, value):
        self.sent.append((topic, key.decode(), value))
        return _FakeFuture()

    def flush(self, timeout=None):
        pass

    def close(self, timeout=None):
        pass


def _ship(monkeypatch, log: EventLog, **cfg) -> list[tuple[str, str, bytes]]:
    """Run the shipper (serving.event_log.shipper.run) here, over what `log` (closed: STOP set) spooled, into a fake
    producer; returns what it sent."""
    import signal

    producer = _FakeProducer()
    monkeypatch.setattr(sh, "_producer", lambda cfg: producer)
    monkeypatch.setattr(sh, "ensure_topics", lambda bootstrap: None)  # no broker to make topics on
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # run() ignores SIGTERM/SIGINT: not in pytest's process
    assert log._shared[sh.STOP] == 1
    sh.run(EventLogConfig(spool_dir=log.cfg.spool_dir, bootstrap="fake:9092", **cfg), log._shared)
    return producer.sent


def _completion(cid: str, tenant: str = "t"):
    import numpy as np

    return ev.CompletionEvent(
        completion_id=cid,
        choice_index=0,
        tenant=tenant,
        model_version=1,
        prompt_ids=np.frombuffer(f"PROMPT-IDS-OF-{cid}".encode().ljust(32), np.int32),
        output_ids=np.array([5, 6], np.int32),
        logprobs=np.array([-0.5, -0.25], np.float32),
        routed_experts=np.ones((9, 2, 2), np.uint8),
        sampling={"temperature": 0.0},
        finish_reason="stop",
        latency={},
    )


AWS_ID = "".join(("AKIA", "Q3EGRDFJ7XM2KZ4P"))  # a fake, in pieces


def test_what_the_shipper_withholds_is_redacted_in_the_spool_once_acknowledged(tmp_path, monkeypatch):

    log = EventLog(EventLogConfig(spool_dir=tmp_path)).start()  # spooling only; shipped below
    tenant_record = ev.TenantRecord("t").encode()
    old_records = b"".join(  # as the previous release wrote them: 3 elements, no meta, never scanned
        Spool.frame(*r) for r in (("completions", "old", _completion("old").encode()), ("tenants", "t", tenant_record))
    )
    log.submit(
        "completions",
        "secret",
        _completion("secret").encode(),
        meta={
            "tenant": "t",
            "ts": 1.0,
            "scan": [f'aws_access_key_id = "{AWS_ID}"\nPROMPT-TEXT-OF-secret\n', ["STOP-OF-secret"]],
        },
    )
    log.submit(
        "completions",
        "clean",
        _completion("clean").encode(),
        meta={"tenant": "t", "ts": 1.0, "scan": ["def add(a, b):\n    return a + b  # PROMPT-TEXT-OF-clean\n"]},
    )
    log.submit("completions", "deny", _completion("deny").encode(), meta={"tenant": "t", "ts": 1.0, "scan": None})
    fb = ev.FeedbackEvent(completion_id="secret", choice_index=0, tenant="t", kind="comment", text=f"FB {AWS_ID}")
    log.submit("feedback", "fb", fb.encode(), meta={"tenant": "t", "ts": 1.0, "scan": [fb.text]})
    assert wait_for(lambda: log.stats.spooled == 4)
    log.close(timeout=2)
    seg = Spool(tmp_path).path(Spool(tmp_path).segments()[0])
    seg.write_bytes(old_records + seg.read_bytes())  # the old records ahead of the new ones
    log = EventLog(EventLogConfig(spool_dir=tmp_path))  # found again, as after an upgrade
    log._shared[sh.STOP] = 1
    raw = segment_bytes(tmp_path)
    assert AWS_ID.encode() in raw and b"PROMPT-IDS-OF-secret" in raw and b"PROMPT-IDS-OF-old" in raw

    sent = dict((k, v) for _, k, v in _ship(monkeypatch, log))
    assert sent.keys() == {"old", "t", "secret", "clean", "deny", "fb"}
    assert ev.decode(sent["old"]).secret_types == ["unscanned"] and ev.decode(sent["old"]).prompt_ids.size == 0
    assert sent["t"] == tenant_record  # not an event with content: as it was
    assert ev.decode(sent["secret"]).secret_types == ["AWS Access Key"]
    assert ev.decode(sent["fb"]).withheld == "secret" and ev.decode(sent["fb"]).text is None
    assert ev.decode(sent["clean"]).prompt_ids.size == 8 and ev.decode(sent["deny"]).withheld == ""
    assert log.stats.scrubbed == 3 and log.stats.unscanned == 1
    raw = segment_bytes(tmp_path)
    for gone in (AWS_ID, "PROMPT-IDS-OF-secret", "PROMPT-TEXT-OF-secret", "STOP-OF-secret", "PROMPT-IDS-OF-old"):
        assert gone.encode() not in raw, gone  # in no segment file once the broker has them
    assert b"PROMPT-IDS-OF-clean" in raw and b"PROMPT-TEXT-OF-clean" in raw  # what went out whole stays (till freed)
    spool = Spool(tmp_path)
    records, _, _ = spool.read((spool.segments()[0], 0), spool.recover_head((0, 0)), 100)
    assert [k for _, k, _, _ in records] == ["t", "clean", "deny"]  # the withheld ones redacted: read no more


def test_over_the_backlog_limit_events_are_withheld_without_a_scan(tmp_path, monkeypatch):
    from serving.event_log import secret_scrub

    def one(tmp, scan_backlog_bytes, **cfg):
        log = EventLog(EventLogConfig(spool_dir=tmp)).start()
        for i in range(20):
            text = f"def f{i}():\n    return {i}\n"
            log.submit(
                "completions", f"c{i}", _completion(f"c{i}").encode(), meta={"tenant": "t", "ts": 1.0, "scan": [text]}
            )
        assert wait_for(lambda: log.stats.spooled == 20)
        log.close(timeout=2)
        calls = []
        real = secret_scrub.Scrubber.find
        monkeypatch.setattr(secret_scrub.Scrubber, "find", lambda self, texts: calls.append(1) or real(self, texts))
        sent = [ev.decode(v) for _, _, v in _ship(monkeypatch, log, scan_backlog_bytes=scan_backlog_bytes, **cfg)]
        return log, sent, calls

    log, sent, calls = one(tmp_path / "a", 1 << 30)
    assert len(calls) == 20 and all(e.withheld == "" for e in sent) and log.stats.unscanned == 0
    total = sum(p.stat().st_size for p in (tmp_path / "a").glob("*.log"))
    tenth = sorted(raw_records(tmp_path / "a"))[10][1]  # one segment: the offset of the 11th record
    # The limit what the 11th record and those after it take: the first 10 (more than it from them to the head)
    # go out unscanned, the rest scanned.
    log, sent, calls = one(tmp_path / "b", total - tenth)
    assert [e.secret_types for e in sent] == [["unscanned_backlog"]] * 10 + [[]] * 10 and len(calls) == 10
    assert log.stats.unscanned == log.stats.scrubbed == 10
    raw = segment_bytes(tmp_path / "b")
    assert [f"PROMPT-IDS-OF-c{i} ".encode() in raw for i in range(20)] == [False] * 10 + [True] * 10
    # capped at 3/4 of max_spool_bytes
    log, sent, calls = one(tmp_path / "c", 1 << 30, max_spool_bytes=(total - tenth) * 4 // 3 + 1)
    assert [e.withheld for e in sent].count("secret") == 10
