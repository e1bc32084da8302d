"""The trainer's hand-off with the eval gate on (`flywheel train --gate`): v0, the fleet's first version, is announced
as always; every later version is committed to the store and left unannounced, in the gate's queue
(online_rl.gate.cli.waiting), and a restarted trainer does not announce it either."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, Counter

from online_rl.config import PublisherConfig
from online_rl.gate.cli import waiting
from online_rl.model.transformer import load_pretrained
from online_rl.trainer.failures import Failures
from online_rl.trainer.publisher import Publisher
from weight_sync.manifest import generate_key
from weight_sync.publish import unannounced
from weight_sync.store.server import Store


def test_with_the_gate_only_v0_is_announced_by_the_trainer(test_model, tmp_path):
    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    cfg = PublisherConfig(store=tmp_path / "store", key=tmp_path / "k.pem", gate=True)
    failures = Failures(Counter("f", "f", ["stage", "cause"], registry=CollectorRegistry()))
    p = Publisher(cfg, test_model, tmp_path / "work", failures)
    assert p.publish(load_pretrained(test_model), 1, {}) == 1
    store = Store(cfg.store)
    announced = [json.loads(line) for line in (cfg.store / "announcements.jsonl").read_text().splitlines()]
    assert [(a["type"], a["version"]) for a in announced] == [("version", 0)] and not p.pending
    # No broker here: v0 never marked as sent, and still not the gate's (the trainer announces it, also restarted).
    assert store.versions() == [0, 1] and waiting(store) == [1]
    store.mark_announced(0)  # what a broker's acknowledgement records
    assert waiting(store) == [1]
    restarted = Publisher(cfg, test_model, tmp_path / "work", failures, kafka_bootstrap="127.0.0.1:1")
    assert restarted.pending == [] and [r["version"] for r in unannounced(p._config())] == [1]
