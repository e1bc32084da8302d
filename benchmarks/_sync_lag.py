"""Where the spool's sync lag comes from, and what keeps it within the window, on saturated cores: side by side.

Each variant runs in a process of its own (the GIL's switch interval is per process) beside `--hogs` processes
spinning on the CPU (the benchmark fleet's replicas keep both cores busy): an asyncio loop serving `--concurrency`
simulated requests (a wait for the replica, ~0.4 ms of Python on the loop, an event submitted through EventSink into
a real spool with the default 10 ms window), for `--seconds`. Variants: the writer thread alone (as before #52) or
with the request path syncing when it is late (serving.event_log.sync_window), each with Python's default 5 ms
switch interval or 0.5 ms. For the writer thread's own syncs the lag is split into its wake-up (from the sync's due
time to the writer running in sync_if_due), the lock and descriptor work before the fdatasync, and the fdatasync
call including taking the GIL back after it (the bare fdatasync, measured on the same file with no load, beside it).
Reported per variant, medians over `--repeats` rotated runs: the max lag and the lag histogram of answered records,
requests/s, the event loop's CPU per request, and how late the loop runs a 2 ms timer (the request path cannot
sync before its loop runs). Prints one JSON object as the last line
(`python -m benchmarks._sync_lag`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

VARIANTS = {
    "writer_only": {"enforce": False, "switch_s": 0.005},
    "writer_only_switch_0.5ms": {"enforce": False, "switch_s": 0.0005},
    "enforced": {"enforce": True, "switch_s": 0.005},
    "enforced_switch_0.5ms": {"enforce": True, "switch_s": 0.0005},
}
VALUE = b"x" * 900


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(200):
            x += i * i


async def _serve(spool: Path, enforce: bool, seconds: float, concurrency: int) -> dict:
    from prometheus_client import CollectorRegistry, Counter

    from serving.event_log import spool_writer, sync_window as sw
    from serving.event_log.pipeline import EventLog, EventLogConfig
    from serving.event_log.sink import EventSink

    writer_syncs: list[tuple[float, float, float, float]] = []  # (due, entered, fdatasync called, returned)
    entered: dict = {}
    real_sync, real_due = spool_writer.os.fdatasync, sw.SyncWindow.sync_if_due

    def fdatasync(fd: int) -> None:
        t0 = time.monotonic()
        real_sync(fd)
        if threading.current_thread().name == "event-spool-writer" and entered:
            writer_syncs.append((entered["due"], entered["at"], t0, time.monotonic()))
            entered.clear()

    lags: dict[str, list[float]] = {"writer_thread": [], "request_path": []}  # per sync that covered a record

    def sync_if_due(self, segments, lock, force=False, inline=False):
        if threading.current_thread().name == "event-spool-writer" and not force:
            now, since = time.monotonic(), self._owed_since()
            if since is not None and now >= since + self.window_s * sw.WRITER_DUE:
                entered.update(due=since + self.window_s * sw.WRITER_DUE, at=now)
        n, total = sum(self.lag_counts), self.lag_sum_s
        try:
            return real_due(self, segments, lock, force, inline)
        finally:
            if sum(self.lag_counts) > n:
                lags["request_path" if inline else "writer_thread"].append(self.lag_sum_s - total)

    spool_writer.os.fdatasync = fdatasync  # type: ignore[assignment]
    sw.SyncWindow.sync_if_due = sync_if_due  # type: ignore[method-assign]
    late = Counter("late", "answered before durable", ["topic"], registry=CollectorRegistry())
    log = EventLog(EventLogConfig(spool_dir=spool, sync_on_request_path=enforce))
    sink = EventSink(log, late)
    sink.start()
    await asyncio.sleep(0.2)
    await sink.wait([sink.submit("completions", "warm", VALUE)], "completions")  # opens the segment
    fd = os.open(spool / os.listdir(spool)[0], os.O_WRONLY)
    bare = []  # the fdatasync alone, no load in this process, a page dirty each time
    for i in range(50):
        os.pwrite(fd, VALUE, (1 << 20) + i * len(VALUE))
        t0 = time.perf_counter()
        real_sync(fd)
        bare.append(time.perf_counter() - t0)
    os.close(fd)
    rng, served = random.Random(0), [0]
    stop = time.monotonic() + seconds

    async def user(u: int) -> None:
        while time.monotonic() < stop:
            await asyncio.sleep(rng.expovariate(1 / 0.010))  # the replica's turn
            _burn(0.0002)  # parsing, routing: the loop's Python per request, in two turns
            await asyncio.sleep(0)
            _burn(0.0002)
            await sink.wait([sink.submit("completions", f"u{u}", VALUE)], "completions")
            served[0] += 1

    loop_late: list[float] = []  # how late the loop runs a 2 ms timer: when it can sync at all

    async def ticker() -> None:
        while time.monotonic() < stop:
            due = time.monotonic() + 0.002
            await asyncio.sleep(0.002)
            loop_late.append(time.monotonic() - due)

    syncs0, lag0 = log.sync_window.syncs, list(log.sync_window.lag_counts)
    cpu0, t0 = time.thread_time(), time.monotonic()
    await asyncio.gather(ticker(), *(user(u) for u in range(concurrency)))
    cpu, wall = time.thread_time() - cpu0, time.monotonic() - t0
    await sink.close(5.0)
    w = log.sync_window
    lag = [n - n0 for n, n0 in zip(w.lag_counts, lag0)]
    parts = np.array(writer_syncs) if writer_syncs else np.zeros((0, 4))
    split = {
        "loop_timer_late_ms": np.array(loop_late),
        "writer_wakeup_ms": parts[:, 1] - parts[:, 0],
        "writer_before_fdatasync_ms": parts[:, 2] - parts[:, 1],
        "writer_fdatasync_with_gil_ms": parts[:, 3] - parts[:, 2],
    }
    return {
        "requests_per_s": served[0] / wall,
        "loop_cpu_ms_per_request": 1000 * cpu / max(1, served[0]),
        "lag_max_ms": 1000 * w.lag_max_s,
        "lag_counts": lag,
        "syncs": w.syncs - syncs0,
        "syncs_on_request_path": w.inline_syncs,
        "syncs_over_window": w.over_window,
        "lag_by_syncer_ms": {
            k: {"syncs": len(v), "p50": 1000 * float(np.median(v)), "max": 1000 * max(v)} for k, v in lags.items() if v
        },
        "bare_fdatasync_ms": {"p50": 1000 * float(np.median(bare)), "max": 1000 * max(bare)},
        **{
            k: {"p50": 1000 * float(np.median(v)), "p99": 1000 * float(np.percentile(v, 99)), "max": 1000 * v.max()}
            for k, v in split.items()
            if len(v)
        },
    }


def _child(variant: str, spool: Path, seconds: float, concurrency: int) -> dict:
    v = VARIANTS[variant]
    sys.setswitchinterval(v["switch_s"])
    return asyncio.run(_serve(spool, v["enforce"], seconds, concurrency))


def _median(runs: list[dict]) -> dict:
    from serving.event_log.sync_window import SYNC_LAG_BUCKETS

    out = {}
    for k in ("requests_per_s", "loop_cpu_ms_per_request", "lag_max_ms"):
        out[k] = round(float(np.median([r[k] for r in runs])), 3)
    out["lag_max_ms_worst"] = round(max(r["lag_max_ms"] for r in runs), 2)
    counts = np.sum([r["lag_counts"] for r in runs], axis=0)
    out["syncs"] = int(counts.sum())
    out["syncs_on_request_path"] = sum(r["syncs_on_request_path"] for r in runs)
    out["lag_buckets_cumulative"] = {
        ("+Inf" if b == float("inf") else repr(b)): int(c) for b, c in zip(SYNC_LAG_BUCKETS, np.cumsum(counts))
    }
    out["share_over_window"] = round(float(sum(r["syncs_over_window"] for r in runs) / max(1, counts.sum())), 4)
    for who in ("writer_thread", "request_path"):
        have = [r["lag_by_syncer_ms"][who] for r in runs if who in r["lag_by_syncer_ms"]]
        if have:
            out[f"lag_{who}_ms"] = {
                "syncs": sum(h["syncs"] for h in have),
                "p50": round(float(np.median([h["p50"] for h in have])), 3),
                "max": round(max(h["max"] for h in have), 3),
            }
    for k in (
        "loop_timer_late_ms",
        "writer_wakeup_ms",
        "writer_before_fdatasync_ms",
        "writer_fdatasync_with_gil_ms",
        "bare_fdatasync_ms",
    ):
        have = [r[k] for r in runs if k in r]
        if have:
            out[k] = {q: round(float(np.median([h[q] for h in have])), 3) for q in have[0]}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks._sync_lag", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--hogs", type=int, default=2, help="processes spinning beside it (0: the machine as it is)")
    ap.add_argument("--hog-nice", type=int, default=0, help="the spinning processes' nice value")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--spool", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(a.child, Path(a.spool), a.seconds, a.concurrency)
    names = a.variants.split(",")
    if unknown := set(names) - set(VARIANTS):
        ap.error(f"unknown variants {sorted(unknown)}; known: {list(VARIANTS)}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-sync-lag-"))
    # spinning until this process is gone (its parent changes), or an hour at most: never left behind by a kill
    spin = (
        f"import os, time; os.nice({a.hog_nice}); parent, end = os.getppid(), time.monotonic() + 3600\n"
        "while os.getppid() == parent and time.monotonic() < end:\n    for _ in range(100_000): pass"
    )
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(a.hogs)]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    try:
        for r in range(a.repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # rotated: drift hits each alike
                cmd = [
                    sys.executable,
                    "-m",
                    "benchmarks._sync_lag",
                    "--child",
                    name,
                    "--spool",
                    str(tmp / f"{name}{r}"),
                ]
                cmd += ["--seconds", str(a.seconds), "--concurrency", str(a.concurrency)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs[name].append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "variants": {n: VARIANTS[n] | _median(v) for n, v in runs.items()},
        "window_ms": 10.0,
        "seconds": a.seconds,
        "repeats": a.repeats,
        "concurrency": a.concurrency,
        "hogs": a.hogs,
        "hog_nice": a.hog_nice,
        "runs": runs,
    }


if __name__ == "__main__":
    print(json.dumps(main()))
