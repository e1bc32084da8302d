"""The spool path alone, in this process: CPU and wall time per event from EventSink.submit to its future done,
one event at a time as sequential requests send them, within the default sync window: the request path writing
the event itself (serving.event_log.pipeline) against the same events handed to the writer thread and back
(`_inline_ok` off, as before). Paired, alternating, `--repeats` times; no broker, no shipper. Prints one JSON
object as the last line (`python -m benchmarks._spool_path`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Counter

from serving.event_log.pipeline import EventLog, EventLogConfig
from serving.event_log.sink import EventSink

VALUE = b"x" * 900  # a one-token completion event of the test model is ~900 bytes (contracts.events)
META = {"tenant": "t", "ts": 1.0, "scan": ["def f(x):\n    return x\n"]}


async def _one_path(inline: bool, spool: Path, events: int) -> dict:
    late = Counter("late", "answered before durable", ["topic"], registry=CollectorRegistry())
    log = EventLog(EventLogConfig(spool_dir=spool))
    log._inline_ok = inline
    sink = EventSink(log, late)
    sink.start()
    await asyncio.sleep(0.2)  # the writer thread started
    cpu0, t0 = time.process_time(), time.perf_counter()
    for i in range(events):
        await sink.wait([sink.submit("completions", f"k{i}", VALUE, meta=META)], "completions")
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    await sink.close(5.0)
    return {"cpu_ms": 1000 * cpu / events, "wall_ms": 1000 * wall / events, "syncs": log.stats.syncs}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks._spool_path", description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-spool-path-"))
    runs: dict[str, list[dict]] = {"writer_thread": [], "inline": []}
    try:
        for r in range(a.repeats):
            for name in ("writer_thread", "inline") if r % 2 == 0 else ("inline", "writer_thread"):
                runs[name].append(asyncio.run(_one_path(name == "inline", tmp / f"{name}-{r}", a.events)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {
        k: {m: round(float(np.median([x[m] for x in v])), 4) for m in ("cpu_ms", "wall_ms")} for k, v in runs.items()
    }
    return {"per_event_median": med, "runs": runs, "events": a.events, "repeats": a.repeats}


if __name__ == "__main__":
    print(json.dumps(main()))
