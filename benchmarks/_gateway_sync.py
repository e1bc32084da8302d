"""benchmarks.gateway's sync part (`python -m benchmarks.gateway --sync-only`): the spool's sync window under the
benchmark fleet's load, before and after the request path enforced it (#52), side by side in one run.

The same replicas and broker as benchmarks.gateway, and three gateways in front of them: this tree's (the default
window, 10 ms), the same gateway from the commit `--before` (this repository's tree at that commit, `git archive`d
and run in its place: the writer thread alone), and one with `--no-events`. Paired load rounds
(benchmarks._load_rounds) load each in turn; then each logging gateway's /health and /metrics give the longest
lag of an answered record, the lag histogram, the syncs (and those the request path ran), and the gateway's CPU per
request says what enforcing the window cost its event loop. Prints one JSON object as the last line."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from benchmarks import _gateway_probes as probes, _load_rounds as load_rounds
from flywheel.kafka import broker as kafka_broker
from infra.paths import REPO_ROOT
from online_rl.model.bootstrap import bootstrap
from online_rl.tasks import synthetic as tasks
from serving import gateway_process
from serving.replica.process import ReplicaConfig, start as start_replica

BEFORE = "aa45581"  # the last commit before the request path enforced the window


def _tree_at(commit: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=REPO_ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run(
    load: Callable[[str, list[str], float], Awaitable[int]],
    key: str,
    replicas_n: int,
    replica_threads: int,
    rounds: int,
    round_s: float,
    slices: int,
    before: str,
) -> dict:
    """`load(url, prompts, seconds)`: benchmarks.gateway's concurrent load on one gateway (requests served), its
    requests authorized by `key`."""
    model = bootstrap("test", 0, progress=False)
    prompts = [t.prompt for t in tasks.tasks("heldout")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-sync-"))
    started: list = []
    try:
        old_tree = _tree_at(before, tmp / "before-tree")
        broker = kafka_broker.start(kafka_broker.BrokerConfig(data_dir=tmp / "kafka"))
        started.append(broker)
        replicas = []
        for i in range(replicas_n):
            cfg = ReplicaConfig(model_path=model, log_dir=tmp / f"logs-{i}", threads=replica_threads)
            replicas.append(start_replica(cfg))
            started.append(replicas[-1])
        urls_r = [r.url for r in replicas]
        gw: dict = {}  # each stopped by the finally below as soon as it is up, should a later one fail to start
        gw["window"] = gateway_process.start(urls_r, model, tmp / "gw-window", kafka=broker.bootstrap, keys={"b": key})
        started.append(gw["window"])
        # the old tree first on the path: PYTHONSAFEPATH keeps `-m` from putting the working directory before it
        gw["window_before"] = gateway_process.start(
            urls_r,
            model,
            tmp / "gw-before",
            kafka=broker.bootstrap,
            keys={"b": key},
            env={"PYTHONPATH": str(old_tree), "PYTHONSAFEPATH": "1"},
        )
        started.append(gw["window_before"])
        gw["off"] = gateway_process.start(urls_r, model, tmp / "gw-off", keys={"b": key}, extra_args=["--no-events"])
        started.append(gw["off"])
        if "syncs_on_request_path" in probes.durability(gw["window_before"].url):
            raise RuntimeError(f"the gateway from {before} runs this tree's code, not its own")
        shared = {f"replica_{i}": (r.pid, "tree") for i, r in enumerate(replicas)}
        shared |= {"kafka": (broker.pid, "tree"), "client": (os.getpid(), "proc")}
        parts = {
            name: {"gateway_loop": (g.pid, "main"), "gateway_threads": (g.pid, "threads"), **shared}
            | ({"shipper": (g.pid, "mp_children")} if name != "off" else {})
            for name, g in gw.items()
        }
        for g in gw.values():  # warm-up: first connections, the replicas' first batches
            asyncio.run(load(g.url, prompts, 1.0))
        res = load_rounds.run(
            parts,
            lambda name, secs: asyncio.run(load(gw[name].url, prompts, secs)),
            rounds,
            round_s,
            settle_s=0.6,
            slices=slices,
        )
        durability = {name: probes.durability(gw[name].url) for name in ("window", "window_before")}
        out: dict = {"window_s": durability["window"]["sync_window_s"]}
        for name, d in durability.items():
            out[name] = {
                "sync_lag_max_ms": round(1000 * d["sync_lag_max_s"], 2),
                "syncs": d["syncs"],
                "syncs_over_window": d["syncs_over_window"],
                "syncs_on_request_path": d.get("syncs_on_request_path", 0),
                "answered_past_window": d.get("answered_past_window"),  # None: not counted before #52
                "sync_lag_buckets": d["sync_lag_buckets"],  # cumulative: syncs with a lag <= each bound
                "throughput_ratio_vs_off": res.summary(name, "off"),
                "throughput_rps": [round(c / round_s, 1) for c in res.counts[name]],
            }
        out["off"] = {"throughput_rps": [round(c / round_s, 1) for c in res.counts["off"]]}
        cpu = {name: res.cpu_ms_per_request(name) for name in gw}
        out["gateway_loop_cpu_ms_per_request"] = {name: c["gateway_loop"] for name, c in cpu.items()}
        out["gateway_threads_cpu_ms_per_request"] = {name: c["gateway_threads"] for name, c in cpu.items()}
        out["busy_cores"] = {
            name: round(cpu[name]["total"] * sum(res.counts[name]) / (rounds * round_s) / 1000, 2) for name in gw
        }
        out["setup"] = {
            "rounds": rounds,
            "round_s": round_s,
            "slices": slices,
            "replicas": replicas_n,
            "before": before,
        }
        return out
    finally:
        for thing in reversed(started):
            thing.stop()
        shutil.rmtree(tmp, ignore_errors=True)
