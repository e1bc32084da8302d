"""`flywheel demo`: the main job on the embedded default.

For now (foundation): build or reuse the demo model, start a local Kafka broker and one SGLang
replica on CPU, complete a few held-out coding tasks through the replica, judge them in the sandbox
and print the completions. Everything started here is stopped here, by PID.
"""
from __future__ import annotations

import argparse
import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass
class DemoConfig:
    preset: str = "demo"
    seed: int = 0
    out_dir: Path = Path("demo_out")
    tasks: int = 4


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the whole loop on this machine (see README)")
    p.add_argument("--preset", default=DemoConfig.preset, choices=["test", "demo"])
    p.add_argument("--seed", type=int, default=DemoConfig.seed)
    p.add_argument("--out-dir", type=Path, default=DemoConfig.out_dir)
    p.add_argument("--tasks", type=int, default=DemoConfig.tasks)
    p.set_defaults(func=lambda a: run(DemoConfig(a.preset, a.seed, a.out_dir, a.tasks)))


def _generate(url: str, text: str, max_new_tokens: int = 40) -> dict:
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
                       "return_logprob": True, "return_routed_experts": True}).encode()
    req = urllib.request.Request(f"{url}/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def run(cfg: DemoConfig) -> int:
    from flywheel import kafka_broker
    from online_rl import sandbox, tasks
    from online_rl.bootstrap import bootstrap, report
    from serving.replica import ReplicaConfig
    from serving.replica import start as start_replica

    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    model = bootstrap(cfg.preset, cfg.seed)
    base = report(model)
    print(f"model  {model}  ({base['parameters']:,} parameters; held-out pass rate "
          f"greedy {base['eval']['pass_rate_greedy']:.0%}, temperature 1 {base['eval']['pass_rate_t1']:.0%})")
    broker = replica = None
    try:
        t = time.monotonic()
        broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=cfg.out_dir / "kafka"))
        print(f"kafka  {broker.bootstrap}  (pid {broker.pid}, ready in {time.monotonic() - t:.1f}s)")
        t = time.monotonic()
        replica = start_replica(ReplicaConfig(model_path=model, log_dir=cfg.out_dir / "logs"))
        print(f"sglang {replica.url}  (pid {replica.pid}, ready in {time.monotonic() - t:.1f}s)")
        for task in tasks.tasks("heldout", cfg.seed)[: cfg.tasks]:
            out = _generate(replica.url, task.prompt)
            verdict = sandbox.run([sandbox.candidate_for(task, out["text"])])[0]
            meta = out["meta_info"]
            print(f"\n--- {task.task_id}: {'PASS' if verdict.ok else 'FAIL'} ({verdict.passed}/{verdict.total} tests), "
                  f"{meta['completion_tokens']} tokens, weight version {meta['weight_version']}")
            print(task.prompt + out["text"])
    finally:
        if replica is not None:
            replica.stop()
        if broker is not None:
            broker.stop()
    print(f"demo finished in {time.monotonic() - t0:.0f}s; broker and replica stopped")
    return 0
