"""The eval gate's records without a broker (against Kafka: tests/integration/online_rl/gate/): a blocked version
stays in the store and is never announced by a restarted publisher; an SRE's override is a record of who and why,
then the version's announcement as the trainer would have sent it; the store's /metrics show blocks; a version is
rebuilt from the store bit for bit; bad input (an unknown version, one not blocked, no reason, an unsigned or
ill-formed gate record) is a clear error."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from contracts import control
from tests.weight_sync_setup import tiny_checkpoint
from weight_sync import gate
from weight_sync.manifest import ManifestError, generate_key, load_private
from weight_sync.publish import PublishConfig, publish, stored_announcement, unannounced
from weight_sync.store.metrics import GateVerdicts
from weight_sync.store.rebuild import rebuild
from weight_sync.store.server import Store


@pytest.fixture
def held(tmp_path):
    """v0 announced; v1 (a delta) published with the gate on: in the store, not announced; a canary publisher."""
    generate_key(tmp_path / "s.pem", tmp_path / "s.pub")
    cfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "s.pem", canary=True)
    c0 = tiny_checkpoint(tmp_path / "c0", 0, with_bias=True)
    publish(c0, dataclasses.replace(cfg, canary=False))
    Store(cfg.store).mark_announced(0)
    c1 = tiny_checkpoint(tmp_path / "c1", 1, base=c0)
    assert publish(c1, cfg, announce_now=False).kind == "delta"
    return cfg, Store(cfg.store), c1


def test_a_block_is_recorded_and_keeps_the_version_unannounced(held):
    cfg, store, _ = held
    assert [r["version"] for r in unannounced(cfg)] == [1]  # before the gate: a restart would announce it
    rec = gate.decide(cfg, 1, "block", "pass_at_1 0.1 vs 0.4", 0, {"pass_at_1": {"candidate": 0.1}})
    assert rec["type"] == "gate" and rec["verdict"] == "block" and rec["stable"] == 0 and rec["canary"] is True
    assert store.gate_blocked() == {1} and unannounced(cfg) == []
    assert 1 in store.versions()  # it stays in the store
    ledger = store.activations()[-1]
    assert ledger["figures"] == {"pass_at_1": {"candidate": 0.1}} and ledger["seq"] == rec["seq"]


def test_a_pass_is_recorded_then_announced(held):
    cfg, store, _ = held
    rec = gate.decide(cfg, 1, "pass", "no regression", 0, {})
    assert rec["verdict"] == "pass" and store.gate_blocked() == set()
    sent = [json.loads(line) for line in (cfg.store / "announcements.jsonl").read_text().splitlines()]
    assert sent[-1]["type"] == "version" and sent[-1]["version"] == 1 and sent[-1]["seq"] > rec["seq"]


def test_an_override_records_who_and_why_then_announces(held):
    cfg, store, _ = held
    gate.decide(cfg, 1, "block", "worse", 0, {})
    plain = dataclasses.replace(cfg, canary=False)  # the SRE's command has no --canary: the block remembers it
    rec = gate.override(plain, 1, "known eval flake, trial it", by="sre-alice")
    assert rec["verdict"] == "override" and rec["by"] == "sre-alice" and rec["reason"] == "known eval flake, trial it"
    assert store.gate_blocked() == set()
    assert stored_announcement(cfg, 1)["canary"] is True
    sent = [json.loads(line) for line in (cfg.store / "announcements.jsonl").read_text().splitlines()]
    assert sent[-1]["version"] == 1 and sent[-1]["seq"] == rec["seq"] + 1


def test_bad_overrides_and_verdicts_are_clear_errors(held):
    cfg, _, _ = held
    with pytest.raises(ValueError, match="not in the store"):
        gate.override(cfg, 7, "why")
    with pytest.raises(ValueError, match="not blocked by the gate .no gate verdict."):
        gate.override(cfg, 1, "why")
    gate.decide(cfg, 1, "block", "worse", 0, {})
    with pytest.raises(ValueError, match="needs a reason"):
        gate.override(cfg, 1, "  ")
    with pytest.raises(ValueError, match="pass or block"):
        gate.decide(cfg, 1, "override", "x", 0, {})
    gate.override(cfg, 1, "go")
    with pytest.raises(ValueError, match="verdict 'override'"):
        gate.override(cfg, 1, "again")


def test_gate_records_are_checked_like_every_control_record(tmp_path):
    with pytest.raises(control.ControlError, match="verdict"):
        control.make("gate", 3, seq=1, verdict="maybe")
    rec = control.make("gate", 3, seq=1, verdict="block", figures={"pass_at_1": {}}, by="x", stable=2)
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    key = load_private(tmp_path / "k.pem")
    assert control.decode(control.encode(rec, key), key.public_key()) == rec
    with pytest.raises(control.ControlError, match="unsigned"):
        control.decode(json.dumps({"record": rec}).encode(), key.public_key())


def test_the_store_metrics_show_blocks_until_overridden(held):
    cfg, store, _ = held
    gate.decide(cfg, 1, "block", "worse", 0, {"seconds": {"total": 12.5}})

    def families():
        return {f.name: {tuple(s.labels.values()): s.value for s in f.samples} for f in GateVerdicts(store).collect()}

    before = families()
    assert before["flywheel_gate_blocked"] == {("1",): 1} and before["flywheel_gate_seconds"] == {("1",): 12.5}
    assert before["flywheel_gate_verdicts"][("block",)] == 1
    gate.override(cfg, 1, "go")
    after = families()
    assert after["flywheel_gate_blocked"] == {("1",): 0} and after["flywheel_gate_verdicts"][("override",)] == 1


def test_a_version_rebuilds_from_the_store_bit_for_bit(held, tmp_path):
    cfg, store, c1 = held
    public = load_private(cfg.private_key).public_key()
    out = rebuild(store, 1, tmp_path / "v1", public)
    got, want = load_file(str(out / "model.safetensors")), load_file(str(c1 / "model.safetensors"))
    assert set(got) == set(want) and all(torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8)) for k in want)
    assert (out / "config.json").read_bytes() == (c1 / "config.json").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".v1")) == []  # the chain's steps are gone
    with pytest.raises(ValueError, match="not in the store"):
        rebuild(store, 9, tmp_path / "v9", public)
    generate_key(tmp_path / "other.pem", tmp_path / "other.pub")
    with pytest.raises(ManifestError, match="does not verify"):
        rebuild(store, 1, tmp_path / "v1b", load_private(tmp_path / "other.pem").public_key())


def test_retention_keeps_the_version_sent_while_the_gate_blocks_the_newer_ones(held, tmp_path):
    """The fleet serves v0 while the gate blocks v1..v5: with keep=3, v0 must outlive them all (agents that
    restart fetch it; the gate judges the next candidate against it)."""
    cfg, store, c1 = held
    cfg = dataclasses.replace(cfg, keep=3)
    gate.decide(cfg, 1, "block", "worse", 0, {})
    prev = c1
    for v in range(2, 6):
        prev = tiny_checkpoint(tmp_path / f"c{v}", v, base=prev)
        assert publish(prev, cfg, announce_now=False).version == v
        gate.decide(cfg, v, "block", "worse", 0, {})
    assert store.announced() == 0 and 0 in store.decided()
    assert store.versions()[0] == 0 and store.versions()[-3:] == [3, 4, 5]


def test_an_override_of_a_block_older_than_the_version_sent_needs_force(held, tmp_path):
    cfg, store, c1 = held
    plain = dataclasses.replace(cfg, canary=False)
    gate.decide(plain, 1, "block", "worse", 0, {})
    c2 = tiny_checkpoint(tmp_path / "c2", 2, base=c1)
    publish(c2, plain, announce_now=False)
    gate.decide(plain, 2, "pass", "fine", 0, {})
    store.mark_announced(2)  # no broker here: the pass's announcement as sent
    with pytest.raises(ValueError, match="older than v2.*--force"):
        gate.override(plain, 1, "go")
    assert store.gate_blocked() == {1}  # nothing recorded
    assert gate.override(plain, 1, "go back on purpose", force=True)["verdict"] == "override"
