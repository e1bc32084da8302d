"""Cache-aware routing vs least-outstanding, and vs SGLang's own Rust router (smg), on IDE traffic.

Two SGLang replicas, each with a KV pool smaller than all users' files together (as a production cache
is), one torch thread each. The model (--model): `heavy` (default), the test model's tokenizer and shape
of model made wider, its work in the experts, with random weights (SGLang's --load-format dummy), so that
prefill of what is not cached is most of a completion's time to first token as on a production model;
or `test`, the test-preset model, whose TTFT is mostly fixed costs (a 2.3k-token miss measured 110-180 ms
against 90-120 ms for a hit). Both get 8192 positions so that files of 2-6k tokens fit. In front of the
same two replicas, in one run:

    ours_lo           our gateway, --routing least_outstanding
    ours_ca           our gateway, --routing cache_aware (tenants isolated: each its own prefix cache scope)
    ours_ca_shared    the same with --no-isolate-tenants (one prefix cache for all): what isolation costs
    peer              smg (pip package `smg`), --policy cache_aware, its defaults otherwise
    peer_no_overload  the same with --disable-worker-overload-protection (by default smg leaves a worker
                      out of routing at 80% KV usage, which a full prefix cache always is)

Every path asks the replicas for the same work (logprobs and routed experts, as our gateway always does).
Traffic: loadtests.ide_prefix (users editing files, a FIM completion at the cursor after each edit), the
same prompts on every arm. Each arm starts from empty caches (/flush_cache on both replicas), warms up,
then is measured; the arms run in the order lo, ca, peer, peer_no_overload, then back, and each figure is
the mean of its two runs, so that drift of this noisy machine hits every arm alike. Added latency: sequential one-token
requests with a short prompt, not streamed, interleaved over straight-to-a-replica, ours and the peer
(p50 of each minus straight's); then where our gateway's time goes (cProfile, per request).
Prints one JSON object as the last line; the figure goes to benchmarks/results/routing.png.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np

from benchmarks._gateway_profile import profile_gateway
from benchmarks._routing_models import POSITIONS, chars_per_token, long_context_view, prefill_heavy_view, stop_ids
from contracts import replica_keys
from infra.procs import free_port, spawn, stop_pid, wait_until
from loadtests import ide_prefix as ide
from online_rl.model.bootstrap import bootstrap
from serving import gateway_process
from serving.replica.process import ReplicaConfig, start as start_replica

KEY = "bench-key"
# What our gateway asks every replica for (serving.replica.engine.payload): the peer and the straight path ask the
# same, so that the replicas do the same work on every path and only the routing differs.
ENGINE_FIELDS = {"return_logprob": True, "logprob_start_len": -1, "return_routed_experts": True}
RESULTS = Path(__file__).resolve().parent / "results"


def start_smg(workers: list[str], log: Path, extra: tuple[str, ...] = ()) -> tuple[int, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "smg.launch_router", "--host", "127.0.0.1", "--port", str(port), "--policy"]
    cmd += ["cache_aware", "--worker-urls", *workers, *extra]
    with open(log, "ab") as f:
        proc = spawn(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    # Its /health answers before it has registered the workers (requests then fail with "No worker serves
    # model"): ready when a one-token completion goes through.
    wait_until(
        lambda: _generates(url), 120, interval=0.5, what="smg with its workers", alive=lambda: proc.poll() is None
    )
    return proc.pid, url


def _generates(url: str) -> bool:
    body = json.dumps({"text": "def", "sampling_params": {"max_new_tokens": 1}}).encode()
    headers = {"Content-Type": "application/json", **replica_keys.inference_headers()}
    req = urllib.request.Request(f"{url}/generate", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status == 200
    except OSError:
        return False


def decisions(gateway: str) -> dict[str, float]:
    """Why our cache-aware gateway routed where it did, from its /metrics (all runs together)."""
    with urllib.request.urlopen(f"{gateway}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("flywheel_gateway_routing_decisions_total{"):
            why = line.split('why="', 1)[1].split('"', 1)[0]
            out[why] = float(line.rsplit(" ", 1)[1])
    return out


def flush(replicas: list[str]) -> None:
    for url in replicas:
        req = urllib.request.Request(f"{url}/flush_cache", method="POST", headers=replica_keys.admin_headers())
        with urllib.request.urlopen(req, timeout=30):
            pass


async def hit_and_miss(replica: str, cfg: ide.IdeWorkloadConfig, stops: list[int]) -> dict[str, float]:
    """TTFT of a miss (a new file of 4k tokens, the cursor in its middle) and of a hit (the next request, a
    typed line later) on one idle replica, median of three files: what a hit saves on this model and backend."""
    t = ide.Target(replica, "sglang", engine_fields=ENGINE_FIELDS, sampling_fields={"stop_token_ids": stops})
    probe_cfg = dataclasses.replace(cfg, file_tokens=(4000, 4000), switching_share=0.0, move_chance=0.0)
    rng, miss, hit = random.Random(7), [], []
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            ed = ide.Editor.new(rng, probe_cfg)
            miss.append((await ide.one_request(s, t, *ed.request(probe_cfg), probe_cfg))[0])
            ed.edit(rng, probe_cfg)
            hit.append((await ide.one_request(s, t, *ed.request(probe_cfg), probe_cfg))[0])
    return {"miss": round(float(np.median(miss)), 1), "hit": round(float(np.median(hit)), 1)}


async def added_latency(
    direct: str, ours: str, peer: str | None, rounds: int, stops: list[int]
) -> dict[str, list[float]]:
    """e2e ms of one-token completions of a short prompt (not streamed, as benchmarks.gateway measures), the
    paths interleaved round by round in a shuffled order."""
    cfg = ide.IdeWorkloadConfig(max_tokens=1)
    same = {"engine_fields": ENGINE_FIELDS, "sampling_fields": {"stop_token_ids": stops}}
    paths = {"direct": ide.Target(direct, "sglang", **same), "ours": ide.Target(ours, "gateway", KEY)}
    if peer:
        paths["peer"] = ide.Target(peer, "sglang", **same)
    out: dict[str, list[float]] = {k: [] for k in paths}
    async with aiohttp.ClientSession() as s:
        for i in range(rounds):
            order = list(paths.items())
            random.Random(i).shuffle(order)
            for name, t in order:
                _, e2e, _, _ = await ide.one_request(s, t, f"def f_{i % 7}(x):\n", "", cfg, stream=False)
                out[name].append(e2e)
    return out


def main(
    requests: int,
    warmup: int,
    users: int,
    kv_tokens: int,
    repeats: int,
    rounds: int,
    think_s: float,
    model_kind: str,
) -> dict:
    base = bootstrap("test", 0, progress=False)
    tmp = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    pids: list = []
    try:
        if model_kind == "heavy":
            model, extra = prefill_heavy_view(base, tmp / "model"), ["--load-format", "dummy"]
        else:
            model, extra = long_context_view(base, tmp / "model"), []
        cfg = ide.IdeWorkloadConfig(users=users, chars_per_token=chars_per_token(model), think_s=think_s)
        # One torch thread each: two replicas on two cores, not four threads fighting over two.
        reps = [
            start_replica(
                ReplicaConfig(
                    model_path=model, max_total_tokens=kv_tokens, threads=1, log_dir=tmp / "logs", extra_args=extra
                )
            )
            for _ in range(2)
        ]
        pids += reps
        urls = [r.url for r in reps]
        user_keys = [f"key-u{i}" for i in range(users)]  # one tenant per user: affinity is per user
        keys = {f"u{i}": k for i, k in enumerate(user_keys)} | {"bench": KEY}
        stops = stop_ids(model)
        peer_error = None
        probe = asyncio.run(hit_and_miss(urls[0], cfg, stops))
        flush(urls)

        def start_arm(name: str) -> tuple[ide.Target, object]:
            """A fresh router for each run, so that no arm starts with a prefix index of the last run."""
            if name.startswith("ours_"):
                policy = "least_outstanding" if name == "ours_lo" else "cache_aware"
                args = ["--no-events", "--max-prompt-tokens", str(POSITIONS - 64), "--routing", policy]
                args += ["--no-isolate-tenants"] if name == "ours_ca_shared" else []
                gw = gateway_process.start(urls, model, tmp / f"gw-{name}", keys=keys, extra_args=args)
                return ide.Target(gw.url, "gateway", KEY, user_keys=user_keys), gw.stop
            # smg by default leaves a worker out of routing at 80% KV usage, which a full prefix cache always
            # is: the same router without that rule too, so that its prefix tree alone is compared.
            extra = ("--disable-worker-overload-protection",) if name == "peer_no_overload" else ()
            pid, url = start_smg(urls, tmp / f"{name}.log", extra)
            target = ide.Target(url, "sglang", engine_fields=ENGINE_FIELDS, sampling_fields={"stop_token_ids": stops})
            return target, lambda: stop_pid(pid)

        arms = ["ours_lo", "ours_ca", "ours_ca_shared", "peer", "peer_no_overload"]
        try:
            start_arm("peer")[1]()
        except Exception as e:  # its wheel may not run here: record why and measure the rest
            peer_error = f"{type(e).__name__}: {e}\n{(tmp / 'peer.log').read_text()[-2000:]}"
            arms = arms[:3]
        runs: dict[str, list[dict]] = {name: [] for name in arms}
        decided: dict[str, float] = {}
        for _ in range(repeats):
            for name in arms + arms[::-1]:
                flush(urls)
                t, stop = start_arm(name)
                pids.append(_Stopper(stop))
                try:
                    seconds = asyncio.run(ide.run(t, cfg, requests, warmup))
                    if name == "ours_ca":
                        for why, n in decisions(t.url).items():
                            decided[why] = decided.get(why, 0.0) + n
                finally:
                    stop()
                runs[name].append(ide.summarize(t, seconds))
                print(name, runs[name][-1], file=sys.stderr, flush=True)
        # Added latency: our cache-aware gateway and the peer as shipped, side by side.
        ours, stop_ours = start_arm("ours_ca")
        pids.append(_Stopper(stop_ours))
        peer, stop_peer = start_arm("peer") if peer_error is None else (None, lambda: None)
        pids.append(_Stopper(stop_peer))
        lat = asyncio.run(added_latency(urls[0], ours.url, peer.url if peer else None, rounds, stops))
        stop_ours(), stop_peer()
        result = _result(runs, lat, peer_error, cfg, kv_tokens, requests, warmup)
        result["setup"]["model"] = model_kind
        result["setup"]["probe_ttft_ms"] = probe
        result["cache_aware_decisions"] = decided
        gateway_args = ["--model", str(model), "--no-events", "--max-prompt-tokens", str(POSITIONS - 64)]
        gateway_args += [a for u in urls for a in ("--replica", u)]
        result["ours_profile"] = profile_gateway(
            gateway_args,
            KEY,
            tmp / "gw-profiled",
            rounds,
            lambda url, n: asyncio.run(added_latency(urls[0], url, None, n, stops)),
        )
        return result
    finally:
        for p in reversed(pids):
            p.stop() if hasattr(p, "stop") else stop_pid(p)
        shutil.rmtree(tmp, ignore_errors=True)


class _Stopper:
    """Stops something at the end whatever happens (stopping twice is harmless)."""

    def __init__(self, stop):
        self.stop = stop


def _mean(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return round(float(np.mean(vals)), 4) if vals else None


def _result(runs, lat, peer_error, cfg, kv_tokens, requests, warmup) -> dict:
    p50 = {k: float(np.percentile(v, 50)) for k, v in lat.items()}
    keys = ("requests", "errors", "hit_rate", "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "requests_per_s")
    keys += ("mean_prompt_tokens",)
    arm = {name: {k: _mean(rs, k) for k in keys} for name, rs in runs.items()}
    lo, ca, shared, peer = arm["ours_lo"], arm["ours_ca"], arm["ours_ca_shared"], arm.get("peer")
    result = {
        "hit_rate_least_outstanding": lo["hit_rate"],
        "hit_rate_cache_aware": ca["hit_rate"],
        "ttft_p50_ratio": round(ca["ttft_p50_ms"] / lo["ttft_p50_ms"], 3),
        "peer_hit_rate": peer["hit_rate"] if peer else None,
        "peer_ttft_p50_ms": peer["ttft_p50_ms"] if peer else None,
        "ours_ttft_p50_ms": ca["ttft_p50_ms"],
        "peer_added_p50_ms": round(p50["peer"] - p50["direct"], 2) if "peer" in p50 else None,
        "peer_no_overload_hit_rate": arm.get("peer_no_overload", {}).get("hit_rate"),
        "peer_no_overload_ttft_p50_ms": arm.get("peer_no_overload", {}).get("ttft_p50_ms"),
        "ours_added_p50_ms": round(p50["ours"] - p50["direct"], 2),
        # Tenant isolation (serving.tenants.cache_scope): cache-aware with each tenant in its own prefix cache scope,
        # against one scope for all. These users share no prefix across tenants, so the cost is the mechanism's.
        "isolation": {
            "hit_rate_isolated": ca["hit_rate"],
            "hit_rate_shared": shared["hit_rate"],
            "ttft_p50_ratio_isolated_to_shared": round(ca["ttft_p50_ms"] / shared["ttft_p50_ms"], 3),
        },
        "arms": arm,
        "runs": runs,
        "latency_p50_ms": {k: round(v, 2) for k, v in p50.items()},
        "peer_error": peer_error,
        "setup": {
            "replicas": 2,
            "kv_tokens_per_replica": kv_tokens,
            "users": cfg.users,
            "file_tokens": list(cfg.file_tokens),
            "chars_per_token": round(cfg.chars_per_token, 2),
            "measured_requests_per_user": requests,
            "warmup_requests_per_user": warmup,
            "think_s": cfg.think_s,
            "peer": "smg 1.13 --policy cache_aware",
        },
    }
    result["targets_met"] = {
        "hit_rate_ge_1_5x": bool(lo["hit_rate"] and ca["hit_rate"] >= 1.5 * lo["hit_rate"]),
        "ttft_p50_ratio_le_0_8": result["ttft_p50_ratio"] <= 0.8,
        "ttft_p50_no_worse_than_peer": bool(peer and ca["ttft_p50_ms"] <= peer["ttft_p50_ms"]),
        "added_within_2x_peer": bool(peer and result["ours_added_p50_ms"] <= 2 * max(result["peer_added_p50_ms"], 0.0)),
    }
    _plot(arm)
    return result


def _plot(arm: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(arm)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for ax, key, label in zip(
        axes, ("hit_rate", "ttft_p50_ms", "ttft_p99_ms"), ("prefix hit rate", "TTFT p50 (ms)", "TTFT p99 (ms)")
    ):
        ax.bar(names, [arm[n][key] or 0 for n in names], color=["#999", "#2a7", "#8c8", "#37c", "#7ad"][: len(names)])
        ax.tick_params(axis="x", labelrotation=30)
        ax.set_title(label)
    fig.suptitle("IDE traffic on 2 replicas: least-outstanding, cache-aware (ours: tenants isolated, shared), smg")
    fig.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    fig.savefig(RESULTS / "routing.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20, help="measured requests per user in each run of an arm")
    ap.add_argument("--warmup", type=int, default=5, help="requests per user before measuring (caches fill)")
    ap.add_argument(
        "--users",
        type=int,
        default=10,
        help="each with one or two files (their prompts together about twice one replica's KV pool)",
    )
    ap.add_argument("--kv-tokens", type=int, default=12288, help="each replica's KV pool")
    ap.add_argument(
        "--model",
        choices=["heavy", "test"],
        default="heavy",
        help="heavy: random weights, wide enough that prefill dominates TTFT as on a production model; "
        "test: the test-preset model (its TTFT is mostly fixed costs)",
    )
    ap.add_argument("--repeats", type=int, default=1, help="passes over the arms, there and back")
    ap.add_argument("--think", type=float, default=4.0, help="users' mean pause between requests (s)")
    ap.add_argument("--rounds", type=int, default=200, help="sequential requests per path (added latency)")
    a = ap.parse_args()
    if a.rounds < 2:
        ap.error("--rounds: at least 2 (the profile's baseline serves a tenth as many)")
    print(json.dumps(main(a.requests, a.warmup, a.users, a.kv_tokens, a.repeats, a.rounds, a.think, a.model)))
