"""The trainer against a real broker (one of this module's own): it learns a preference from feedback events,
survives kill -9 without training a sample twice or skipping one, hands each version to weight_sync, and joins
windows and duplicates as they come from the broker. (The update and the checkpoints on their own:
tests/integration/online_rl/trainer/test_trainer_update.py.)
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from flywheel.kafka import broker as kafka_broker
from infra import kafka_auth
from infra.paths import REPO_ROOT
from online_rl.config import LossConfig, OptimConfig, PublisherConfig, TrainerConfig
from online_rl.data.simulate import events_for, heldout_split, produce, sample_completions
from online_rl.model.transformer import load_pretrained
from online_rl.trainer.loop import Trainer

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A broker of this module's own: the trainer reads its topics from the beginning."""
    b = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp_path_factory.mktemp("kafka")))
    try:
        yield b
    finally:
        assert b.stop()


def _tok(model_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def prefers_plus(tok):
    """The hidden preference: the user accepts code that uses the + operator."""
    return lambda out: "accept" if "+" in tok.decode(out) else "reject"


def acceptance(model, tok, eval_tasks, seed: int) -> float:
    judge = prefers_plus(tok)
    s = sample_completions(model, tok, eval_tasks, 4, torch.Generator().manual_seed(seed))
    return float(np.mean([judge(o) == "accept" for _, o, _, _ in s]))


def test_feedback_events_teach_a_hidden_preference(broker, test_model, tmp_path):
    tok = _tok(test_model)
    train_tasks, eval_tasks = heldout_split()
    cfg = TrainerConfig(
        model_dir=test_model,
        work_dir=tmp_path / "trainer",
        kafka_bootstrap=broker.bootstrap,
        group_id="learn",
        batch_size=32,
        min_batch=1,
        loss=LossConfig(kl_coef=0.0),
        optim=OptimConfig(lr=6e-4),
    )
    trainer = Trainer(cfg)
    before = acceptance(trainer.model, tok, eval_tasks, seed=100)
    gen = torch.Generator().manual_seed(0)
    produced = 0
    for rnd in range(3):  # on-policy rounds: users see the trainer's newest weights
        # 3 a task: a model built on another CPU answers some prompts with nothing (no sample) more often than
        # the one this was first written on (178 samples of 360 at 2 a task, on an AMD EPYC's AVX-512)
        samples = sample_completions(trainer.model, tok, train_tasks, 3, gen)
        produce(broker.bootstrap, events_for(samples, prefers_plus(tok), prefix=f"r{rnd}"))
        produced += len(samples)
        deadline = time.monotonic() + 60
        while trainer.joiner.stats.joined < produced and time.monotonic() < deadline:
            trainer.ingest()
        while trainer.buffer:
            trainer.train_step(force=True)
        trainer.save()
    after = acceptance(trainer.model, tok, eval_tasks, seed=100)
    assert trainer.joiner.stats.joined == produced >= 200
    assert after - before >= 0.2, f"acceptance of the preference {before:.2f} -> {after:.2f}"
    assert (tmp_path / "trainer" / "ledger").exists()


def _start_group_at_the_end(bootstrap: str, group: str) -> None:
    """Commit `group`'s offsets at the ends of the event topics, so a trainer of that group reads only what
    comes next (the tenants topic stays unread: a trainer reads the policies from their start)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    from contracts import events as ev

    c = KafkaConsumer(
        bootstrap_servers=bootstrap, **kafka_auth.client_config(), group_id=group, enable_auto_commit=False
    )
    try:
        topics = (ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK)
        parts = [TopicPartition(t, p) for t in topics for p in sorted(c.partitions_for_topic(t))]
        c.commit({tp: OffsetAndMetadata(end, "", -1) for tp, end in c.end_offsets(parts).items()})
    finally:
        c.close()


def _ledger_keys(work: Path, prefix: str) -> list[str]:
    """Keys of the samples the trainer's committed checkpoints trained whose key starts with `prefix` (the
    test's own; its consumer group starts after the events the module's other tests left on its broker)."""
    keys = []
    for f in sorted((work / "ledger").glob("step-*.json")):
        keys += [e["key"] for e in json.loads(f.read_text()) if e["key"].startswith(prefix)]
    return keys


def _ranks(pid: int) -> list[int]:
    """The trainer's rank processes (torch.multiprocessing.spawn's children of `pid`)."""
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(int(child))
        except OSError:
            pass
    return out


def _kill(proc: subprocess.Popen, mode: str, rng: random.Random) -> bool:
    """dp: kill -9 the trainer. fsdp: kill -9 one of its 2 ranks (mid-step, mid-save, mid-start-up), and
    the run must end by itself: a rank that dies takes the others down, none is left waiting. True when
    one rank was killed (fsdp, once its ranks were up)."""
    one_rank = mode == "fsdp" and bool(ranks := _ranks(proc.pid))
    if one_rank:
        os.kill(rng.choice(ranks), signal.SIGKILL)
        try:
            assert proc.wait(timeout=120) != 0
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return one_rank


@pytest.mark.parametrize("mode", ["dp", "fsdp"])
def test_kill_9_at_any_moment_trains_every_sample_exactly_once(broker, test_model, tmp_path, mode):
    tok = _tok(test_model)
    model = load_pretrained(test_model)
    train_tasks, _ = heldout_split(n_train=80)
    samples = sample_completions(model, tok, train_tasks, 3, torch.Generator().manual_seed(1), max_tokens=12)
    prefix = f"k9{mode}"
    records = events_for(samples, lambda o: random.Random(len(o)).choice(["accept", "reject"]), prefix=prefix)
    records += records[:40]  # re-delivered events (same event ids): must not train twice
    group = f"exactly-once-{mode}"
    _start_group_at_the_end(broker.bootstrap, group)  # not the module's other tests' events: only these
    produce(broker.bootstrap, records)
    expected = {f"{prefix}-{i}:0" for i in range(len(samples))}
    work = tmp_path / "trainer"
    cmd = [
        sys.executable,
        "-m",
        "flywheel",
        "train",
        "--model",
        str(test_model),
        "--work-dir",
        str(work),
        "--kafka",
        broker.bootstrap,
        "--batch-size",
        "8",
        "--min-batch",
        "1",
        "--checkpoint-every",
        "2",
        "--lr",
        "1e-4",
        "--group-id",
        group,
    ] + (["--nproc", "2", "--shard", "fsdp"] if mode == "fsdp" else [])
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    rng = random.Random(7)
    kills = rank_kills = 0
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        if kills < 4:
            # somewhere in start-up, ingest, update or save (2 ranks start in about twice the time)
            time.sleep(rng.uniform(4.0, 9.0) * (2 if mode == "fsdp" else 1))
            rank_kills += _kill(proc, mode, rng)
            kills += 1
            if kills == 2:
                trained_by_then = len(set(_ledger_keys(work, prefix + "-")))
            continue
        while time.monotonic() < deadline and set(_ledger_keys(work, prefix + "-")) != expected:
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        break
    keys = _ledger_keys(work, prefix + "-")
    assert kills == 4
    print(f"{mode}: {trained_by_then} of {len(expected)} samples trained when the 2nd kill came")
    assert trained_by_then < len(expected), "the kills came after the work was done"
    assert mode == "dp" or rank_kills >= 2, f"only {rank_kills} of the kills hit one rank"
    assert len(keys) == len(set(keys)), "a sample was trained twice"
    assert set(keys) == expected, f"{len(expected - set(keys))} samples never trained"


def test_publish_hands_a_delta_to_weight_sync(broker, test_model, tmp_path):
    import asyncio

    import aiohttp
    from safetensors.torch import load_file

    from tests.helpers import STORE_TOKEN, store_server
    from weight_sync.agent.fetch import StoreClient
    from weight_sync.agent.loop import Agent, AgentConfig
    from weight_sync.manifest import generate_key
    from weight_sync.store.server import Store

    generate_key(tmp_path / "k.pem", tmp_path / "k.pub")
    cfg = TrainerConfig(
        model_dir=test_model,
        work_dir=tmp_path / "trainer",
        kafka_bootstrap=broker.bootstrap,
        group_id="publish",
        min_batch=1,
        publish=PublisherConfig(store=tmp_path / "store", key=tmp_path / "k.pem"),
        optim=OptimConfig(lr=1e-3),
    )
    trainer = Trainer(cfg)
    tok = _tok(test_model)
    samples = sample_completions(trainer.model, tok, heldout_split()[0][:10], 2, torch.Generator().manual_seed(5))
    produce(broker.bootstrap, events_for(samples, prefers_plus(tok), prefix="pub"))
    deadline = time.monotonic() + 60
    while trainer.joiner.stats.joined < len(samples) and time.monotonic() < deadline:
        trainer.ingest()
    assert trainer.train_step(force=True) is not None
    assert trainer.publish() == 1
    store = Store(tmp_path / "store")
    assert store.versions() == [0, 1] and store.manifest(1).kind == "delta" and store.manifest(1).base_version == 0
    history = json.loads((tmp_path / "trainer" / "history.json").read_text())  # for the plot, drawn elsewhere
    assert history == trainer.history and sum(h["n"] for h in history.values()) >= 1  # the shared broker adds more
    from online_rl.plots import reward_by_version

    assert reward_by_version(tmp_path / "trainer" / "history.json", tmp_path / "r.png").stat().st_size > 5_000
    assert store.announced() == 1 and store.unannounced() == []

    # Killed between committing v2 and announcing it: the next trainer announces v2 before anything else.
    from contracts import control
    from contracts.events import TOPIC_WEIGHTS
    from infra.kafka_admin import records_to_end
    from weight_sync.manifest import load_private
    from weight_sync.publish import publish

    publish(test_model, trainer.publisher._config(), announce_now=False)
    assert store.unannounced() == [2]
    again = Trainer(cfg)
    assert [r["version"] for r in again.publisher.pending] == [2]
    assert again.publisher.announce() and store.announced() == 2 and store.unannounced() == []
    pub = load_private(tmp_path / "k.pem").public_key()
    announced = []
    for m in records_to_end(broker.bootstrap, TOPIC_WEIGHTS):  # announce() returned: acknowledged, so there
        try:
            r = control.decode(m.value, pub)
        except control.ControlError:  # other tests' records on the shared broker, signed by other keys
            continue
        if r["type"] == "version":
            announced.append(r["version"])
    assert announced[-3:] == [0, 1, 2]

    with store_server(tmp_path / "store") as url:
        agent = Agent(
            AgentConfig(
                name="a",
                replica_url="http://unused",
                store_url=url,
                public_key=tmp_path / "k.pub",
                work_dir=tmp_path / "agent",
                initial_model=test_model,
                store_token=STORE_TOKEN,
            )
        )

        async def rebuild():
            async with aiohttp.ClientSession() as s:
                return await agent.materialize(StoreClient(url, s, tmp_path / "dl", token=STORE_TOKEN), 1)

        path = asyncio.run(rebuild())
    rebuilt = load_file(str(path / "model.safetensors"))
    for name, p in trainer.model.state_dict().items():
        assert torch.equal(rebuilt[name].view(torch.int16), p.detach().to(torch.bfloat16).view(torch.int16)), name


def test_join_windows_and_duplicates_against_the_broker(broker, test_model, tmp_path):
    from contracts import events as ev

    tok = _tok(test_model)
    model = load_pretrained(test_model)
    raw = sample_completions(model, tok, heldout_split()[0][:3], 2, torch.Generator().manual_seed(9))
    recs = events_for(raw, lambda o: "accept", prefix="win")
    completions = [r for r in recs if r[0] == ev.TOPIC_COMPLETIONS]
    feedbacks = [r for r in recs if r[0] == ev.TOPIC_FEEDBACK]
    # 2 completions never get feedback; 1 feedback names a completion that never existed; 3 records twice.
    orphan = ev.FeedbackEvent(completion_id="win-ghost", choice_index=0, tenant="t", kind="accept")
    produce(
        broker.bootstrap,
        completions + feedbacks[2:] + feedbacks[2:5] + [(ev.TOPIC_FEEDBACK, "win-ghost", orphan.encode())],
    )
    from online_rl.config import JoinConfig

    trainer = Trainer(
        TrainerConfig(
            model_dir=test_model,
            work_dir=tmp_path / "t",
            kafka_bootstrap=broker.bootstrap,
            group_id="windows",
            join=JoinConfig(window_s=1.0, orphan_wait_s=1.0),
        )
    )
    deadline = time.monotonic() + 30  # the first ingest connects
    while time.monotonic() < deadline:
        trainer.ingest()
        s = trainer.joiner.stats
        if s.no_signal >= 2 and s.orphan_feedback >= 1:
            break
    s = trainer.joiner.stats
    mine = [x for x in trainer.buffer if x.key.startswith("win-")]
    assert len(mine) == len(raw) - 2 and s.duplicates >= 3
    assert s.no_signal >= 2 and s.orphan_feedback >= 1
