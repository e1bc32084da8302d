"""The demo's eval gate on the session's broker and a real store: a test-preset trainer publishing with the gate on
(PublisherConfig.gate, `flywheel train --gate`) leaves its trained version unannounced; the follower the demo starts
(flywheel.demo.gate: `flywheel gate --follow`, niced, one torch thread, logged in to Kafka as the trainer) judges it
and announces it; on the weights topic, which the fleet's agents follow, the version comes only after its signed pass
record, and the demo's per-version figures are that record's."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import torch

from flywheel.demo import gate as demo_gate
from infra.procs import spawn, stop_pid, tail, wait_until
from tests.integration.online_rl.gate.test_gate import _ours
from weight_sync.manifest import generate_key, load_private
from weight_sync.store.server import Store

pytestmark = pytest.mark.timeout(420)


def test_a_trained_version_reaches_the_weights_topic_only_after_its_pass_record(
    test_model, kafka_bootstrap, kafka_security, tmp_path
):
    from tokenizers import Tokenizer

    from online_rl.config import OptimConfig, PublisherConfig, TrainerConfig
    from online_rl.data.simulate import events_for, heldout_split, produce, sample_completions
    from online_rl.trainer.loop import Trainer

    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    store_dir = tmp_path / "store"
    trainer = Trainer(
        TrainerConfig(
            model_dir=test_model,
            work_dir=tmp_path / "trainer",
            kafka_bootstrap=kafka_bootstrap,
            group_id=f"demo-gate-{os.getpid()}-{time.time_ns()}",
            min_batch=1,
            publish=PublisherConfig(store=store_dir, key=tmp_path / "k.pem", gate=True),
            optim=OptimConfig(lr=1e-5),
        )
    )
    tok = Tokenizer.from_file(str(test_model / "tokenizer.json"))
    samples = sample_completions(trainer.model, tok, heldout_split()[0][:6], 2, torch.Generator().manual_seed(3))
    produce(kafka_bootstrap, events_for(samples, lambda out: "accept" if "+" in tok.decode(out) else "reject"))
    deadline = time.monotonic() + 60
    while trainer.joiner.stats.joined < len(samples) and time.monotonic() < deadline:
        trainer.ingest()
    assert trainer.train_step(force=True) is not None
    assert trainer.publish() == 1
    assert trainer.publisher.announce()  # v0 (never gated); v1 waits for the gate
    store = Store(store_dir)
    assert store.versions() == [0, 1] and store.announced() == 0 and store.unannounced() == [1]

    suite = ["--tasks", "4", "--sessions", "1", "--samples", "2"]
    cmd = demo_gate.follower_command(store_dir, tmp_path / "k.pem", kafka_bootstrap, None, 1, suite=suite)
    trainer_login = kafka_security.client_env("trainer") if kafka_security is not None else {}
    log = tmp_path / "gate.log"
    with open(log, "ab") as out:
        follower = spawn(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         env={**os.environ, **trainer_login, "OMP_NUM_THREADS": "1"})  # fmt: skip
    try:
        try:
            wait_until(
                lambda: store.announced() == 1, 300, 0.5, "v1 judged and announced", lambda: follower.poll() is None
            )
        except (TimeoutError, RuntimeError) as e:
            raise AssertionError(f"{e}; the gate's log:\n{tail(log)}") from e
        assert os.getpriority(os.PRIO_PROCESS, follower.pid) >= demo_gate.NICENESS  # spare capacity, below serving
    finally:
        assert stop_pid(follower.pid, timeout=30)

    ours = _ours(kafka_bootstrap, load_private(tmp_path / "k.pem").public_key())
    assert [(r["type"], r["version"], r.get("verdict")) for r in ours] == [
        ("version", 0, None),
        ("gate", 1, "pass"),  # the fleet hears of v1 only after its pass record
        ("version", 1, None),
    ]
    record = store.gate_verdicts()[1]
    assert record["stable"] == 0 and record["figures"]["suite"] == {"tasks": 4, "sessions": 1, "samples": 2}
    figures = demo_gate.verdicts(store_dir)[1]
    assert figures["verdict"] == "pass" and figures["seconds"] == record["figures"]["seconds"]["total"] > 0
    assert figures["cpu_seconds"] == record["figures"]["cpu_seconds"] > 0
