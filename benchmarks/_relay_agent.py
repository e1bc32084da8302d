"""One agent of benchmarks._delta_relay as its own process (on a test host): it starts its relay (unless
--relay-port 0), prints "ready", materializes the version when it reads "go" on stdin, prints one JSON line
(when it finished, bytes by source, fallbacks), keeps serving its peers until stdin closes, then prints
what its relay sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp

from weight_sync import fleet_credential
from weight_sync.agent.loop import Agent, AgentConfig


def _samples(counter) -> dict:
    """A labelled counter's values by label tuple (prometheus_client keeps no public accessor)."""
    return {
        tuple(s.labels.values()): s.value
        for metric in counter.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--store-url", required=True)
    p.add_argument("--public-key", type=Path, required=True)
    p.add_argument("--initial-model", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, required=True)
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--relay-host", default="127.0.0.1")
    p.add_argument("--relay-port", type=int, default=0)
    p.add_argument(
        "--replica", default=None, help="apply (rebuild and switch this replica, no_pause), not only rebuild"
    )
    a = p.parse_args()
    agent = Agent(
        AgentConfig(
            name=a.name,
            replica_url=a.replica or "http://127.0.0.1:9",  # without one: materialize only
            store_url=a.store_url,
            public_key=a.public_key,
            work_dir=a.work_dir,
            initial_model=a.initial_model,
            relay_port=a.relay_port,
            relay_host=a.relay_host,
            switch_mode="no_pause",
            store_token=fleet_credential.from_env(),  # environment only, as `flywheel weights agent`
        )
    )
    agent.start_relay()
    # Warm, as a running agent is: the first decode would otherwise import torch (kernels.delta picks its
    # backend), ~2 s that a fresh process pays once and a fleet's long-running agents never do per version.
    from kernels import delta

    delta.backend()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return

    async def run():
        async with aiohttp.ClientSession() as s:
            client = agent.store_client(s)
            await agent.materialize(client, a.version)
            return client

    if a.replica:  # what the agent does on an announcement: rebuild, then switch its replica
        if asyncio.run(agent.apply(a.version)) is None:
            print("null", flush=True)
            return
    else:
        asyncio.run(run())
    m = agent.metrics
    result = {
        "finished_at": time.time(),
        "from_store": m.fetched.labels("store")._value.get(),
        "from_peers": m.fetched.labels("peer")._value.get(),
        "fallbacks": {k[0]: v for k, v in _samples(m.peer_fallbacks).items()},
    }
    print(json.dumps(result), flush=True)
    sys.stdin.read()  # peers may still be fetching from this one
    agent.stop_relay()
    print(json.dumps({"relay_sent": agent.metrics.relay_sent._value.get()}), flush=True)


if __name__ == "__main__":
    main()
