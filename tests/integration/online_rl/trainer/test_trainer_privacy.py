"""Tenants' privacy in the trainer against a real broker and the test model: `flywheel tenants forget` mid-run
(what the trainer held of the tenant is dropped, before and after a restart, and never trained on again;
the provenance of published versions says which saw the tenant), a `train: deny` policy that comes after the
tenant's events, and withheld events that never become samples.

Why one file: the tests share one broker of the module's own (its trainers read every topic from the beginning)
and the test model's sampled completions, and each follows one tenant through the same trainer's ingest, save and
publish."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from contracts import events as ev
from flywheel.kafka import broker as kafka_broker
from online_rl.config import LossConfig, PublisherConfig, TrainerConfig
from online_rl.data import provenance
from online_rl.data.simulate import heldout_split, produce, sample_completions
from online_rl.trainer.loop import Trainer

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory):
    """A broker of this module's own: its trainers read every topic from the beginning, tenant records too."""
    b = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path_factory.mktemp("kafka")))
    try:
        yield b.bootstrap
    finally:
        assert b.stop()


@pytest.fixture(scope="module")
def served(test_model):
    """(prompt ids, output ids, behaviour logprobs, routed experts) of the test model's own completions."""
    from tokenizers import Tokenizer

    from online_rl.model.transformer import load_pretrained

    tok = Tokenizer.from_file(str(test_model / "tokenizer.json"))
    return sample_completions(
        load_pretrained(test_model), tok, heldout_split()[0][:12], 2, torch.Generator().manual_seed(3), max_tokens=12
    )


class Events:
    """Completion and feedback events of one tenant, as the gateway logs them, with the times they were written."""

    def __init__(self, served):
        self.served, self.next = served, 0

    def make(self, tenant, prefix, n, ts, judged=True, withheld=""):
        """(records, completion keys, event ids); judged=False: completions that wait for their feedback."""
        records, keys, ids = [], [], []
        for i in range(n):
            p, o, lp, ex = self.served[self.next % len(self.served)]
            self.next += 1
            cid = f"{prefix}-{i}"
            c = ev.CompletionEvent(
                completion_id=cid,
                choice_index=0,
                tenant=tenant,
                model_version=0,
                prompt_ids=np.asarray(p, np.int32),
                output_ids=np.asarray(o, np.int32),
                logprobs=lp,
                routed_experts=ex,
                sampling={"temperature": 1.0},
                finish_reason="stop",
                latency={},
                ts=ts,
            )
            raw = ev.withhold(c.encode(), withheld) if withheld else c.encode()
            records.append((ev.TOPIC_COMPLETIONS, cid, raw))
            keys.append(f"{cid}:0")
            ids.append(c.event_id)
            if judged:
                f = ev.FeedbackEvent(completion_id=cid, choice_index=0, tenant=tenant, kind=("accept", "reject")[i % 2])
                f.ts = ts + 1
                records.append((ev.TOPIC_FEEDBACK, cid, f.encode()))
                ids.append(f.event_id)
        return records, keys, ids


def _policy(bootstrap, record: ev.TenantRecord) -> None:
    produce(bootstrap, [(ev.TOPIC_TENANTS, record.key, record.encode())])


def _ingest_until(trainer: Trainer, event_ids, timeout=90.0) -> None:
    """Read the stream until the trainer has consumed every one of these events (joined, held or refused)."""
    deadline = time.monotonic() + timeout
    while not set(event_ids) <= trainer.joiner._seen:
        assert time.monotonic() < deadline, f"{len(set(event_ids) - trainer.joiner._seen)} events never came"
        trainer.ingest()


def _train_all(trainer: Trainer) -> None:
    while trainer.buffer:
        trainer.train_step(force=True)


def _held(trainer: Trainer) -> list:
    """Every event the Joiner holds (waiting, held, orphaned, closed)."""
    j = trainer.joiner
    out = [*j.pending.values(), *j.turns.values(), *(f for fs in j.orphans.values() for f in fs)]
    out += [x for c, signals, _ in j.held.values() for x in (c, *signals.values())]
    return out + [f for f, _ in j.closed.values()]


def _checkpoint_holds(trainer: Trainer, checkpoint: Path | None = None) -> tuple[list, list]:
    """(tenant, ts) of the samples and of the Joiner's events in a checkpoint (the newest), as written on disk."""
    state = torch.load((checkpoint or trainer._latest()) / "trainer.pt", weights_only=True)
    samples = [(d["tenant"], d["ts"]) for d in state["buffer"]] + [
        (d["sample"]["tenant"], d["sample"]["ts"]) for d in state["commented"]
    ]
    j = state["joiner"]
    raws = [*j["pending"], *j["orphans"], *j["turns"], *(f for f, _ in j["closed"])]
    raws += [r for c, signals, _ in j["held"] for r in (c, *signals)]
    events = [(e.tenant, e.ts) for e in map(ev.decode, raws)]
    return samples, events


def _ledger_after(work: Path, name: str) -> list[dict]:
    """Ledger entries of the checkpoints committed after the one named `name`."""
    files = sorted(f for f in (work / "ledger").glob("step-*.json") if f.stem > name)
    return [e for f in files for e in json.loads(f.read_text())]


def _dropped(trainer: Trainer, reason: str) -> float:
    return trainer.metrics.registry.get_sample_value("flywheel_trainer_privacy_dropped_total", {"reason": reason})


def test_a_forgotten_tenant_is_dropped_mid_run_and_stays_forgotten_after_a_restart(
    own_broker, served, test_model, tmp_path
):
    from weight_sync.manifest import generate_key

    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    work = tmp_path / "trainer"
    cfg = TrainerConfig(
        model_dir=test_model,
        work_dir=work,
        kafka_bootstrap=own_broker,
        group_id="forget",
        min_batch=1,
        batch_size=8,
        loss=LossConfig(kl_coef=0.0),
        publish=PublisherConfig(store=tmp_path / "store", key=tmp_path / "k.pem"),
    )
    A, B = "tenant-a-forget", "tenant-b-forget"
    mk = Events(served)
    trainer = Trainer(cfg)
    assert all(_dropped(trainer, r) == 0 for r in ("withheld", "deny", "forgotten", "retention"))

    # 1. both tenants' samples are trained and published as v1
    t0 = time.time() - 100  # written before the forget below
    a1, a1_keys, a1_ids = mk.make(A, "a1", 6, t0)
    b1, _, b1_ids = mk.make(B, "b1", 6, t0)
    produce(own_broker, a1 + b1)
    _ingest_until(trainer, a1_ids + b1_ids)
    _train_all(trainer)
    trainer.checkpoint()
    assert trainer.publish() == 1
    v1 = json.loads((work / "provenance" / "v1.json").read_text())
    assert v1["tenants"] == v1["tenants_total"] == {A: 6, B: 6} and v1["step"] == trainer.step
    assert json.loads((work / "provenance" / "v0.json").read_text())["tenants_total"] == {}  # the base model

    # 2. more of A's samples are buffered (and completions wait for feedback) in a checkpoint, untrained
    a2, a2_keys, a2_ids = mk.make(A, "a2", 4, t0 + 50)
    a2p, a2p_keys, a2p_ids = mk.make(A, "a2p", 2, t0 + 50, judged=False)
    b2, _, b2_ids = mk.make(B, "b2", 4, t0 + 50)
    produce(own_broker, a2 + a2p + b2)
    _ingest_until(trainer, a2_ids + a2p_ids + b2_ids)
    assert {s.key for s in trainer.buffer} >= set(a2_keys) and set(a2p_keys) <= set(trainer.joiner.pending)
    trainer.save()
    before_forget = trainer._latest().name

    # 3. `flywheel tenants forget A`; then events of A written before it arrive, and B's
    forgotten = time.time()
    _policy(own_broker, ev.TenantRecord(tenant=A, name="acme", forgotten_before=forgotten))
    a3, a3_keys, a3_ids = mk.make(A, "a3", 3, forgotten - 5)
    b3, _, b3_ids = mk.make(B, "b3", 4, forgotten + 1)
    produce(own_broker, a3 + b3)
    _ingest_until(trainer, a3_ids + b3_ids)
    assert trainer.privacy.policies[A]["forgotten_before"] == forgotten
    assert not [s for s in trainer.buffer if s.tenant == A] and not [e for e in _held(trainer) if e.tenant == A]
    dropped = [e for e in trainer.trained_since_ckpt if e.get("dropped") == "forgotten"]
    assert sorted(e["key"] for e in dropped) == sorted(a2_keys)
    # 4 buffered samples + 2 waiting completions + 3 completions and their 3 feedback refused
    assert _dropped(trainer, "forgotten") == 4 + 2 + 6

    # 4. killed before the next checkpoint: the restart re-reads the forget from the checkpoint's offsets
    trainer.reader.close()
    trainer = Trainer(cfg)
    assert {s.key for s in trainer.buffer} >= set(a2_keys)  # as the checkpoint before the forget had it
    _ingest_until(trainer, a3_ids + b3_ids)
    assert not [s for s in trainer.buffer if s.tenant == A] and not [e for e in _held(trainer) if e.tenant == A]
    assert _dropped(trainer, "forgotten") == 4 + 2 + 6
    _train_all(trainer)
    trainer.checkpoint()
    assert trainer.publish() == 2
    # the checkpoints from before the forget held A's samples and events: the first one after stands alone
    on_disk = sorted((work / "checkpoints").glob("step-*"))
    assert on_disk == [trainer._latest()] and not trainer.privacy.purged
    for checkpoint in on_disk:
        samples, events = _checkpoint_holds(trainer, checkpoint)
        assert not [x for x in samples + events if x[0] == A]
    assert trainer.checkpoints.load()["privacy"]["policies"][A]["forgotten_before"] == forgotten
    later = _ledger_after(work, before_forget)
    assert not [e for e in later if e["tenant"] == A and "dropped" not in e], "A trained after its forget"
    assert sorted(e["key"] for e in later if e["tenant"] == A) == sorted(a2_keys)  # dropped, once
    assert {e["tenant"] for e in later if "dropped" not in e} == {B}

    # 5. provenance: weights are not un-trained, so v2 still counts A's samples of v1, and only those
    v2 = json.loads((work / "provenance" / "v2.json").read_text())
    assert v2["tenants_total"] == {A: 6, B: 6 + 4 + 4} and v2["tenants"] == {B: 8}
    assert [(r["version"], r["tenants"], r["tenants_total"]) for r in provenance.versions_for(work, {A})] == [
        (1, {A: 6}, {A: 6}),
        (2, {A: 0}, {A: 6}),
    ]
    assert [r["version"] for r in provenance.read_all(work)] == [0, 1, 2]
    assert provenance.versions_for(work, {"nobody"}) == []

    # 6. another restart, after a checkpoint: the forget is in force from the checkpoint's own state; A's
    # events written before it are still refused, those written after it are trained
    trainer.reader.close()
    trainer = Trainer(cfg)
    assert trainer.privacy.policies[A]["forgotten_before"] == forgotten and trainer.privacy.trained[A] == 6
    assert not trainer.privacy.purged  # nothing newly forgotten: checkpoints are kept as usual again
    a4, _, a4_ids = mk.make(A, "a4", 2, forgotten - 1)
    a5, a5_keys, a5_ids = mk.make(A, "a5", 2, time.time())
    produce(own_broker, a4 + a5)
    _ingest_until(trainer, a4_ids + a5_ids)
    assert sorted(s.key for s in trainer.buffer if s.tenant == A) == sorted(a5_keys)
    assert _dropped(trainer, "forgotten") == 4
    _train_all(trainer)
    trainer.checkpoint()
    trained_a = {e["key"] for e in _ledger_after(work, before_forget) if e["tenant"] == A and "dropped" not in e}
    assert trained_a == set(a5_keys) and trainer.privacy.trained[A] == 8
    assert len(list((work / "checkpoints").glob("step-*"))) == 2
    trainer.reader.close()


def test_a_late_deny_drops_the_tenant_and_withheld_events_never_become_samples(
    own_broker, served, test_model, tmp_path
):
    cfg = TrainerConfig(
        model_dir=test_model,
        work_dir=tmp_path / "trainer",
        kafka_bootstrap=own_broker,
        group_id="deny",
        min_batch=1,
        loss=LossConfig(kl_coef=0.0),
    )
    C, D = "tenant-c-deny", "tenant-d-withheld"
    mk = Events(served)
    trainer = Trainer(cfg)
    now = time.time()
    c1, c1_keys, c1_ids = mk.make(C, "c1", 3, now)
    c1p, c1p_keys, c1p_ids = mk.make(C, "c1p", 1, now, judged=False)
    # D: a completion whose secret was scrubbed (no content: never a sample, its judgment an orphan), and one
    # without a secret judged by an accept the scrubber flagged (a judgment carries no content: it joins)
    dw, dw_keys, dw_ids = mk.make(D, "dw", 1, now, withheld="secret")
    d_ok, d_ok_keys, d_ok_ids = mk.make(D, "dok", 1, now, judged=False)
    flagged = ev.FeedbackEvent(completion_id="dok-0", choice_index=0, tenant=D, kind="accept", withheld="secret")
    produce(own_broker, c1 + c1p + dw + d_ok + [(ev.TOPIC_FEEDBACK, "dok-0", flagged.encode())])
    _ingest_until(trainer, c1_ids + c1p_ids + dw_ids + d_ok_ids + [flagged.event_id])
    mine = {s.key for s in trainer.buffer}
    assert set(c1_keys) <= mine and set(c1p_keys) <= set(trainer.joiner.pending)
    assert set(d_ok_keys) <= mine and not set(dw_keys) & (mine | set(trainer.joiner.pending))
    assert _dropped(trainer, "withheld") >= 1

    # C's policy turns to deny after its events: what is held goes, and what comes is refused
    _policy(own_broker, ev.TenantRecord(tenant=C, train="deny"))
    c2, _, c2_ids = mk.make(C, "c2", 2, time.time())
    produce(own_broker, c2)
    _ingest_until(trainer, c2_ids)
    assert not [s for s in trainer.buffer if s.tenant == C] and not [e for e in _held(trainer) if e.tenant == C]
    assert sorted(e["key"] for e in trainer.trained_since_ckpt if e.get("dropped") == "deny") == sorted(c1_keys)
    assert _dropped(trainer, "deny") >= 3 + 1 + 4
    _train_all(trainer)
    trainer.checkpoint()
    ledger = trainer.checkpoints.ledger_entries()
    trained = {e["key"] for e in ledger if "dropped" not in e}
    assert set(d_ok_keys) <= trained and not set(dw_keys) & {e["key"] for e in ledger}
    assert not [e for e in ledger if e["tenant"] == C and "dropped" not in e]
    assert trainer.privacy.trained.get(C, 0) == 0 and trainer.privacy.trained[D] == 1
    # After the test above, this trainer starts on a stream that holds a forget: it read every tenant record
    # before any event, so the forgotten tenant's events were refused, never joined first and dropped after.
    assert not [e for e in ledger if e.get("dropped") == "forgotten"]

    # Idle: D is forgotten while nothing is trained. A waiting completion of D's is in the checkpoint; the next
    # checkpoint is written all the same, alone on disk, without it.
    d_wait, _, d_wait_ids = mk.make(D, "dwait", 1, time.time(), judged=False)
    produce(own_broker, d_wait)
    _ingest_until(trainer, d_wait_ids)
    trainer.save()
    assert any(t == D for t, _ in _checkpoint_holds(trainer)[1])
    step, before = trainer.step, trainer._latest()
    # after every event of D's here (a judgment is dated a second after its completion)
    _policy(own_broker, ev.TenantRecord(tenant=D, forgotten_before=time.time() + 5))
    deadline = time.monotonic() + 60
    while trainer.privacy.policies.get(D, {}).get("forgotten_before") is None:
        assert time.monotonic() < deadline, "the forget never came"
        trainer.ingest()
    trainer.checkpoint()
    assert trainer.step == step and trainer._latest() != before
    assert trainer.checkpoints.others(trainer._latest()) == []
    assert not [t for t, _ in _checkpoint_holds(trainer)[1] if t == D] and not trainer.privacy.purged
    trainer.reader.close()


def test_the_reader_gives_every_tenant_policy_before_any_event(own_broker):
    """However far behind it starts, the trainer knows each forget and deny before it reads an event: more
    events than one fetch returns (max_poll_records) wait, in their partitions, behind the policy."""
    from online_rl.data.reader import StreamReader

    probe = "tenant-reader-probe"
    events = [
        ev.FeedbackEvent(completion_id=f"probe-{i}", choice_index=0, tenant=probe, kind="accept") for i in range(3000)
    ]
    produce(own_broker, [(ev.TOPIC_FEEDBACK, f.completion_id, f.encode()) for f in events])
    _policy(own_broker, ev.TenantRecord(tenant=probe, retention_days=1.0))  # written after the events
    reader = StreamReader(own_broker, "policies-first", poll_ms=200)
    topics: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not (set(topics) >= {ev.TOPIC_TENANTS, ev.TOPIC_FEEDBACK} and len(topics) >= 3001):
            assert time.monotonic() < deadline, (len(topics), topics.count(ev.TOPIC_TENANTS), topics[:3])
            topics += [t for t, _ in reader.read(reader.fetch())]
    finally:
        reader.close()
    last_policy = max(i for i, t in enumerate(topics) if t == ev.TOPIC_TENANTS)
    assert all(t == ev.TOPIC_TENANTS for t in topics[: last_policy + 1]), topics[: last_policy + 1]


def test_commented_contexts_follow_their_tenants_policy_and_distilled_samples_count_in_provenance(
    test_model, tmp_path, caplog
):
    """A commented context waiting to be distilled again goes when its tenant's retention or policy refuses it;
    the students' samples of it count in its tenant's provenance (distilled, apart from the user samples)."""
    from tests.helpers import served_samples
    from weight_sync.manifest import generate_key

    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    loss = LossConfig(kl_coef=0.0, distill_samples=4, distill_updates=3)
    # a checkpoint from before tenants: its samples carry none, and the resumed trainer says so
    old = Trainer(TrainerConfig(model_dir=test_model, work_dir=tmp_path / "old", min_batch=1, loss=loss))
    old.buffer = served_samples(test_model, 3)
    old.save()
    with caplog.at_level(logging.WARNING, logger="online_rl.trainer.loop"):
        Trainer(old.cfg)
    assert "3 user samples with no tenant" in caplog.text

    work = tmp_path / "trainer"
    cfg = TrainerConfig(
        model_dir=test_model,
        work_dir=work,
        min_batch=1,
        loss=loss,
        publish=PublisherConfig(store=tmp_path / "store", key=tmp_path / "k.pem"),
    )
    t = Trainer(cfg)
    E, F = "tenant-e-comments", "tenant-f-comments"
    now = time.time()
    samples = served_samples(test_model, 4)
    for i, s in enumerate(samples):
        s.group, s.tenant, s.ts = None, (E, F)[i // 2], now - 3 * 86400 if i < 2 else now
    samples[1].hint_ids = np.array([11, 12, 13], np.int64)  # E's comment, three days old
    samples[3].hint_ids = np.array([14, 15], np.int64)  # F's
    t.buffer = samples
    m = t.train_step()
    assert sorted(c.tenant for c, _ in t.commented) == [E, F]  # both wait to be distilled again
    assert m["distill_samples"] >= 1 and sum(t.privacy.distilled.values()) == m["distill_samples"]
    assert set(t.privacy.distilled) <= {E, F} and t.privacy.trained == {E: 2, F: 2}
    t.checkpoint()
    assert t.publish() == 1
    v1 = json.loads((work / "provenance" / "v1.json").read_text())
    assert v1["tenants_total"] == {E: 2, F: 2} and v1["distilled_total"] == v1["distilled"] == t.privacy.distilled
    distilled_e = t.privacy.distilled.get(E, 0)
    found = provenance.versions_for(work, {E})
    assert [(r["version"], r["tenants_total"], r["distilled_total"]) for r in found] == [
        (1, {E: 2}, {E: distilled_e} if distilled_e else {})
    ]

    # E now keeps one day: its context is refused before the next sampling (retention is checked at each use)
    t.privacy.record(ev.TenantRecord(tenant=E, retention_days=1.0))
    assert not t.privacy.purged and len(t.commented) == 2
    plain = served_samples(test_model, 2, seed=5)
    for s in plain:
        s.group, s.tenant, s.ts = None, F, now
    t.buffer = plain
    t.train_step()
    assert [c.tenant for c, _ in t.commented] == [F] and _dropped(t, "retention") == 1
    assert t.privacy.distilled.get(E, 0) == distilled_e  # nothing more of E's distilled

    # F denies training: its waiting context goes with the rest, and the next checkpoint stands alone
    t.privacy.record(ev.TenantRecord(tenant=F, train="deny"))
    assert t.commented == [] and t.privacy.purged and _dropped(t, "deny") == 1
    t.checkpoint()
    assert sorted((work / "checkpoints").glob("step-*")) == [t._latest()] and not t.privacy.purged
    assert t.checkpoints.load()["commented"] == []
