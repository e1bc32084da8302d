"""Foundation figures: model bootstrap, broker and replica start-up, replica throughput and memory, cache size.

Prints one JSON object as its last line. Throughput is measured against the demo-preset model with
/generate at several concurrencies in one run (ratios side by side on the same noisy machine).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp

from flywheel.kafka import broker as kafka_broker
from infra.paths import flywheel_home
from online_rl.model import bootstrap as B
from online_rl.tasks import synthetic as tasks
from serving.replica.process import ReplicaConfig, start as start_replica


def _du_mb(path: Path) -> float:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()
    return round(int(out[0]) / 2**20, 1) if out else 0.0


def _tree_rss_gb(pid: int) -> float:
    import psutil

    p = psutil.Process(pid)
    procs = [p, *p.children(recursive=True)]
    return round(sum(q.memory_full_info().pss for q in procs) / 2**30, 2)


async def _load(url: str, prompts: list[str], concurrency: int, max_new_tokens: int = 32) -> dict:
    sem = asyncio.Semaphore(concurrency)
    latencies, tokens = [], 0

    async with aiohttp.ClientSession() as s:

        async def one(p: str):
            nonlocal tokens
            async with sem:
                t = time.monotonic()
                async with s.post(
                    f"{url}/generate",
                    json={
                        "text": p,
                        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0, "ignore_eos": True},
                        "return_logprob": True,
                        "return_routed_experts": True,
                    },
                ) as r:
                    body = await r.json()
                latencies.append(time.monotonic() - t)
                tokens += body["meta_info"]["completion_tokens"]

        t0 = time.monotonic()
        await asyncio.gather(*(one(p) for p in prompts))
        wall = time.monotonic() - t0
    latencies.sort()
    return {
        "tokens_per_s": round(tokens / wall, 1),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 1),
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99) - 1], 1),
    }


def main() -> dict:
    result: dict = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-foundation-"))
    try:
        t = time.monotonic()
        B.build(B.preset("test"), tmp / "test-model", progress=False)
        result["bootstrap_test_preset_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        demo = B.bootstrap("demo", 0, progress=False)  # builds once per cache, else a lookup
        result["bootstrap_demo_first_call_s"] = round(time.monotonic() - t, 2)
        t = time.monotonic()
        B.bootstrap("demo", 0, progress=False)
        result["bootstrap_demo_cached_s"] = round(time.monotonic() - t, 3)
        rep = B.report(demo)
        result["demo_model"] = {
            "parameters": rep["parameters"],
            "build_s": rep["timings"]["total_s"],
            "train_s": rep["timings"]["train_s"],
            **{k: v for k, v in rep["eval"].items() if k.startswith(("pass_rate", "tool_call_valid_rate"))},
        }

        t = time.monotonic()
        broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp / "kafka"))
        result["broker_start_s"] = round(time.monotonic() - t, 1)
        broker.stop()
        t = time.monotonic()
        broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp / "kafka"))
        result["broker_restart_s"] = round(time.monotonic() - t, 1)
        broker.stop()

        t = time.monotonic()
        replica = start_replica(ReplicaConfig(model_path=demo, log_dir=tmp / "logs"))
        result["replica_start_s"] = round(time.monotonic() - t, 1)
        try:
            time.sleep(3)
            result["replica_idle_pss_gb"] = _tree_rss_gb(replica.pid)
            prompts = [t.prompt for t in tasks.tasks("heldout")]
            asyncio.run(_load(replica.url, prompts[:8], 4))  # warm-up
            result["generate"] = {
                f"c{c}": asyncio.run(_load(replica.url, (prompts * 2)[: 8 * c], c)) for c in (1, 4, 16)
            }
            result["replica_loaded_pss_gb"] = _tree_rss_gb(replica.pid)
        finally:
            replica.stop()
        home = flywheel_home()
        result["cache_mb"] = {
            "venv": _du_mb(home / "venv"),
            "kafka_jars": _du_mb(home / "kafka"),
            "maven_repo": _du_mb(home / "m2"),
            "models": _du_mb(home / "models"),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


if __name__ == "__main__":
    print(json.dumps(main()))
