"""`flywheel demo`: the main job on the embedded default.

Today (foundation + gateway): build or reuse the demo model; start a local Kafka broker, one SGLang
replica on CPU and the gateway (`flywheel serve`); a small simulated IDE user asks the gateway for
completions of held-out coding tasks through the official openai client, judges each one by running
its hidden tests in the sandbox and sends accept/reject feedback; the completion and feedback events
are then read back from Kafka. Everything started here is stopped here, by PID.
"""
from __future__ import annotations

import argparse
import json
import random
import secrets
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path


@dataclass
class DemoConfig:
    preset: str = "demo"
    seed: int = 0
    out_dir: Path = Path("demo_out")
    tasks: int = 24
    temperature: float = 1.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the whole loop on this machine (see README)")
    p.add_argument("--preset", default=DemoConfig.preset, choices=["test", "demo"])
    p.add_argument("--seed", type=int, default=DemoConfig.seed)
    p.add_argument("--out-dir", type=Path, default=DemoConfig.out_dir)
    p.add_argument("--tasks", type=int, default=DemoConfig.tasks)
    p.set_defaults(func=lambda a: run(DemoConfig(a.preset, a.seed, a.out_dir, a.tasks)))


def _health(url: str) -> dict:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())


def _count_events(bootstrap: str, want: set[str], timeout_s: float = 30.0) -> dict[str, int]:
    from kafka import KafkaConsumer

    from flywheel import events as ev
    from flywheel.kafka_broker import quiet_kafka

    seen: dict[str, set] = {ev.TOPIC_COMPLETIONS: set(), ev.TOPIC_FEEDBACK: set()}
    deadline = time.monotonic() + timeout_s
    with quiet_kafka():  # a short-lived consumer: its rebalance chatter is noise here
        consumer = KafkaConsumer(ev.TOPIC_COMPLETIONS, ev.TOPIC_FEEDBACK, bootstrap_servers=bootstrap,
                                 group_id=f"demo-{uuid.uuid4().hex[:6]}", auto_offset_reset="earliest",
                                 enable_auto_commit=False)
        try:
            while time.monotonic() < deadline and not (want <= seen[ev.TOPIC_COMPLETIONS]
                                                       and want <= seen[ev.TOPIC_FEEDBACK]):
                for recs in consumer.poll(timeout_ms=500).values():
                    for r in recs:
                        seen[r.topic].add(ev.decode(r.value).completion_id)
        finally:
            consumer.close()
    return {topic: len(ids & want) for topic, ids in seen.items()}


def run(cfg: DemoConfig) -> int:
    import openai

    from flywheel import kafka_broker
    from online_rl import sandbox, tasks
    from online_rl.bootstrap import bootstrap, report
    from serving import gateway_process
    from serving.replica import ReplicaConfig
    from serving.replica import start as start_replica

    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    model = bootstrap(cfg.preset, cfg.seed)
    base = report(model)
    print(f"model   {model}  ({base['parameters']:,} parameters; held-out pass rate "
          f"greedy {base['eval']['pass_rate_greedy']:.0%}, temperature 1 {base['eval']['pass_rate_t1']:.0%})")
    started = []
    key = "fw-demo-" + secrets.token_hex(8)
    try:
        t = time.monotonic()
        broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=cfg.out_dir / "kafka"))
        started.append(broker)
        print(f"kafka   {broker.bootstrap}  (pid {broker.pid}, ready in {time.monotonic() - t:.1f}s)")
        t = time.monotonic()
        replica = start_replica(ReplicaConfig(model_path=model, log_dir=cfg.out_dir / "logs"))
        started.append(replica)
        print(f"sglang  {replica.url}  (pid {replica.pid}, ready in {time.monotonic() - t:.1f}s)")
        gw = gateway_process.start([replica.url], model, cfg.out_dir / "gateway", kafka=broker.bootstrap,
                                   keys={"demo-user": key})
        started.append(gw)
        print(f"gateway {gw.url}  (pid {gw.pid}; OpenAI API at {gw.url}/v1)\n")

        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
        issued, accepted = set(), 0
        held = tasks.tasks("heldout", cfg.seed)
        for task in random.Random(cfg.seed).sample(held, min(cfg.tasks, len(held))):
            r = client.completions.create(model="flywheel-coder", prompt=task.prompt, max_tokens=40,
                                          temperature=cfg.temperature)
            verdict = sandbox.run([sandbox.candidate_for(task, r.choices[0].text)])[0]
            kind = "accept" if verdict.ok else "reject"
            accepted += verdict.ok
            issued.add(r.id)
            req = urllib.request.Request(f"{gw.url}/v1/feedback", headers={"Authorization": f"Bearer {key}"},
                                         data=json.dumps({"completion_id": r.id, "kind": kind}).encode())
            urllib.request.urlopen(req, timeout=30).close()
            body = r.choices[0].text.strip().replace("\n", " | ")
            print(f"{kind:6s} {task.task_id:24s} v{r.model_extra['model_version']}  {body[:70]}")
        print(f"\nacceptance {accepted}/{len(issued)} = {accepted / max(1, len(issued)):.0%} "
              f"(temperature {cfg.temperature})")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _health(gw.url)["spool_pending_bytes"] > 0:
            time.sleep(0.5)
        counts = _count_events(broker.bootstrap, issued)
        print(f"kafka   {counts['completions']}/{len(issued)} completion events, "
              f"{counts['feedback']}/{len(issued)} feedback events read back")
    finally:
        for thing in reversed(started):
            thing.stop()
    print(f"demo finished in {time.monotonic() - t0:.0f}s; gateway, replica and broker stopped")
    return 0
