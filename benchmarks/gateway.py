"""Gateway overhead, side by side in one run: straight to the replica vs through the gateway, logging on vs off,
and vs a proxy that only forwards bytes (the floor of any extra HTTP hop on this machine).

One SGLang replica (test-preset model), a real Kafka broker, and two gateway processes in front of the
same replica: one logging every event to Kafka, one with `--no-events`. Latency: sequential requests,
interleaved across the three paths so that machine noise hits all of them alike, greedy with the same
token budget (the same engine work). Throughput: concurrent load in alternating rounds on the two
gateways. Prints one JSON object as the last line.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import aiohttp
import numpy as np

from flywheel import kafka_broker
from flywheel.core.procs import free_port, stop_pid, wait_until
from online_rl import tasks
from online_rl.bootstrap import bootstrap
from serving import gateway_process
from serving.replica import ReplicaConfig, start as start_replica

KEY = "bench-key"
MAX_TOKENS = 8  # throughput rounds
LATENCY_MAX_TOKENS = 1  # latency rounds: the overhead is per request, and a short engine call is less noisy
ROUNDS = 300  # sequential requests per path
CONCURRENCY = 16
LOAD_ROUND_S = 5.0
LOAD_ROUNDS = 6  # per gateway, alternating


def _pct(xs: list[float], q: float) -> float:
    return round(float(np.percentile(xs, q)), 2)


async def _direct(s: aiohttp.ClientSession, url: str, ids: list[int], stop_ids: list[int], max_tokens: int) -> None:
    body = {
        "input_ids": ids,
        "sampling_params": {
            "max_new_tokens": max_tokens,
            "temperature": 0.0,
            "stop_token_ids": stop_ids,
            "ignore_eos": True,
        },
        "return_logprob": True,
        "logprob_start_len": -1,
        "return_routed_experts": True,
    }
    async with s.post(f"{url}/generate", json=body) as r:
        assert r.status == 200, await r.text()
        await r.read()


async def _via_gateway(s: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int = MAX_TOKENS) -> None:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    async with s.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status == 200, await r.text()
        await r.read()


async def _latency(
    replica_url: str, proxy_url: str, gw_on: str, gw_off: str, prompts: list[str], tok, stop_ids
) -> dict:
    lat = {"direct": [], "null_proxy": [], "gateway_logging_on": [], "gateway_logging_off": []}
    async with aiohttp.ClientSession() as s:
        for i in range(ROUNDS + 10):
            p = prompts[i % len(prompts)]
            ids = tok.encode(p).ids
            n = LATENCY_MAX_TOKENS
            order = [
                ("direct", partial(_direct, s, replica_url, ids, stop_ids, n)),
                ("null_proxy", partial(_direct, s, proxy_url, ids, stop_ids, n)),
                ("gateway_logging_on", partial(_via_gateway, s, gw_on, p, n)),
                ("gateway_logging_off", partial(_via_gateway, s, gw_off, p, n)),
            ]
            for name, call in order[i % 4 :] + order[: i % 4]:  # rotate who goes first
                t = time.perf_counter()
                await call()
                if i >= 10:  # warm-up
                    lat[name].append(1000 * (time.perf_counter() - t))
    return lat


async def _load(url: str, prompts: list[str], seconds: float) -> int:
    done = 0
    stop_at = time.monotonic() + seconds

    async with aiohttp.ClientSession() as s:

        async def worker(w: int):
            nonlocal done
            i = w
            while time.monotonic() < stop_at:
                await _via_gateway(s, url, prompts[i % len(prompts)])
                done += 1
                i += CONCURRENCY

        await asyncio.gather(*(worker(w) for w in range(CONCURRENCY)))
    return done


class _Proc:
    def __init__(self, popen):
        self.popen = popen

    def stop(self):
        return stop_pid(self.popen.pid)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def main() -> dict:
    from tokenizers import Tokenizer

    model = bootstrap("test", 0, progress=False)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    stop_ids = [tok.token_to_id(t) for t in ("<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")]
    prompts = [t.prompt for t in tasks.tasks("heldout")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    started = []
    try:
        broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp / "kafka"))
        started.append(broker)
        replica = start_replica(ReplicaConfig(model_path=model, log_dir=tmp / "logs"))
        started.append(replica)
        on = gateway_process.start([replica.url], model, tmp / "gw-on", kafka=broker.bootstrap, keys={"b": KEY})
        started.append(on)
        off = gateway_process.start([replica.url], model, tmp / "gw-off", keys={"b": KEY}, extra_args=["--no-events"])
        started.append(off)

        proxy_port = free_port()
        proxy = subprocess.Popen([sys.executable, "-m", "benchmarks._null_proxy", replica.url, str(proxy_port)])
        started.append(_Proc(proxy))
        wait_until(lambda: _port_open(proxy_port), 30, what="null proxy")
        lat = asyncio.run(
            _latency(replica.url, f"http://127.0.0.1:{proxy_port}", on.url, off.url, prompts, tok, stop_ids)
        )
        counts = {"on": 0, "off": 0}
        for r in range(LOAD_ROUNDS):
            for name, url in (("on", on.url), ("off", off.url)) if r % 2 == 0 else (("off", off.url), ("on", on.url)):
                counts[name] += asyncio.run(_load(url, prompts, LOAD_ROUND_S))
        seconds = LOAD_ROUNDS * LOAD_ROUND_S
        direct_p50, direct_p99 = _pct(lat["direct"], 50), _pct(lat["direct"], 99)
        # Paired by round (same prompt, positions rotated): the median of per-round differences.
        paired = lambda name: round(float(np.median(np.subtract(lat[name], lat["direct"]))), 2)  # noqa: E731
        result = {
            "added_p50_ms": round(_pct(lat["gateway_logging_on"], 50) - direct_p50, 2),
            "added_p99_ms": round(_pct(lat["gateway_logging_on"], 99) - direct_p99, 2),
            "added_p50_ms_logging_off": round(_pct(lat["gateway_logging_off"], 50) - direct_p50, 2),
            "added_median_paired_ms": paired("gateway_logging_on"),
            "added_median_paired_ms_logging_off": paired("gateway_logging_off"),
            "hop_floor_paired_ms": paired("null_proxy"),  # any HTTP hop on this machine, doing nothing
            "throughput_ratio_logging_on_vs_off": round(counts["on"] / max(1, counts["off"]), 3),
            "latency_ms": {k: {"p50": _pct(v, 50), "p99": _pct(v, 99), "n": len(v)} for k, v in lat.items()},
            "throughput_rps": {
                "logging_on": round(counts["on"] / seconds, 1),
                "logging_off": round(counts["off"] / seconds, 1),
            },
            "setup": {
                "max_tokens": MAX_TOKENS,
                "latency_max_tokens": LATENCY_MAX_TOKENS,
                "concurrency": CONCURRENCY,
                "model": "test preset",
                "load_seconds_per_gateway": seconds,
            },
        }
        result["targets_met"] = {
            "added_p50_le_1ms": result["added_p50_ms"] <= 1.0,
            "logging_costs_le_5pct": result["throughput_ratio_logging_on_vs_off"] >= 0.95,
        }
        return result
    finally:
        for thing in reversed(started):
            thing.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(main()))
