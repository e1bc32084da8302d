"""Tenants' privacy in the trainer without a broker: what the gate refuses, what a forget or a deny drops from
the Joiner and the trainer's samples, its checkpoint state, and the provenance files of published versions."""

from __future__ import annotations

import io
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from contracts import events as ev
from online_rl.config import JoinConfig
from online_rl.data import provenance
from online_rl.data.join import Joiner
from online_rl.data.provenance import COUNTS
from online_rl.data.samples import Sample
from online_rl.data.tenants import REASONS, TenantGate
from online_rl.trainer.checkpoints import Checkpoints


def completion(cid, ts, tenant="a", session="", withheld="", parent=""):
    empty = withheld != ""
    return ev.CompletionEvent(
        completion_id=cid,
        choice_index=0,
        tenant=tenant,
        model_version=1,
        prompt_ids=np.array([] if empty else [0, 5, 6], np.int32),
        output_ids=np.array([] if empty else [7, 8], np.int32),
        logprobs=np.array([] if empty else [-0.1, -0.2], np.float32),
        routed_experts=np.zeros((0,) if empty else (4, 2, 2), np.uint8),
        sampling={},
        finish_reason="stop",
        latency={},
        session_id=session,
        parent_id=parent,
        withheld=withheld,
        ts=ts,
    )


def feedback(cid, kind, ts, tenant="a", withheld="", text=None, session=""):
    return ev.FeedbackEvent(
        completion_id=cid,
        choice_index=0,
        tenant=tenant,
        kind=kind,
        ts=ts,
        withheld=withheld,
        text=text,
        session_id=session,
    )


def tenant(tid, ts=0.0, **kw):
    return ev.TenantRecord(tenant=tid, ts=ts or 1.0, **kw)


class Holder:
    """What a trainer holds of tenants' data (online_rl.data.tenants.TenantGate's holder)."""

    def __init__(self, cfg=None):
        self.gate = TenantGate(holder=self, clock=lambda: 1000.0)
        self.joiner = Joiner(cfg or JoinConfig(), refuse=self.gate.refuse)
        self.buffer: list[Sample] = []
        self.commented: list[tuple[Sample, int]] = []
        self.ledger: list[dict] = []

    def drop_samples(self, gone, reason):  # as online_rl.trainer.loop.Trainer.drop_samples
        samples = [s for s in self.buffer if gone(s)]
        self.buffer = [s for s in self.buffer if not gone(s)]
        self.ledger += [{"key": s.key, "tenant": s.tenant, "dropped": reason} for s in samples]
        contexts = [c for c in self.commented if gone(c[0])]
        self.commented = [c for c in self.commented if not gone(c[0])]
        return len(samples), len(contexts)

    def add(self, *events):
        for e in events:
            self.buffer += self.joiner.add_raw(e.encode())


def dropped(gate) -> dict:
    return {r: gate.dropped.labels(r)._value.get() for r in REASONS}


def test_what_the_gate_refuses_and_why():
    gate = TenantGate(clock=lambda: 10 * 86400.0)
    assert dropped(gate) == dict.fromkeys(REASONS, 0)  # every reason exported from the start
    assert gate.refuse(completion("c", 5.0)) is None  # a tenant without a record: the defaults (allow)
    assert gate.refuse(completion("c", 5.0, withheld="policy")) == "withheld"
    assert gate.refuse(completion("c", 5.0, withheld="secret")) == "withheld"
    assert gate.refuse(feedback("c", "comment", 5.0, withheld="secret")) == "withheld"  # its text is gone
    assert gate.refuse(feedback("c", "accept", 5.0, withheld="policy")) == "withheld"  # its tenant denies
    assert gate.refuse(feedback("c", "accept", 5.0, withheld="secret")) is None  # a judgment: no content
    gate.record(tenant("a", forgotten_before=100.0).encode())
    assert gate.refuse(completion("c", 100.0)) == "forgotten"  # at or before forgotten_before
    assert gate.refuse(feedback("c", "accept", 99.0)) == "forgotten"
    assert gate.refuse(completion("c", 100.5)) is None  # written after the forget: the tenant is still served
    gate.record(tenant("a", retention_days=2.0))  # a record without forgotten_before cannot bring events back
    assert gate.policies["a"]["forgotten_before"] == 100.0
    assert gate.refuse(completion("c", 7.9 * 86400)) == "retention"  # older than 2 days of wall time
    assert gate.refuse(completion("c", 8.1 * 86400)) is None
    gate.record(tenant("a", train="deny"))
    assert gate.refuse(completion("c", 9 * 86400)) == "deny" and gate.refuse(completion("c", 5.0, "b")) is None
    assert dropped(gate) == {"withheld": 4, "deny": 1, "forgotten": 2, "retention": 1}
    gate.record(b"garbage")
    gate.record(feedback("c", "accept", 1.0).encode())  # an event on the tenants topic
    assert gate.bad_records._value.get() == 2 and set(gate.policies) == {"a"}


def test_withheld_events_are_never_held_and_a_secret_judgment_still_joins():
    h = Holder()
    h.add(completion("w", 1.0, withheld="secret"), feedback("w", "accept", 2.0))
    assert not h.joiner.pending and not h.buffer and list(h.joiner.orphans) == ["w:0"]  # nothing to join to
    h.add(completion("ok", 3.0), feedback("ok", "accept", 4.0, withheld="secret"))
    [s] = h.buffer
    assert s.key == "ok:0" and s.tenant == "a" and s.ts == 3.0 and s.reward == 0.75
    assert dropped(h.gate)["withheld"] == 1
    # a rejected completion waits for a comment: one whose text was scrubbed is no hint, nor a signal
    h = Holder(JoinConfig(signals="text", comment_wait_s=10))
    h.add(completion("r", 5.0), feedback("r", "reject", 6.0), feedback("r", "comment", 7.0, withheld="secret"))
    assert list(h.joiner.held) == ["r:0"] and not h.buffer
    h.add(completion("later", 20.0))
    h.buffer += h.joiner.expire()
    [s] = h.buffer
    assert s.key == "r:0" and s.hint_ids is None and s.reward == -0.25
    assert dropped(h.gate)["withheld"] == 1 and h.joiner.stats.bad_records == 0
    h.add(tenant("a"))  # a tenant record on an event topic: not joined, counted as a bad record
    assert h.joiner.stats.bad_records == 1


def test_drop_tenant_takes_every_waiting_place_and_only_that_tenant():
    j = Joiner(JoinConfig(signals="persist"))
    for t in ("a", "b"):
        j.add(completion(f"{t}-pending", 10.0, t))
        j.add(completion(f"{t}-turn", 11.0, t, session=f"S{t}", parent="x:0"))
        j.add(completion(f"{t}-held", 12.0, t))
        j.add(feedback(f"{t}-held", "accept", 13.0, t))  # waits for its persisted check
        j.add(feedback(f"{t}-orphan", "accept", 14.0, t))
        j.add(feedback("", "accept", 15.0, t, session=f"closed-{t}"))
    j.add(completion("a-after", 30.0, "a"))  # written after the forget
    assert (len(j.pending), len(j.turns), len(j.held), len(j.orphans), len(j.closed)) == (3, 2, 2, 2, 2)
    assert j.drop_tenant("a", 20.0) == 5
    assert list(j.pending) == ["b-pending:0", "a-after:0"] and list(j.turns) == ["b-turn:0"]
    assert list(j.sessions) == [("b", "Sb")] and list(j.held) == ["b-held:0"]
    assert list(j.orphans) == ["b-orphan:0"] and list(j.closed) == [("b", "closed-b")]
    assert j.drop_tenant("a", math.inf) == 1 and list(j.pending) == ["b-pending:0"]
    k = Joiner()
    k.load_state(j.state())  # what is left round-trips
    assert list(k.pending) == ["b-pending:0"] and list(k.sessions) == [("b", "Sb")]


def test_a_forget_drops_what_the_trainer_holds_and_a_late_deny_the_rest():
    h = Holder(JoinConfig(signals="persist", window_s=1e6))
    h.add(completion("a1", 10.0), feedback("a1", "reject", 11.0))  # a sample (reject: no wait under persist)
    h.add(completion("a2", 12.0))  # waiting for feedback
    h.add(completion("b1", 13.0, "b"), feedback("b1", "reject", 14.0, "b"))
    h.commented = [(h.buffer[0], 1), (h.buffer[1], 1)]
    assert [s.key for s in h.buffer] == ["a1:0", "b1:0"]
    h.gate.record(tenant("a", name="acme", retention_days=30.0))  # no purge: nothing for the checkpoints to lose
    assert not h.gate.purged
    h.gate.record(tenant("a", name="acme", forgotten_before=12.0, ts=50.0).encode())
    assert h.gate.purged  # the next checkpoint stands alone (online_rl.trainer.loop.Trainer.save)
    assert [s.key for s in h.buffer] == ["b1:0"] and not h.joiner.pending.get("a2:0")
    assert [c[0].key for c in h.commented] == ["b1:0"]
    assert h.ledger == [{"key": "a1:0", "tenant": "a", "dropped": "forgotten"}]
    assert dropped(h.gate)["forgotten"] == 3  # the waiting completion, the buffered sample, the context
    h.gate.record(tenant("a", forgotten_before=12.0, ts=51.0))  # the same forget again: nothing more to drop
    assert dropped(h.gate)["forgotten"] == 3 and len(h.ledger) == 1
    # events written before the forget, read after it: refused; after it: joined
    h.add(completion("a0", 9.0), feedback("a0", "accept", 9.5), completion("a3", 60.0), feedback("a3", "reject", 61.0))
    assert [s.key for s in h.buffer] == ["b1:0", "a3:0"] and dropped(h.gate)["forgotten"] == 5
    # the tenant now denies training: what was held goes, whatever its time, and so does what comes
    h.add(completion("a4", 70.0))
    h.gate.record(tenant("a", train="deny", forgotten_before=12.0))
    assert [s.key for s in h.buffer] == ["b1:0"] and "a4:0" not in h.joiner.pending
    assert h.ledger[-1] == {"key": "a3:0", "tenant": "a", "dropped": "deny"}
    h.add(completion("a5", 80.0), feedback("a5", "accept", 81.0))
    assert [s.key for s in h.buffer] == ["b1:0"] and dropped(h.gate)["deny"] == 4
    # a sample made before a policy is checked again before the update (refuse_sample)
    late = Sample("x", np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(0), 0.0, 0, tenant="a", ts=90.0)
    assert (
        h.gate.refuse_sample(late) == "deny" and h.gate.refuse_sample(Sample(**{**vars(late), "tenant": "b"})) is None
    )


def test_state_is_plain_values_and_round_trips():
    gate = TenantGate()
    gate.record(tenant("a", name="acme", forgotten_before=5.0, retention_days=30))
    gate.record(tenant("b", train="deny"))
    gate.trained_on(SimpleNamespace(source="user", tenant="a"))
    gate.trained_on(SimpleNamespace(source="rollout", tenant="admin"))
    gate.trained_on(SimpleNamespace(source="distill", tenant="a"))
    gate.trained_on(SimpleNamespace(source="distill", tenant="a"))
    buf = io.BytesIO()
    torch.save({"privacy": gate.state()}, buf)
    buf.seek(0)
    again = TenantGate()
    again.load_state(torch.load(buf, weights_only=True)["privacy"])
    assert again.policies == gate.policies and again.trained == {"a": 1} and again.distilled == {"a": 2}
    assert again.totals() == ({"a": 1}, {"a": 2})
    assert again.refuse(completion("c", 4.0)) == "forgotten" and again.refuse(completion("c", 6.0, "b")) == "deny"
    TenantGate().load_state(None)  # a checkpoint written before tenants
    TenantGate().load_state({"policies": {}, "trained": {"a": 1}})  # one written before distilled counts


def test_samples_carry_their_tenant_through_a_checkpoint():
    s = Sample(
        "k", np.array([1, 2]), np.array([3]), np.array([-1.0], np.float32), np.zeros((2, 1, 1), np.uint8), 1.0, 0
    )
    s.tenant, s.ts = "a", 12.5
    again = Sample.from_state(s.state())
    assert (again.tenant, again.ts) == ("a", 12.5)
    old = s.state()
    del old["tenant"], old["ts"]  # a checkpoint written before tenants
    assert (Sample.from_state(old).tenant, Sample.from_state(old).ts) == ("", 0.0)


def test_provenance_counts_per_version_and_cumulative(tmp_path):
    assert provenance.read_all(tmp_path) == [] and provenance.versions_for(tmp_path, {"a"}) == []
    provenance.write(tmp_path, 0, 0, {})  # the base model
    provenance.write(tmp_path, 1, 4, {"a": 3, "b": 1}, published=100.0)
    provenance.write(tmp_path, 2, 9, {"a": 3, "b": 6})  # a was forgotten: no more of its samples
    provenance.write(tmp_path, 10, 12, {"a": 3, "b": 8, "c": 2})  # versions sort as numbers
    records = provenance.read_all(tmp_path)
    assert [r["version"] for r in records] == [0, 1, 2, 10]
    assert records[0]["tenants"] == {} and records[0]["tenants_total"] == {}
    assert records[1] == {
        "version": 1,
        "step": 4,
        "published": 100.0,
        "tenants": {"a": 3, "b": 1},
        "tenants_total": {"a": 3, "b": 1},
        "distilled": {},
        "distilled_total": {},
    }
    assert records[2]["tenants"] == {"b": 5} and records[2]["tenants_total"] == {"a": 3, "b": 6}
    assert records[3]["tenants"] == {"b": 2, "c": 2}
    found = provenance.versions_for(tmp_path, {"a"})
    assert [r["version"] for r in found if r.get("unknown")] == list(range(3, 10))  # published, no records here
    found = [r for r in found if not r.get("unknown")]
    assert set(found[0]) == {"version", "step", "published", *COUNTS}
    assert [(r["version"], r["tenants"], r["tenants_total"]) for r in found] == [
        (1, {"a": 3}, {"a": 3}),
        (2, {"a": 0}, {"a": 3}),  # weights are not un-trained: every later version saw a's samples too
        (10, {"a": 0}, {"a": 3}),
    ]
    assert [r["version"] for r in provenance.versions_for(tmp_path, {"c", "nobody"}) if "unknown" not in r] == [10]
    assert not list((tmp_path / "provenance").glob("*.tmp"))


def test_distilled_samples_are_counted_apart_and_list_a_version(tmp_path):
    provenance.write(tmp_path, 1, 2, {"a": 2}, distilled={"a": 4})
    provenance.write(tmp_path, 2, 5, {"a": 2, "b": 1}, distilled={"a": 4, "c": 3})  # c: only distilled samples
    r = provenance.read_all(tmp_path)[1]
    assert (r["tenants"], r["distilled"], r["distilled_total"]) == ({"b": 1}, {"c": 3}, {"a": 4, "c": 3})
    [v2] = provenance.versions_for(tmp_path, {"c"})
    assert (v2["version"], v2["tenants"], v2["tenants_total"], v2["distilled"], v2["distilled_total"]) == (
        2,
        {},
        {},
        {"c": 3},
        {"c": 3},
    )
    found = provenance.versions_for(tmp_path, {"a"})
    assert [(r["tenants"], r["distilled"]) for r in found] == [({"a": 2}, {"a": 4}), ({"a": 0}, {"a": 0})]


def test_damaged_or_missing_records_are_unknown_for_every_tenant(tmp_path):
    provenance.write(tmp_path, 0, 0, {})
    provenance.write(tmp_path, 1, 4, {"a": 3})
    provenance.write(tmp_path, 2, 6, {"a": 3})
    provenance.write(tmp_path, 4, 9, {"a": 3, "b": 2})  # v3: no record
    (tmp_path / "provenance" / "v2.json").write_text('{"version": 2, "tenan')  # damaged
    (tmp_path / "provenance" / "v0.json").write_text("[]")  # the base model: never listed
    records = provenance.read_all(tmp_path)
    assert [(r["version"], r.get("unknown", False)) for r in records] == [(0, True), (1, False), (2, True), (4, False)]
    assert records[2]["why"].startswith("damaged record") and records[2]["tenants_total"] == {}
    # a new record counts from the newest usable one before it
    assert provenance.write(tmp_path, 5, 10, {"a": 4, "b": 2})["tenants"] == {"a": 1}
    marker = tmp_path / "published" / "step-00000012" / "PUBLISHED"  # v6 published, its record lost
    marker.parent.mkdir(parents=True)
    marker.write_text("6")

    def shape(found):
        return [(r["version"], r["step"], r.get("unknown", False), r["tenants_total"]) for r in found]

    assert shape(provenance.versions_for(tmp_path, {"nobody"})) == [
        (2, None, True, {}),
        (3, None, True, {}),
        (6, 12, True, {}),
    ]
    found = provenance.versions_for(tmp_path, {"a"})
    assert shape(found) == [
        (1, 4, False, {"a": 3}),
        (2, None, True, {}),
        (3, None, True, {}),
        (4, 9, False, {"a": 3}),
        (5, 10, False, {"a": 4}),
        (6, 12, True, {}),
    ]
    assert all(set(COUNTS) <= set(r) and "published" in r for r in found)
    assert found[1]["why"].startswith("damaged") and found[2]["why"] == "no provenance record"
    assert found[5]["published"] == marker.stat().st_mtime and found[1]["published"] is None


def test_a_publish_not_yet_confirmed_is_listed_and_reconciled_into_its_version(tmp_path):
    assert provenance.reconcile(tmp_path, [0, 1, 2]) == []  # a new work directory: the store's are not its own
    assert not (tmp_path / "provenance").exists()
    provenance.write(tmp_path, 0, 0, {})
    provenance.write(tmp_path, 1, 4, {"a": 3})
    provenance.write_pending(tmp_path, 8, {"a": 5, "b": 1}, {"b": 2}, after=1)  # then the commit of v2: a crash
    [v2] = provenance.versions_for(tmp_path, {"b"})
    assert (v2["version"], v2["step"], v2["published"], v2["unknown"]) == (2, 8, None, True)
    assert (v2["tenants"], v2["tenants_total"], v2["distilled_total"]) == ({"b": 1}, {"b": 1}, {"b": 2})
    assert [r["tenants"] for r in provenance.versions_for(tmp_path, {"a"})] == [{"a": 3}, {"a": 2}]
    assert provenance.versions_for(tmp_path, {"nobody"}) == []
    # the next publish (or start): v2 takes the pending totals; v3, committed without any, is unknown
    assert provenance.reconcile(tmp_path, [0, 1, 2, 3], lambda v: 1000.0 + v) == [(2, 8), (3, None)]
    assert not (tmp_path / "provenance" / "pending.json").exists()
    r2, r3 = provenance.read_all(tmp_path)[2:]
    assert (r2["step"], r2["published"], r2["tenants"], r2["distilled"]) == (8, 1002.0, {"a": 2, "b": 1}, {"b": 2})
    assert r3["unknown"] and r3["published"] == 1003.0
    assert [(r["version"], r.get("unknown", False)) for r in provenance.versions_for(tmp_path, {"b"})] == [
        (2, False),
        (3, True),
    ]
    assert provenance.reconcile(tmp_path, [0, 1, 2, 3]) == []
    (tmp_path / "provenance" / "pending.json").write_text("{")  # damaged: reported, no entry
    assert provenance.read_pending(tmp_path) is None


def test_a_save_after_a_purge_leaves_no_older_checkpoint(tmp_path):
    cps = Checkpoints(tmp_path)
    first = cps.save({"step": 1}, 1, [])
    second = cps.save({"step": 2}, 2, [])
    third = cps.save({"step": 3}, 3, [])
    assert not first.exists() and cps.others(third) == [second]  # two kept
    alone = cps.save({"step": 4}, 4, [], keep=1)
    assert cps.others(alone) == [] and cps.latest() == alone and cps.load()["step"] == 4
    assert len(cps.ledger_entries()) == 0 and len(list((tmp_path / "ledger").glob("step-*.json"))) == 4


def test_a_provenance_failure_after_the_commit_never_fails_the_publish(tmp_path, monkeypatch):
    """Any error writing a version's record after the store has it is counted, and the version is returned (a
    failed publish is retried: a second version of the same weights); the next publish records it."""
    from prometheus_client import CollectorRegistry, Counter

    import weight_sync.publish as wp
    from online_rl.config import PublisherConfig
    from online_rl.trainer import publisher as pub
    from online_rl.trainer.failures import Failures
    from weight_sync.store.server import Store

    def fake_publish(checkpoint, cfg, announce_now=True, **_):
        latest = Store(cfg.store).latest()
        version = 0 if latest is None else latest + 1
        Store(cfg.store).version_dir(version).mkdir()
        return SimpleNamespace(version=version, announcement={"version": version}, kind="full", ratio=1.0)

    monkeypatch.setattr(wp, "publish", fake_publish)
    monkeypatch.setattr(wp, "announce", lambda *a, **k: None)
    monkeypatch.setattr(pub, "save_streaming", lambda model, out, dtype: out.mkdir(parents=True))
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    counter = Counter("f", "f", ["stage", "cause"], registry=CollectorRegistry())
    failures = Failures(counter)
    p = pub.Publisher(PublisherConfig(store=tmp_path / "store"), base, tmp_path / "work", failures)
    work = tmp_path / "work"
    assert p.publish(None, 3, {}, {"a": 2}) == 1
    real_write = provenance.write

    def damaged(*a, **k):
        raise json.JSONDecodeError("damaged", "{", 0)  # not an OSError

    monkeypatch.setattr(provenance, "write", damaged)
    assert p.publish(None, 7, {}, {"a": 5}, {"a": 1}) == 2
    assert failures.count("provenance") == 1 and Store(tmp_path / "store").versions() == [0, 1, 2]
    assert (work / "published" / "step-00000007" / "PUBLISHED").read_text() == "2"
    [v1, v2] = provenance.versions_for(work, {"a"})  # its totals, written before, and its marker confirm it
    assert v2["version"] == 2 and v2["step"] == 7 and "unknown" not in v2 and v2["published"] is not None
    assert (v2["tenants"], v2["tenants_total"], v2["distilled"]) == ({"a": 3}, {"a": 5}, {"a": 1})
    (work / "published" / "step-00000007" / "PUBLISHED").unlink()  # without the marker: not confirmed
    [_, v2] = provenance.versions_for(work, {"a"})
    assert v2["unknown"] and v2["published"] is None and v2["tenants"] == {"a": 3}
    monkeypatch.setattr(provenance, "write", real_write)
    # a restart: the publisher records v2 from the totals written before its commit
    again = pub.Publisher(PublisherConfig(store=tmp_path / "store"), base, work, failures)
    assert [(r["version"], r["step"], r.get("unknown", False)) for r in provenance.versions_for(work, {"a"})] == [
        (1, 3, False),
        (2, 7, False),
    ]
    assert (work / "published" / "step-00000007" / "PUBLISHED").read_text() == "2"  # resumed(): not again
    assert again.publish(None, 9, {}, {"a": 5, "b": 1}, {"a": 1}) == 3
    assert [r["version"] for r in provenance.read_all(work)] == [0, 1, 2, 3]
    assert not (work / "provenance" / "pending.json").exists()
    # no record written before the commit, no version: the publish fails and nothing is in the store
    monkeypatch.setattr(provenance, "write_pending", damaged)
    with pytest.raises(json.JSONDecodeError):
        again.publish(None, 10, {}, {"a": 5})
    assert Store(tmp_path / "store").versions() == [0, 1, 2, 3]
