"""Tenants' privacy in the trainer without a broker: what the gate refuses, what a forget or a deny drops from
the Joiner and the trainer's samples, its checkpoint state, and a save after a purge. (The provenance files of
published versions: tests/unit/online_rl/data/test_provenance.py.)"""

from __future__ import annotations

import io
import math
from types import SimpleNamespace

import numpy as np
import torch

from contracts import events as ev
from online_rl.config import JoinConfig
from online_rl.data.join import Joiner
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


def test_a_save_after_a_purge_leaves_no_older_checkpoint(tmp_path):
    cps = Checkpoints(tmp_path)
    first = cps.save({"step": 1}, 1, [])
    second = cps.save({"step": 2}, 2, [])
    third = cps.save({"step": 3}, 3, [])
    assert not first.exists() and cps.others(third) == [second]  # two kept
    alone = cps.save({"step": 4}, 4, [], keep=1)
    assert cps.others(alone) == [] and cps.latest() == alone and cps.load()["step"] == 4
    assert len(cps.ledger_entries()) == 0 and len(list((tmp_path / "ledger").glob("step-*.json"))) == 4
