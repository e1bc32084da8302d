"""In-place apply vs a full reload from disk, side by side in one run, on a checkpoint of 1.06 GB of bf16.

One SGLang replica serves the `large` random checkpoint (online_rl.model.random_checkpoint: our Qwen3-MoE shape,
531M parameters). For each share of changed elements (2%, 30%; every tensor moved by 1 ULP at random
positions, as a small optimizer step moves them), a delta is published, and the replica switches to it
in ROUNDS rounds of two switches side by side: by a fresh agent that applies it in place (after warming
the replica's in-place path, as an agent does when it starts), then by one that rebuilds the whole
checkpoint and reloads it from disk (the agent as it was). Switch time: from the agent starting on the
version to the replica answering with it, fetching and rebuilding included (the store on loopback). The
figures: inplace_vs_reload_<share>_median, the median of the rounds' ratios (each round's two switches
close in time, so a burst of load on a shared machine hits both; every round's ratio in
inplace_vs_reload_runs_<share>); inplace_vs_reload_<share>, the ratio of the two medians; the first round's
too. Both ways must then give the same greedy tokens and logprobs. After each switch the replica goes back
to v0 (not timed). inplace_load_avg_1min: the machine's load average when the switches began and ended.
Prints one JSON object as the last line.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from infra.procs import stop_pid
from weight_sync.checkpoint import CheckpointReader, CheckpointWriter

if TYPE_CHECKING:
    from weight_sync.agent.loop import Agent

PROMPT = "def add(a, b):\n"
SHARES = (0.02, 0.30)
ROUNDS = 5  # rounds per share, one switch each way (a fresh agent each): the median is the figure, the first shown


def _perturbed(src: Path, dst: Path, share: float, seed: int) -> Path:
    """A copy of a checkpoint with `share` of every tensor's elements moved by one ULP (tensor at a time)."""
    rng = np.random.default_rng(seed)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and not f.name.startswith("."):
            shutil.copy2(f, dst / f.name)
    with CheckpointReader(src) as r:
        specs = r.specs()
        w = CheckpointWriter(dst / "model.safetensors", [(n, d, s) for n, (d, s) in specs.items()])
        for name in specs:
            bits = r.bits(name).copy()
            idx = np.flatnonzero(rng.random(bits.size) < share)
            zero = (bits[idx] & 0x7FFF) == 0  # +-0.0 minus one ULP is a NaN pattern: those move up only
            bits[idx] += np.where(zero | (rng.random(idx.size) < 0.5), 1, -1).astype(bits.dtype)
            w.write(name, bits)
        w.close()
    return dst


def greedy(url: str, prompt: str = PROMPT) -> list:
    """The replica's greedy tokens and their logprobs for `prompt` (with the inference key, where it has one)."""
    import urllib.request

    from contracts import replica_keys

    body = {"text": prompt, "return_logprob": True, "sampling_params": {"max_new_tokens": 8, "temperature": 0.0}}
    headers = {"Content-Type": "application/json", **replica_keys.inference_headers()}
    req = urllib.request.Request(f"{url}/generate", json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    return [(t, lp) for lp, t, _ in out["meta_info"]["output_token_logprobs"]]


def same(a: list, b: list) -> bool:
    """Same tokens, logprobs equal up to float32 reduction noise."""
    return [t for t, _ in a] == [t for t, _ in b] and all(abs(x - y) < 1e-4 for (_, x), (_, y) in zip(a, b))


def switch_agent(
    name: str, replica_url: str, store_url: str, public_key: Path, work: Path, base: Path, base_version: int, how: str
) -> Agent:
    """A fresh agent of a replica that serves `base` (a checkpoint directory, version `base_version`), applying
    versions in place (`how` "in_place") or reloading them whole from disk ("reload"), without pausing."""
    if how not in ("in_place", "reload"):
        raise ValueError(f"how is in_place or reload, not {how!r}")
    from benchmarks._store_server import STORE_TOKEN
    from weight_sync.agent.loop import Agent, AgentConfig

    return Agent(
        AgentConfig(
            name=name,
            replica_url=replica_url,
            store_url=store_url,
            public_key=public_key,
            work_dir=work / f"agent-{name}",
            initial_model=base,
            initial_version=base_version,
            switch_mode="no_pause",
            inplace=how == "in_place",
            store_token=STORE_TOKEN,
        )
    )


def timed_switch(agent: Agent, version: int) -> tuple[dict, dict | None]:
    """The agent's switch to `version`, the way it was made for (an in-place one warms the replica's in-place path
    first, as an agent does when it starts, off the switch path): its report (serving_ms: from the agent starting
    on the version to the replica answering with it) and the warm-up's outcome (None for a reload)."""
    warm = None
    how = "in_place" if agent.cfg.inplace else "reload"
    if how == "in_place":
        warm = asyncio.run(agent.warm_inplace())
        assert warm and warm["ok"], warm
    report = asyncio.run(agent.apply(version))
    assert report and report["apply"] == how, report
    return report, warm


def switch_figures(key: str, times: dict[str, list[float]]) -> dict:
    """The figures of one share (`key`, e.g. "2pct") from its rounds' switch seconds, in round order, each way
    ("in_place", "reload": one of each a round, side by side)."""
    if not times["in_place"] or len(times["in_place"]) != len(times["reload"]):
        raise ValueError(f"{len(times['in_place'])} in-place switches and {len(times['reload'])} reloads")
    first = {how: t[0] for how, t in times.items()}
    median = {how: statistics.median(t) for how, t in times.items()}
    ratios = [i / r for i, r in zip(times["in_place"], times["reload"])]
    return {
        f"inplace_switch_s_{key}": round(median["in_place"], 2),
        f"inplace_switch_first_s_{key}": round(first["in_place"], 2),
        f"reload_switch_s_{key}": round(median["reload"], 2),
        f"inplace_switch_runs_s_{key}": [round(t, 3) for t in times["in_place"]],
        f"reload_switch_runs_s_{key}": [round(t, 3) for t in times["reload"]],
        f"inplace_vs_reload_{key}": round(median["in_place"] / median["reload"], 3),
        f"inplace_vs_reload_{key}_median": round(statistics.median(ratios), 3),
        f"inplace_vs_reload_runs_{key}": [round(x, 3) for x in ratios],
        f"inplace_vs_reload_first_{key}": round(first["in_place"] / first["reload"], 3),
    }


def inplace_vs_reload(tmp: Path) -> dict:
    from benchmarks._store_server import serve_store
    from online_rl.model.random_checkpoint import random_checkpoint
    from serving.replica.process import ReplicaConfig, start
    from weight_sync.manifest import generate_key
    from weight_sync.publish import PublishConfig, publish

    v0 = random_checkpoint("large")
    size_gb = (v0 / "model.safetensors").stat().st_size / 1e9
    generate_key(tmp / "k.pem", tmp / "k.pub")
    stores = {}
    for share in SHARES:
        key = f"{int(share * 100)}pct"
        cfg = PublishConfig(store=tmp / f"store-{key}", private_key=tmp / "k.pem")
        publish(v0, cfg)
        v1 = _perturbed(v0, tmp / f"v1-{key}", share, seed=int(share * 100))
        r = publish(v1, cfg)
        shutil.rmtree(v1)
        stores[key] = (cfg.store, r.published_bytes)
    out: dict = {"inplace_model_gb": round(size_gb, 2), "inplace_rounds": ROUNDS}
    load = os.getloadavg()[0]
    procs = []
    replica = start(ReplicaConfig(model_path=v0, log_dir=tmp / "logs", max_total_tokens=4096))
    try:
        base = greedy(replica.url)
        for key, (store, delta_bytes) in stores.items():
            proc, url = serve_store(store)
            procs.append(proc)

            answers, times = {}, {"in_place": [], "reload": []}
            for n in range(ROUNDS):
                for how in ("in_place", "reload"):
                    a = switch_agent(f"{how}-{key}-{n}", replica.url, url, tmp / "k.pub", tmp, v0, 0, how)
                    report, warm = timed_switch(a, 1)
                    if warm:
                        out.setdefault(f"inplace_warmup_s_{key}", warm["warm_s"])
                    times[how].append(report["serving_ms"] / 1000)  # from the agent starting on v1 to the replica on it
                    answers[how] = greedy(replica.url)
                    if n == 0:
                        out[f"inplace_report_{key}" if how == "in_place" else f"reload_report_{key}"] = report
                    assert asyncio.run(a.apply(0)) and same(greedy(replica.url), base)  # back to v0, untimed
                    # Each switch on a quiet machine: the GB this agent wrote, gone and flushed (dirty pages
                    # written back during the next switch would slow whichever way it measures).
                    shutil.rmtree(a.work, ignore_errors=True)
                    os.sync()
            out.update(switch_figures(key, times))
            out[f"inplace_persist_s_{key}"] = round(out[f"inplace_report_{key}"]["persist_ms"] / 1000, 2)
            out[f"inplace_same_answers_{key}"] = same(answers["in_place"], answers["reload"]) and not same(
                answers["in_place"], base
            )
            out[f"inplace_delta_mb_{key}"] = round(delta_bytes / 2**20, 1)
    finally:
        for p in procs:
            stop_pid(p.pid)
        replica.stop()
    # how busy the machine was (1-minute load average at the start and the end of the switches)
    out["inplace_load_avg_1min"] = [round(load, 1), round(os.getloadavg()[0], 1)]
    return out


if __name__ == "__main__":
    d = Path(tempfile.mkdtemp(prefix="bench-inplace-"))
    try:
        print(json.dumps(inplace_vs_reload(d)))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    sys.exit(0)
