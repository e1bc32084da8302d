"""The trainer daemon lives through failures, each made to happen for real in the middle of one run:
a sample the model cannot take (a token id past the vocabulary), a rollout group that cannot be judged,
HTTP calls to a gateway that went away (a TCP proxy switched off), a publish the disk refuses (a file
where the output directory goes), and announcements while the broker is down (stopped, then restarted on
its data dir). The run goes on, recovers from each, and ends with the right counts: every good sample
trained once, every version in the store announced."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from contracts import events as ev
from flywheel.kafka import broker as kafka_broker
from infra.procs import wait_until
from online_rl.config import OptimConfig, PublisherConfig, RolloutConfig, TrainerConfig
from online_rl.data.simulate import events_for, heldout_split, produce, sample_completions
from online_rl.model.transformer import load_pretrained
from online_rl.sandbox import judge as sandbox_judge
from online_rl.trainer.failures import RetryConfig
from online_rl.trainer.loop import Trainer
from tests.helpers import GATEWAY_ADMIN, TcpProxy

pytestmark = pytest.mark.timeout(600)


def wait_for(what: str, cond, timeout: float = 120.0) -> None:
    wait_until(cond, timeout, interval=0.2, what=what)


def weights_records(bootstrap: str, public_key) -> list[dict]:
    """The weights topic from its start to its end now, each record verified (call it once they are announced)."""
    from contracts import control
    from infra.kafka_admin import records_to_end

    return [control.decode(r.value, public_key) for r in records_to_end(bootstrap, ev.TOPIC_WEIGHTS)]


def test_trainer_survives_each_failure_mid_run(test_model, gateway, tmp_path, monkeypatch):
    from tokenizers import Tokenizer

    from weight_sync.manifest import generate_key
    from weight_sync.store.server import Store

    broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path / "kafka"))
    proxy = TcpProxy(int(gateway.url.rsplit(":", 1)[1]))
    proxy.start()
    stop = threading.Event()
    thread = None
    try:
        tok = Tokenizer.from_file(str(test_model / "tokenizer.json"))
        model = load_pretrained(test_model)
        raw = sample_completions(
            model, tok, heldout_split()[0][:12], 2, torch.Generator().manual_seed(4), max_tokens=12
        )
        ids, out, lp, experts = raw[0]
        bad = (ids, out[:-1] + [model.cfg.vocab_size + 7], lp, experts)  # the same shapes, one impossible token
        records = events_for(raw, lambda o: "accept" if len(o) % 2 else "reject", prefix="ft")
        records += events_for([bad], lambda o: "accept", prefix="ftbad")
        produce(broker.bootstrap, records)
        good = {f"ft-{i}:0" for i in range(len(raw))}

        generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
        work = tmp_path / "trainer"
        work.mkdir()
        (work / "published").write_text("a file where the publisher writes its checkpoint directory")
        cfg = TrainerConfig(
            model_dir=test_model,
            work_dir=work,
            kafka_bootstrap=broker.bootstrap,
            group_id="faults",
            batch_size=8,
            min_batch=1,
            publish=PublisherConfig(
                store=tmp_path / "store", key=tmp_path / "k.pem", interval_s=2.0, announce_timeout_s=3.0
            ),
            poll_ms=200,
            optim=OptimConfig(lr=1e-4),
            retry=RetryConfig(base_s=0.5, max_s=2.0),
            rollouts=RolloutConfig(
                gateway_url=proxy.url, admin_token=GATEWAY_ADMIN, tasks_per_step=1, group_size=4, max_tokens=16
            ),
        )
        trainer = Trainer(cfg)

        # One rollout group cannot be judged (the sandbox call fails once); the real sandbox otherwise.
        real_run, broken = sandbox_judge.run, [True]

        def run_once_broken(*a, **k):
            if broken[0]:
                broken[0] = False
                raise RuntimeError("injected: this group's judging fails")
            return real_run(*a, **k)

        monkeypatch.setattr(sandbox_judge, "run", run_once_broken)
        errors = []

        def daemon():
            try:
                trainer.run(stop)
            except BaseException as e:  # noqa: BLE001 - the test reports it
                errors.append(e)

        thread = threading.Thread(target=daemon, daemon=True)
        thread.start()
        count = trainer.failures.count

        # The bad sample, the broken group and the blocked publish all happen in the first seconds.
        wait_for(
            "a bad sample, a broken group, a failed publish",
            lambda: count("sample") >= 1 and count("rollout_group") >= 1 and count("publish") >= 1,
        )
        (work / "published").unlink()
        wait_for("a publish after the disk is fixed", lambda: len(Store(tmp_path / "store").versions()) >= 2)

        proxy.stop()  # the gateway goes away: rollout HTTP calls fail and back off
        wait_for("a failed rollout call", lambda: count("rollout_http") >= 1)
        step = trainer.step
        proxy.start()
        wait_for("rollouts again", lambda: trainer.step > step + 2 and trainer.rollouts.generated > 0)

        broker.stop()  # announcements (and ingest) fail while the broker is away
        wait_for("a failed announcement", lambda: count("announce") >= 1, timeout=60)
        assert thread.is_alive()
        broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path / "kafka"))
        wait_for("every version announced", lambda: not trainer.publisher.pending, timeout=120)
        stop.set()
        thread.join(timeout=120)
        assert not thread.is_alive() and not errors, errors

        assert count("sample") == 1 and count("rollout_group") == 1
        versions = Store(tmp_path / "store").versions()
        from weight_sync.manifest import load_public

        announced = [
            r["version"]
            for r in weights_records(broker.bootstrap, load_public(tmp_path / "k.pub"))
            if r["type"] == "version"
        ]
        assert set(announced) == set(versions) and len(versions) >= 3, (announced, versions)
        ledger = [e for f in sorted((work / "ledger").glob("step-*.json")) for e in json.loads(f.read_text())]
        trained = [e["key"] for e in ledger if e["key"].startswith("ft-") and "dropped" not in e]
        assert len(trained) == len(set(trained)), "a sample was trained twice"
        assert set(trained) == good
        assert {e["key"]: e["dropped"] for e in ledger if e["key"].startswith("ftbad-")} == {"ftbad-0:0": "invalid"}
        metrics = trainer.metrics.registry
        assert (
            metrics.get_sample_value("flywheel_trainer_failures_total", {"stage": "sample", "cause": "InvalidSample"})
            == 1
        )
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=60)
        proxy.shutdown()
        assert broker.stop()
