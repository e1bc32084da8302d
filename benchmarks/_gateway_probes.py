"""What benchmarks.gateway reads from a running gateway: its shipper's CPU, events produced, the spool's durability
(/health and the sync-lag histogram of /metrics); and whether a port answers."""

from __future__ import annotations

import json
import socket


def shipper_cpu_s(pid: int) -> float:
    """CPU seconds used so far by a gateway's event shipper (its multiprocessing child)."""
    import psutil

    total = 0.0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            if "multiprocessing" in cmd and "resource_tracker" not in cmd:
                t = child.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
    return total


def produced(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith('flywheel_events_total{state="produced"}'):
                return int(float(line.split()[-1]))
    return 0


def durability(url: str) -> dict:
    """The gateway's spool durability from /health: mode, window, the longest sync lag so far, syncs."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
            body = r.read()
    except urllib.error.HTTPError as e:  # 503: degraded, the same body
        body = e.read()
    durability = json.loads(body)["event_log"]["durability"]
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:  # the lag histogram, cumulative by bound
        lines = r.read().decode().splitlines()
    prefix = "flywheel_event_spool_sync_lag_seconds_bucket{le="
    durability["sync_lag_buckets"] = {
        line[len(prefix) + 1 : line.index('"}')]: int(float(line.rsplit(" ", 1)[1]))
        for line in lines
        if line.startswith(prefix)
    }
    return durability


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
