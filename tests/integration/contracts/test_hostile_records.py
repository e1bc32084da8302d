"""Records from the broker are untrusted input (issue #48, item 5): what any client of the broker can write to the
completions, feedback, tenants and weights topics (tests/hostile_records.py) never crashes or stalls the trainer,
a weight agent or the canary controller, also across a restart (the tenants topic is compacted: a bad policy
record stays there forever). Each refused record is counted by topic and reason, copied to the dead-letter topic
and passed; the good records written after them still go through."""

from __future__ import annotations

import collections
import threading
import time

import pytest

from contracts import control, events as ev
from flywheel.kafka import broker as kafka_broker
from infra import kafka_auth
from infra.kafka_admin import ensure_topics, records_to_end
from infra.procs import wait_until
from tests import hostile_records

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A broker of this module's own: its readers take every topic from the start, and what is written here
    (a bad record in the compacted tenants topic included) must not reach other modules' trainers."""
    b = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path_factory.mktemp("kafka")))
    try:
        ensure_topics(b.bootstrap)
        yield b.bootstrap
    finally:
        assert b.stop()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    from weight_sync.manifest import generate_key, load_private

    d = tmp_path_factory.mktemp("keys")
    generate_key(d / "k.pem", d / "k.pub")
    generate_key(d / "other.pem", d / "other.pub")
    key, other = load_private(d / "k.pem"), load_private(d / "other.pem")
    # The store whose sequence numbers every signed record of this module takes (the canary's own included)
    return {"pem": d / "k.pem", "pub": d / "k.pub", "key": key, "other": other, "store": d / "store"}


def _signed(keys, kind: str, version: int | None, **extra) -> bytes:
    """A real control record, numbered by the store as a publisher numbers it."""
    from weight_sync.store.server import Store

    with Store(keys["store"]).sequence() as seq:
        return control.encode(control.make(kind, version, seq=seq, reason="test", **extra), keys["key"])


def _refused_weights(bootstrap: str, keys) -> list:
    """(topic, key, value, reason) of every record on the weights topic that a reader starting from its start
    refuses (this module's tests all write there)."""
    refused, guard = [], control.ReplayGuard()
    for r in records_to_end(bootstrap, ev.TOPIC_WEIGHTS):
        try:
            guard.check(control.decode(r.value, keys["key"].public_key()))
        except control.ControlError as e:
            refused.append((ev.TOPIC_WEIGHTS, "weights", r.value, e.reason))
    return refused


def _send(bootstrap: str, records) -> None:
    """As any client of the broker would: (topic, key, value) each, None a tombstone."""
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, **kafka_auth.client_config(), acks="all")
    try:
        for topic, key, value, *_ in records:
            p.send(topic, key=key.encode(), value=value)
        p.flush(timeout=60)
    finally:
        p.close()


def _expected(records) -> collections.Counter:
    return collections.Counter((topic, reason) for topic, _, _, reason in records)


def _counted(registry, prefix: str, expected: collections.Counter) -> dict:
    return {
        (t, r): registry.get_sample_value(f"{prefix}_bad_records_total", {"topic": t, "reason": r}) for t, r in expected
    }


def _dead_letters(bootstrap: str, consumer: str) -> list:
    """The dead-letter topic's records that `consumer` wrote, as (topic, reason, value)."""
    out = []
    for r in records_to_end(bootstrap, ev.TOPIC_BAD_RECORDS):
        h = {k: v.decode() for k, v in r.headers}
        if h["consumer"] == consumer:
            out.append((h["topic"], h["reason"], r.value))
    return out


def _wait_dead_lettered(bootstrap: str, consumer: str, records) -> None:
    want = collections.Counter((t, r, v) for t, _, v, r in records)
    deadline = time.monotonic() + 60
    while (got := collections.Counter(_dead_letters(bootstrap, consumer))) != want:
        assert time.monotonic() < deadline, (
            f"dead-lettered by {consumer}: missing {[(t, r, (v or b'')[:40]) for t, r, v in want - got]}, "
            f"extra {[(t, r, (v or b'')[:40]) for t, r, v in got - want]}"
        )
        time.sleep(1.0)


def _trainer(test_model, work, bootstrap: str, group: str, keys):
    from online_rl.config import LossConfig, PublisherConfig, TrainerConfig
    from online_rl.trainer.loop import Trainer

    return Trainer(
        TrainerConfig(
            model_dir=test_model,
            work_dir=work,
            kafka_bootstrap=bootstrap,
            group_id=group,
            batch_size=8,
            min_batch=1,
            loss=LossConfig(kl_coef=0.0),
            publish=PublisherConfig(key=keys["pem"]),  # it verifies the weights topic's records with this key
            poll_ms=200,
        )
    )


def _ingest_until(trainer, done, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        trainer.ingest()


def test_the_trainer_counts_dead_letters_and_passes_hostile_records_and_restarts_past_them(
    broker, keys, test_model, tmp_path
):
    import torch
    from tokenizers import Tokenizer

    from online_rl.data.simulate import events_for, heldout_split, sample_completions
    from online_rl.model.transformer import load_pretrained

    tok = Tokenizer.from_file(str(test_model / "tokenizer.json"))
    served = sample_completions(
        load_pretrained(test_model), tok, heldout_split()[0][:2], 2, torch.Generator().manual_seed(5), max_tokens=8
    )
    good = [(t, k, v, None) for t, k, v in events_for(served[:2], lambda o: "accept", prefix="good")]
    events = hostile_records.events()
    _send(broker, events + hostile_records.weights(keys["key"], keys["other"]) + good)
    hostile = events + _refused_weights(broker, keys)
    want = _expected(hostile)

    first = _trainer(test_model, tmp_path / "t1", broker, "hostile-1", keys)
    try:
        # On the code before this check, the tenants record with ts "x" raised here, at every start.
        _ingest_until(first, lambda: first.joiner.stats.joined == 2, "the good events after the hostile ones")
        assert _counted(first.metrics.registry, "flywheel_trainer", want) == dict(want)
        assert first.train_step(force=True) is not None  # and it still learns from what is good
        first.save()
        _wait_dead_lettered(broker, "trainer", hostile)
    finally:
        first.reader.close()

    # Restarted on its checkpoint: past the hostile records (their offsets are committed with it), nothing is
    # counted again, and new events still join.
    again = _trainer(test_model, tmp_path / "t1", broker, "hostile-1", keys)
    try:
        more = [(t, k, v, None) for t, k, v in events_for(served[2:4], lambda o: "reject", prefix="more")]
        _send(broker, more)
        _ingest_until(again, lambda: again.joiner.stats.joined == 4, "new events after a restart")
        assert not any(_counted(again.metrics.registry, "flywheel_trainer", want).values())
    finally:
        again.reader.close()

    # A trainer started anew reads the compacted tenants topic (and every other) from its start: the bad
    # policy records are still there; it refuses them again and goes on.
    fresh = _trainer(test_model, tmp_path / "t2", broker, "hostile-2", keys)
    try:
        _ingest_until(fresh, lambda: fresh.joiner.stats.joined == 4, "every good event, read from the start")
        assert _counted(fresh.metrics.registry, "flywheel_trainer", want) == dict(want)
        assert set(fresh.privacy.policies) == set()  # no hostile record became a tenant's policy
    finally:
        fresh.reader.close()


def _agent(keys, test_model, work, bootstrap: str):
    from weight_sync.agent.loop import Agent, AgentConfig

    return Agent(
        AgentConfig(
            name="hostile",
            replica_url="http://127.0.0.1:9",  # no replica: what is tested here is the topic, not the switch
            store_url=str(work / "no-store"),
            public_key=keys["pub"],
            work_dir=work,
            initial_model=test_model,
            kafka_bootstrap=bootstrap,
            inplace=False,
        )
    )


def _run(agent) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


def test_a_weight_agent_counts_dead_letters_and_passes_hostile_records_and_restarts_past_them(
    broker, keys, test_model, tmp_path
):
    from kafka import KafkaConsumer, TopicPartition

    # The weights topic of this module's broker: a pin of the version the agent serves comes after the hostile
    # records (it changes nothing to switch, and says the agent read and acted on what followed them).
    _send(broker, [*hostile_records.weights(keys["key"], keys["other"]), (ev.TOPIC_WEIGHTS, "weights", b"")])
    _send(broker, [(ev.TOPIC_WEIGHTS, "weights", _signed(keys, "pin", 0))])
    hostile = _refused_weights(broker, keys)
    want = _expected(hostile)
    agent = _agent(keys, test_model, tmp_path / "agent", broker)
    stop, thread = _run(agent)
    try:
        wait_until(lambda: agent.metrics.pinned._value.get() == 1, 60, what="the pin after the hostile records")
        wait_until(
            lambda: _counted(agent.metrics.registry, "flywheel_agent", want) == dict(want),
            30,
            what="every hostile record counted",
        )
        _wait_dead_lettered(broker, "agent-hostile", hostile)
        # Committed past them: the agent's group offset is the end of the topic.
        c = KafkaConsumer(
            bootstrap_servers=broker,
            **kafka_auth.client_config(),
            group_id="flywheel-agent-hostile",
            enable_auto_commit=False,
        )
        tp = TopicPartition(ev.TOPIC_WEIGHTS, 0)
        end = c.end_offsets([tp])[tp]
        wait_until(lambda: c.committed(tp) == end, 30, what="the offset committed past the hostile records")
        c.close()
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(timeout=30)
    # Restarted: it starts from its committed offset, refuses nothing again, and still follows the topic.
    again = _agent(keys, test_model, tmp_path / "agent", broker)
    stop, thread = _run(again)
    try:
        _send(broker, [(ev.TOPIC_WEIGHTS, "weights", _signed(keys, "unpin", None))])
        wait_until(lambda: again.metrics.pinned._value.get() == 0, 60, what="the unpin after a restart")
        assert not any(_counted(again.metrics.registry, "flywheel_agent", want).values())
    finally:
        stop.set()
        thread.join(timeout=30)


def test_the_canary_controller_counts_dead_letters_and_passes_hostile_records_and_restarts_past_them(
    broker, keys, tmp_path
):
    from weight_sync.canary.controller import CanaryConfig, CanaryController
    from weight_sync.publish import PublishConfig

    cfg = CanaryConfig(
        gateway_url="http://127.0.0.1:9",  # no gateway: the trial cannot run, and is rolled back after its tries
        admin_token="t",
        publish=PublishConfig(store=keys["store"], private_key=keys["pem"], kafka_bootstrap=broker),
        poll_s=0.2,
    )
    v = 4242
    # Every record on the topic that is refused is counted: this test's and those the module's other tests left.
    hostile = hostile_records.weights(keys["key"], keys["other"])
    _send(broker, [*hostile, (ev.TOPIC_WEIGHTS, "weights", _signed(keys, "version", v, canary=True))])
    refused = _refused_weights(broker, keys)
    want = _expected(refused)
    assert want[(ev.TOPIC_WEIGHTS, "invalid")] >= 1 and sum(want.values()) >= len(hostile)

    ctrl = CanaryController(cfg).start()
    try:
        # It reads past the hostile records to the candidate, tries its trial (the gateway is away), and rolls
        # it back after MAX_TRIAL_ATTEMPTS: a decision on the topic, the controller alive throughout.
        wait_until(lambda: any(d["version"] == v for d in ctrl.decisions), 120, what=f"a decision on v{v}")
        assert next(d for d in ctrl.decisions if d["version"] == v)["type"] == "rollback"
        assert _counted(ctrl.registry, "flywheel_canary", want) == dict(want)
        _wait_dead_lettered(broker, "canary", refused)
        assert ctrl._thread.is_alive()
    finally:
        ctrl.stop()
    # Restarted, it reads the whole topic again: the hostile records are refused again (never acted on), and
    # the candidate, decided, is not trialled again.
    again = CanaryController(cfg).start()
    try:
        wait_until(
            lambda: _counted(again.registry, "flywheel_canary", want) == dict(want), 60, what="the topic read again"
        )
        time.sleep(2)
        assert again.decisions == [] and again._thread.is_alive()
    finally:
        again.stop()
