"""Control-plane consistency without a broker (the same against Kafka and real agents:
tests/integration/weight_sync/test_weight_sync_faults.py): sequence numbers never go back, also when the counter file
is lost;
a torn last line of the activation ledger is recovered, never fatal to a publish or to the trainer's start; a
tenant policy re-announced from a stale keys file cannot loosen a newer one."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from contracts import events as ev
from online_rl.data.tenants import TenantGate
from serving import auth
from tests.weight_sync_setup import tiny_checkpoint
from weight_sync.manifest import generate_key
from weight_sync.publish import PublishConfig, activate, announce, publish
from weight_sync.store.server import Store


@pytest.fixture
def store(tmp_path):
    """A store with v0 and v1 (no broker: records are numbered, ledgered, not sent) and its publish config."""
    generate_key(tmp_path / "s.pem", tmp_path / "s.pub")
    cfg = PublishConfig(store=tmp_path / "store", private_key=tmp_path / "s.pem")
    c0 = tiny_checkpoint(tmp_path / "c0", 0)
    publish(c0, cfg)
    publish(tiny_checkpoint(tmp_path / "c1", 1, base=c0), cfg)
    return cfg, Store(cfg.store), tmp_path


def test_a_lost_counter_never_hands_out_a_number_already_announced(store):
    cfg, s, tmp = store
    first = activate(cfg, 0, "serve v0")  # a decision: in activations.jsonl
    body = s.manifest(1)
    announced = announce(cfg, {"schema": "flywheel.control/1", "type": "version", "version": 1, "kind": body.kind})
    assert announced["seq"] > first["seq"]
    (cfg.store / "control_seq").unlink()  # lost (a restore, a new host, a hand clean-up)
    rollback = activate(cfg, 0, "rollback by SRE")
    assert rollback["seq"] > announced["seq"]  # the agents passed announced["seq"]: a replay they would drop
    (cfg.store / "control_seq").write_text("1")  # restored from an older copy: the ledgers still say more
    assert activate(cfg, 1, "forward again")["seq"] == rollback["seq"] + 1
    (cfg.store / "control_seq").write_text("not a number")
    assert activate(cfg, 0, "and back")["seq"] == rollback["seq"] + 2
    ledgered = [json.loads(line) for line in (cfg.store / "announcements.jsonl").read_text().splitlines()]
    assert ledgered[-1]["seq"] == announced["seq"] and ledgered[-1]["version"] == 1


def test_a_torn_ledger_tail_is_cut_and_neither_publish_nor_the_trainers_start_fails(store):
    from prometheus_client import Counter

    from online_rl.config import PublisherConfig
    from online_rl.trainer.failures import Failures
    from online_rl.trainer.publisher import Publisher

    cfg, s, tmp = store
    kept = activate(cfg, 1, "pinned", kind="pin")
    path = cfg.store / "activations.jsonl"
    with open(path, "ab") as f:  # what an append cut short by a full disk leaves (the record was never sent)
        f.write(b'{"schema": "flywheel.control/1", "type": "rollback", "version": 0, "seq": 9')
    assert s.activations() == [kept] and s.decided() == {1}  # read past, not fatal
    # The trainer's start reads the ledger (versions committed but never announced): no crash.
    failures = Failures(Counter("f", "f", ["stage", "cause"], registry=CollectorRegistry()))
    pub = Publisher(
        PublisherConfig(store=cfg.store, key=cfg.private_key), tmp / "c0", tmp / "work", failures, "127.0.0.1:9"
    )
    assert pub.enabled
    # Publishing after its commit folds the ledger (retention keeps decided versions): it succeeds.
    c2 = tiny_checkpoint(tmp / "c2", 2, base=tmp / "c1")
    assert publish(c2, cfg).version == 2
    # The next decision is a whole line of its own, numbered above the torn one's number (9 may have been used).
    nxt = activate(cfg, 2, "serve v2")
    assert nxt["seq"] > 9
    assert s.activations() == [kept, nxt]
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(line) for line in lines[:-1])
    # A ledger an older release appended to after a torn tail (the whole record glued to the torn one): the
    # glued record is read, the torn part skipped.
    whole = dict(nxt, seq=nxt["seq"] + 1, type="pin", version=2)
    with open(path, "ab") as f:
        f.write(b'{"schema": "flywheel.control/1", "type": "unpin", "se' + json.dumps(whole).encode() + b"\n")
    assert s.activations() == [kept, nxt, whole] and s.decided() == {2}


def test_an_append_that_fails_leaves_no_torn_tail(store, monkeypatch):
    import os

    cfg, s, tmp = store
    kept = activate(cfg, 1, "pinned", kind="pin")
    real_write = os.write

    def disk_full(fd, data):  # the first few bytes land, then ENOSPC, as on a full disk
        if len(data) > 10:
            real_write(fd, bytes(data[:10]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(OSError):
        activate(cfg, 0, "rollback by SRE")
    monkeypatch.setattr(os, "write", real_write)
    assert (cfg.store / "activations.jsonl").read_bytes().endswith(b"\n") and s.activations() == [kept]


def _record(tid, policy: auth.Policy) -> ev.TenantRecord:
    return ev.TenantRecord(tenant=tid, name="acme", train=policy.train, version=policy.version)


def test_a_policy_re_announced_from_a_stale_keys_file_cannot_loosen_a_newer_one(tmp_path):
    keys = tmp_path / "keys.json"
    auth.add_key(keys, "acme")
    old = auth.set_policy(keys, "acme", retention_days=30)  # what the stale copy holds
    new = auth.set_policy(keys, "acme", train="deny")
    assert new.version > old.version
    assert auth.KeyStore.load(keys).policy("acme") == new  # the version is kept in the file
    gate = TenantGate(registry=CollectorRegistry())
    gate.record(_record("t1", new).encode())
    gate.record(_record("t1", old).encode())  # a gateway restarted on the stale file re-announces
    assert gate.policies["t1"]["train"] == "deny" and gate.policies["t1"]["version"] == new.version
    assert gate.stale_records._value.get() == 1
    # A forget only tightens: taken even from an older record.
    gate.record(ev.TenantRecord(tenant="t1", forgotten_before=5.0, version=old.version).encode())
    assert gate.policies["t1"]["forgotten_before"] == 5.0 and gate.policies["t1"]["train"] == "deny"
    # A newer change does loosen it; the state round-trips with its version.
    newer = auth.set_policy(keys, "acme", train="allow")
    gate.record(_record("t1", newer).encode())
    assert gate.policies["t1"]["train"] == "allow"
    again = TenantGate(registry=CollectorRegistry())
    again.load_state(gate.state())
    again.record(_record("t1", new).encode())
    assert again.policies["t1"]["train"] == "allow"


def test_a_policy_version_is_checked_in_the_file_and_on_the_wire(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [], "tenants": {"acme": {"train": "deny", "version": "9"}}}))
    with pytest.raises(ValueError, match="version"):
        auth.KeyStore.load(keys)
    raw = ev.TenantRecord(tenant="t1", version=-1).encode()
    with pytest.raises(ev.SchemaError, match="version"):
        ev.decode(raw)
