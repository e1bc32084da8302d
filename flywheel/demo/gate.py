"""The eval gate in the demo: `flywheel gate --follow` beside a trainer started with --gate, so that every version
after v0 is judged on the held-out suite before the fleet hears of it. It runs on the demo machine's spare capacity:
its torch on `threads` threads and the whole follower (the sandbox's runners too) niced below the serving replicas.

What it decided and what each decision cost are read back from the signed gate records the store keeps
(weight_sync.gate writes them there and on the weights topic), never from the follower's log.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

NICENESS = 10  # below the replicas, the gateway and the trainer (niceness 0): serving keeps priority
POLL_S = 2.0  # a version waits at most this long for the follower to notice it


def follower_command(
    store: Path,
    key: Path,
    kafka: str,
    gateway: str | None,
    threads: int,
    niceness: int = NICENESS,
    poll_s: float = POLL_S,
    suite: Sequence[str] = (),
) -> list[str]:
    """The follower's command line: the fleet's store, signing key and broker, and the gateway to ask which version
    the replicas serve (the version each candidate is judged against; None: the newest announced). `suite`: flags
    of the held-out suite (`flywheel gate --help`), none for its defaults."""
    if threads < 1:
        raise ValueError(f"the gate needs at least one torch thread, not {threads}")
    gate = ["--follow", "--poll", str(poll_s), "--threads", str(threads), "--store", str(store), "--key", str(key)]
    asks = ["--gateway", gateway] if gateway else []
    return [
        "nice",
        "-n",
        str(niceness),
        sys.executable,
        "-m",
        "flywheel",
        "gate",
        *gate,
        *suite,
        "--kafka",
        kafka,
        *asks,
    ]


def follower_env(fleet, threads: int) -> dict[str, str]:
    """It sends on the weights topic as the trainer would (the trainer's Kafka login) and reads which version the
    replicas serve with the admin API's status token only (it moves nothing through the gateway)."""
    threads_env = {k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}  # torch's pools, before import
    return {
        **os.environ,
        **fleet.kafka_env("trainer"),
        **threads_env,
        "FLYWHEEL_ADMIN_TOKEN": fleet.admin_parts["status"],
    }


def start_follower(fleet, out: Path, threads: int = 1) -> subprocess.Popen:
    """`flywheel gate --follow` as a child of the demo (stopped by its PID), logging to out/logs/gate.log."""
    from infra.paths import REPO_ROOT
    from infra.procs import spawn

    with open(out / "logs" / "gate.log", "ab") as log:  # the child keeps its own copy of the descriptor
        return spawn(
            follower_command(fleet.store_root, fleet.signing_key, fleet.broker.bootstrap, fleet.gateway.url, threads),
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=follower_env(fleet, threads),
        )


def verdicts(store_root: Path) -> dict[int, dict]:
    """Per version, the gate's judgement (pass or block, from its signed record in the store) and what it cost:
    wall seconds (rebuilding both versions included) and CPU seconds of the follower and its sandbox runners.
    A block an SRE overrode later stays a block here, marked overridden."""
    from weight_sync.store.server import Store

    out: dict[int, dict] = {}
    for rec in Store(store_root).activations():
        if rec.get("type") != "gate" or not isinstance(rec.get("version"), int):
            continue
        if rec.get("verdict") == "override":
            if rec["version"] in out:
                out[rec["version"]]["overridden"] = True
            continue
        figures = rec.get("figures") or {}
        out[rec["version"]] = {
            "verdict": rec.get("verdict"),
            "against": rec.get("stable"),
            "seconds": (figures.get("seconds") or {}).get("total"),
            "cpu_seconds": figures.get("cpu_seconds"),
            "reason": rec.get("reason"),
            "overridden": False,
        }
    return out


def summary(gates: dict[int, dict], waiting: list[int], publish_interval_s: float) -> dict:
    """The gate's part of the demo's verdict.json: every verdict, the cost per version, and whether the gate kept
    up with the trainer (every judgement shorter than the publish interval: done before the next version comes).
    `waiting`: versions not judged when the demo stopped (the trainer's last is often published just before)."""
    seconds = [g["seconds"] for g in gates.values() if g["seconds"] is not None]
    cpu = [g["cpu_seconds"] for g in gates.values() if g["cpu_seconds"] is not None]
    return {
        "versions": [{"version": v, **g} for v, g in sorted(gates.items())],
        "passed": sorted(v for v, g in gates.items() if g["verdict"] == "pass"),
        "blocked": sorted(v for v, g in gates.items() if g["verdict"] == "block"),
        "waiting_at_end": waiting,
        "seconds_median": round(statistics.median(seconds), 1) if seconds else None,
        "seconds_max": round(max(seconds), 1) if seconds else None,
        "cpu_seconds_median": round(statistics.median(cpu), 1) if cpu else None,
        "cpu_seconds_total": round(sum(cpu), 1),
        "publish_interval_s": publish_interval_s,
        "kept_up": bool(seconds) and max(seconds) < publish_interval_s,
    }


def line(s: dict) -> str:
    """The gate's line in the demo's printed summary."""
    if not s["versions"]:
        return f"eval gate: judged no version (waiting at the end: {s['waiting_at_end'] or 'none'})"
    return (
        f"eval gate: passed {_vs(s['passed'])}, blocked {_vs(s['blocked'])}, waiting at the end "
        f"{_vs(s['waiting_at_end'])}; {s['seconds_median']} s per version (median; max {s['seconds_max']} s, "
        f"publish interval {s['publish_interval_s']:.0f} s), {s['cpu_seconds_median']} CPU s per version "
        f"(median) at {NICENESS} niceness: {'kept up' if s['kept_up'] else 'FELL BEHIND'}"
    )


def _vs(versions: list[int]) -> str:
    return ", ".join(f"v{v}" for v in versions) or "none"
