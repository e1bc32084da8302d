"""Where our gateway's added latency goes: cProfile of a gateway process serving sequential one-token
completions (benchmarks.routing reports it beside the latency it explains)."""

from __future__ import annotations

import os
import pstats
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable

from infra.paths import REPO_ROOT
from infra.procs import free_port, spawn, stop_pid, wait_until

Site = tuple[str, int, str]  # (file, line, function), as pstats names them


def profile_gateway(
    gateway_args: list[str], api_key: str, state: Path, rounds: int, load: Callable[[str, int], None]
) -> dict:
    """Time per request of a gateway (`flywheel serve` + gateway_args) under cProfile, by module family and
    by function. Two profiled gateways: one that `load(url, n)` sends `rounds` requests to, and one that it
    sends a tenth as many and then leaves idle until it has served as long: the difference is what the
    other requests cost (start-up, shutdown, health checks and the first requests' one-time work, lazy
    imports, cancel). A site's difference may come out negative (noise): totals include it, families
    and top functions show what is positive."""
    if rounds < 2:
        raise ValueError(f"profiling needs at least 2 rounds (a baseline serves a tenth as many), got {rounds}")
    few = max(1, rounds // 10)
    worked: list[float] = []

    def all_rounds(url: str) -> None:
        t0 = time.monotonic()
        load(url, rounds)
        worked.append(time.monotonic() - t0)

    def few_then_idle(url: str) -> None:  # alive as long as the measured one, so periodic work cancels
        t0 = time.monotonic()
        load(url, few)
        time.sleep(max(0.0, worked[0] - (time.monotonic() - t0)))

    served = _profile(gateway_args, api_key, state / "served", all_rounds)
    base = _profile(gateway_args, api_key, state / "base", few_then_idle)
    return per_request(served, base, rounds - few)


def _waiting(site: Site) -> bool:
    """The event loop blocked in its selector: idle, not work. The baseline idles longer than the measured
    gateway (it serves a tenth as many in as long), so counted, its wait made the total negative (-6.3 ms a
    request in a make test run alone on the machine)."""
    file, _, fn = site
    return file == "~" and ("of 'select." in fn or "select.select" in fn)


def per_request(served: dict[Site, float], base: dict[Site, float], requests: int) -> dict:
    """What `requests` more requests cost, in us each: the measured profile less the baseline, site by site
    (a site in either counts; the selector's idle wait in neither)."""
    sites = {site for site in served.keys() | base.keys() if not _waiting(site)}
    diff = {site: served.get(site, 0.0) - base.get(site, 0.0) for site in sites}
    per = 1e6 / requests
    families: dict[str, float] = {}
    for (file, _, _), t in diff.items():
        families[_family(file)] = families.get(_family(file), 0.0) + t
    top = sorted(diff.items(), key=lambda kv: -kv[1])[:15]
    return {
        # cProfile's clock is wall time: time in a function, waiting for a core on this busy machine included.
        "profiled_us_per_request": round(sum(diff.values()) * per, 1),
        "routing_policy_us": round(sum(t for (f, _, _), t in diff.items() if "/serving/routing/" in f) * per, 1),
        "by_family_us": {k: round(v * per, 1) for k, v in sorted(families.items(), key=lambda kv: -kv[1]) if v > 0},
        "top_functions_us": [[f"{Path(f).name}:{line}:{fn}", round(t * per, 1)] for (f, line, fn), t in top],
    }


def _profile(gateway_args: list[str], api_key: str, state: Path, work: Callable[[str], None]) -> dict[Site, float]:
    """{site: own seconds} of a gateway that ran while `work(url)` did, then stopped."""
    port, prof = free_port(), state / "gateway.prof"
    state.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "flywheel", "serve", *gateway_args]
    cmd += ["--port", str(port), "--state-dir", str(state)]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), FLYWHEEL_API_KEYS=f"b:{api_key}")
    with open(state / "gateway.log", "ab") as f:
        proc = spawn(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _up(f"{url}/health"), 60, interval=0.2, what="profiled gateway")
        work(url)
    finally:
        stop_pid(proc.pid)  # SIGTERM: aiohttp exits cleanly and cProfile writes its file
    out = {}
    for site, (_, _, tottime, _, _) in pstats.Stats(str(prof)).stats.items():
        fn = site[2]
        if "run_forever" in fn or "run_until_complete" in fn or fn.endswith("_cleanup"):
            continue  # the event loop's own frames (and awaiting coroutines) count waiting, not work
        out[site] = tottime
    return out


def _family(file: str) -> str:
    for key in ("aiohttp", "uvloop", "asyncio", "orjson", "json", "tokenizers", "prometheus_client", "multidict"):
        if f"/{key}/" in file or file.startswith(f"<built-in method {key}"):
            return key
    for key in ("serving", "flywheel"):
        if f"/{key}/" in file:
            return f"ours ({key})"
    return "other" if file != "~" else "builtins"


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
