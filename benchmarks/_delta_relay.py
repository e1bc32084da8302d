"""Peer relay fan-out: store bytes out per version, and the time until the whole fleet has it, for 1, 3 and 6
agents, with relays on (each agent serves the pieces it verified; the store's tracker sends agents to each
other in a tree of fan-out 2) and off (every agent fetches everything from the store).

(a) replicas: six real SGLang replicas of the test-preset model (started once), rounds of 1, 3 and 6 agents
    switching them from v0 to a published 2% delta v1 (no_pause). The time runs from the moment every agent
    of the round starts its apply (as on an announcement; no Kafka here) until the last replica serves v1.
    Agents are processes on loopback (relays there too). The tiny model's whole version is ~60 KB
    (manifest ~12 KB, side files ~42 KB, chunks ~8 KB): this part shows store egress and a real switch;
    transfer time hardly matters in it.
(b) synthetic: a 192 MB bf16 checkpoint (12 tensors of 8M elements) and a delta of ~30 MB (45% of the
    elements moved by 1 ULP). The store on test host 0, agent processes on hosts 1..6, every host's
    link shaped to RATE_MBIT, so peers really cross hosts and the store's link is shared as on a fleet.
    Agents only materialize (fetch, check, rebuild; no replicas): the time is until the last one has it.
    Also for 6 agents: fan-out 1 (a chain) and 5 (a star from the first holder).
Each agent is benchmarks/_relay_agent.py (a weight_sync Agent told "go" on stdin); the store is its own
process (`flywheel weights serve`), restarted for every round so its tracker and counters start empty.
Every rebuilt checkpoint is compared with the published one. Prints one JSON object as the last line.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import torch
from safetensors.torch import load_file, save_file

from infra.paths import REPO_ROOT
from infra.procs import free_port, in_netns, spawn, stop_pid, wait_until
from weight_sync import fleet_credential

ROUNDS = (1, 3, 6)
RATE_MBIT = 50  # every test host's link, the store's too: a version's transfer weighs against its rebuild
SYNTHETIC_SHARE = 0.45  # elements moved by 1 ULP: a delta of tens of MB on the 192 MB checkpoint
STORE_PORT, RELAY_PORT = 8100, 8200


class _StoreServer:
    """`flywheel weights serve` on loopback (a free port) or on a test host (its address, STORE_PORT)."""

    token = fleet_credential.new()  # the fleet read credential: the store's, and every agent's (their env)

    def __init__(self, store: Path, host=None, fanout: int = 2):
        addr, port = (host.addr, STORE_PORT) if host else ("127.0.0.1", free_port())
        self.url = f"http://{addr}:{port}"
        cmd = [sys.executable, "-m", "flywheel", "weights", "serve", "--store", str(store), "--host", addr]
        cmd += ["--port", str(port), "--relay-fanout", str(fanout)]
        self.proc = spawn(
            in_netns(host.netns if host else None, cmd),
            cwd=REPO_ROOT,
            env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), **{fleet_credential.ENV: self.token}),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self.up, 30, interval=0.1, what="store server", alive=lambda: self.proc.poll() is None)

    def up(self) -> bool:
        req = urllib.request.Request(f"{self.url}/versions", headers=fleet_credential.headers(self.token))
        with urllib.request.urlopen(req, timeout=2):
            return True

    def stats(self) -> dict:
        req = urllib.request.Request(f"{self.url}/stats", headers=fleet_credential.headers(self.token))
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        stop_pid(self.proc.pid)


def _version_bytes(store: Path, version: int) -> int:
    """What one agent downloads for a version: manifest, signature, chunks, side files."""
    return sum(f.stat().st_size for f in (store / "versions" / str(version)).rglob("*") if f.is_file())


def _perturb(src: Path, dst: Path, share: float, seed: int) -> Path:
    shutil.copytree(src, dst)
    sd = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    for k, v in sd.items():
        bits = v.view(torch.int16)
        sd[k] = torch.where(torch.rand(v.shape, generator=g) < share, bits + 1, bits).view(torch.bfloat16)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _publish_pair(tmp: Path, v0: Path, v1: Path) -> tuple[Path, Path]:
    from weight_sync.manifest import generate_key
    from weight_sync.publish import PublishConfig, publish

    generate_key(tmp / "k.pem", tmp / "k.pub")
    cfg = PublishConfig(store=tmp / "store", private_key=tmp / "k.pem")
    publish(v0, cfg)
    publish(v1, cfg)
    return tmp / "store", tmp / "k.pub"


def _process_round(
    store: Path, key: Path, model: Path, work: Path, n: int, relay: bool, fanout=2, hosts=None, replicas=None
):
    """n agent processes, started, then told "go" together; seconds until the last one has the version (with
    replicas: until the last replica serves it), and what each fetched and sent. With test hosts the store
    is on host 0 and agent i on host i+1 (its relay on that host's address); otherwise all on loopback."""
    server = _StoreServer(store, hosts.hosts[0] if hosts else None, fanout)
    procs = []
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), **{fleet_credential.ENV: server.token})
    try:
        for i in range(n):
            h = hosts.hosts[1 + i] if hosts else None
            addr = h.addr if h else "127.0.0.1"
            port = (RELAY_PORT if h else free_port()) if relay else 0
            cmd = [sys.executable, "-m", "benchmarks._relay_agent", "--name", f"a{i}", "--store-url", server.url]
            cmd += ["--public-key", str(key), "--initial-model", str(model), "--work-dir", str(work / f"a{i}")]
            cmd += ["--relay-host", addr, "--relay-port", str(port)]
            cmd += ["--replica", replicas[i].url] if replicas else []
            with open(work.parent / f"agent-{i}.log", "ab") as log:
                io = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": log, "env": env}
                procs.append(h.spawn(cmd, **io) if h else spawn(cmd, **io))
        for p in procs:
            if p.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"an agent did not start (logs in {work.parent})")
        t0 = time.time()
        for p in procs:
            p.stdin.write(b"go\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline() or b"null") for p in procs]
        if not all(results):
            raise RuntimeError(f"an agent failed (logs in {work.parent})")
        for p in procs:
            p.stdin.close()
        for p, r in zip(procs, results, strict=True):
            r.update(json.loads(p.stdout.readline()))
            p.wait(30)
        stats = server.stats()
    finally:
        for p in procs:
            stop_pid(p.pid)
        server.stop()
    return {
        "seconds": max(r["finished_at"] for r in results) - t0,
        "results": results,
        "store_sent": stats["sent_bytes_total"],
    }


def _check(work: Path, n: int, want: dict) -> None:
    """Every agent's rebuilt checkpoint is the published one, bit for bit."""
    for i in range(n):
        got = load_file(str(work / f"a{i}" / "versions" / "1" / "model.safetensors"))
        assert got.keys() == want.keys(), "a rebuilt checkpoint differs"
        assert all(torch.equal(got[k].view(torch.int16), want[k].view(torch.int16)) for k in want), "differs"


# ---------------------------------------------------------------------- (b) synthetic, over test hosts
def synthetic(tmp: Path) -> dict:
    from flywheel.hosts.netns import HostsConfig, TestHosts

    g = torch.Generator().manual_seed(0)
    v0 = tmp / "m0"
    v0.mkdir()
    (v0 / "config.json").write_text(json.dumps({"model_type": "synthetic", "tensors": 12}))
    tensors = {f"layers.{i}.w": (torch.randn(4096, 2048, generator=g) * 0.02).to(torch.bfloat16) for i in range(12)}
    save_file(tensors, str(v0 / "model.safetensors"))
    del tensors
    v1 = _perturb(v0, tmp / "m1", share=SYNTHETIC_SHARE, seed=1)
    want = load_file(str(v1 / "model.safetensors"))
    store, key = _publish_pair(tmp, v0, v1)
    delta = _version_bytes(store, 1)
    out = {
        "synthetic_checkpoint_mb": round((v0 / "model.safetensors").stat().st_size / 2**20, 1),
        "synthetic_delta_mb": round(delta / 2**20, 1),
        "synthetic_link_mbit": RATE_MBIT,
    }
    fallbacks = 0
    hosts = TestHosts.up(HostsConfig(n=max(ROUNDS) + 1, rate_mbit=RATE_MBIT))
    try:
        # fan-out 2 (a tree) for 1, 3, 6 agents; relays off; then for 6 agents a chain (1) and a star (5)
        plan = [("synthetic", n, True, 2) for n in ROUNDS] + [("synthetic_direct", n, False, 2) for n in ROUNDS]
        plan += [(f"synthetic_fanout{f}", max(ROUNDS), True, f) for f in (1, 5)]
        for name, n, relay, fanout in plan:
            work = tmp / f"{name}-{n}"
            work.mkdir()
            r = _process_round(store, key, v0, work, n, relay, fanout, hosts=hosts)
            _check(work, n, want)
            out[f"{name}_store_egress_ratio_{n}"] = round(r["store_sent"] / delta, 2)
            out[f"{name}_fleet_materialize_s_{n}"] = round(r["seconds"], 2)
            if relay:
                peers = sum(x["from_peers"] for x in r["results"])
                out[f"{name}_peer_share_{n}"] = round(peers / (n * delta), 2)
                assert sum(x["relay_sent"] for x in r["results"]) == peers
            fallbacks += sum(sum(x["fallbacks"].values()) for x in r["results"])
            shutil.rmtree(work, ignore_errors=True)
    finally:
        hosts.down()
    out["synthetic_peer_fallbacks"] = fallbacks
    return out


# ---------------------------------------------------------------------- (a) real replicas, real switch
def replicas(tmp: Path) -> dict:
    from online_rl.model.bootstrap import bootstrap
    from serving.replica.process import ReplicaConfig, start as start_replica
    from weight_sync.agent.switch import served_version, switch

    model = bootstrap("test", seed=0, progress=False)
    v1 = _perturb(model, tmp / "v1", share=0.02, seed=1)
    store, key = _publish_pair(tmp, model, v1)
    delta = _version_bytes(store, 1)
    out = {"delta_bytes": delta}
    reps = []
    try:
        t = time.monotonic()
        for _ in range(max(ROUNDS)):  # launched together, they load side by side
            reps.append(start_replica(ReplicaConfig(model_path=model, log_dir=tmp / "logs", threads=1), wait=False))
        for r in reps:
            r.ready(600)
        out["replicas_ready_s"] = round(time.monotonic() - t, 1)

        async def served(urls):
            async with aiohttp.ClientSession() as s:
                return await asyncio.gather(*(served_version(s, u) for u in urls))

        async def back_to_v0(urls):
            await asyncio.gather(*(switch(u, str(model.resolve()), 0, "no_pause") for u in urls))

        want = load_file(str(v1 / "model.safetensors"))
        for relay, rounds in ((True, ROUNDS), (False, (max(ROUNDS),))):
            prefix = "" if relay else "direct_"
            for n in rounds:
                work = tmp / f"{prefix}agents-{n}"
                work.mkdir()
                r = _process_round(store, key, model, work, n, relay, replicas=reps)
                assert asyncio.run(served([x.url for x in reps[:n]])) == [1] * n, "a replica is not on v1"
                _check(work, n, want)
                out[f"{prefix}store_egress_ratio_{n}"] = round(r["store_sent"] / delta, 2)
                out[f"{prefix}fleet_switch_s_{n}"] = round(r["seconds"], 2)
                asyncio.run(back_to_v0([x.url for x in reps[:n]]))
                shutil.rmtree(work, ignore_errors=True)
    finally:
        for r in reps:
            r.stop()
    return out


def relay(tmp: Path) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "synthetic").mkdir()
    (tmp / "replicas").mkdir()
    out = synthetic(tmp / "synthetic")
    shutil.rmtree(tmp / "synthetic", ignore_errors=True)
    out.update(replicas(tmp / "replicas"))
    out["relay_fanout"] = 2
    out["rounds_note"] = (
        "store_egress_ratio_N / fleet_switch_s_N: N agents switching N real SGLang replicas (test-preset model, "
        "a ~60 KB version) with relays; direct_*: the same without relays. synthetic_*: materialize only, "
        "192 MB bf16 checkpoint, tens-of-MB delta, relays on; synthetic_direct_*: relays off. Ratios are "
        "store body bytes sent / one version's bytes (manifest, signature, chunks, side files)."
    )
    return out


def main() -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-relay-"))
    try:
        return relay(tmp / "run")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(main()))
