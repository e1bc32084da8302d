"""The sandbox: the hostile corpus contained, and what isolation costs, side by side in one run.

(a) every case of tests/hostile_candidates.py through the bubblewrap sandbox (2 at a time): contained
    when its reward is what an honest evaluator gives and its attempt was counted for what it was; the
    cache and the repo fingerprinted before and after; sandbox processes left afterwards;
(b) honest candidates (each held-out task's reference and one wrong body) judged through the isolated
    sandbox and through a bare `python -I -S` subprocess running the same runner (no namespaces, no
    bwrap), alternating, best of 3 each: candidates per second and plain / isolated.
Prints one JSON object as the last line.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

from infra.paths import REPO_ROOT, flywheel_home
from online_rl.sandbox import judge as sandbox
from online_rl.sandbox.process import UID_SPAN
from online_rl.tasks import synthetic as tasks
from tests import hostile_candidates as hc

CFG = sandbox.SandboxConfig(cpu_seconds=1, wall_seconds=3.0)


def corpus() -> dict:
    from weight_sync.manifest import generate_key

    keys = Path(tempfile.mkdtemp(prefix="bench-keys-"))
    generate_key(keys / "signing.pem", keys / "signing.pub")
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]  # servers on loopback ports
    values = {
        "key": keys / "signing.pem",
        "cache_file": flywheel_home() / "setup.lock",
        "cache_dir": flywheel_home(),
        "repo_file": REPO_ROOT / "online_rl" / "tasks.py",
        "repo_dir": REPO_ROOT,
        "ports": [s.getsockname()[1] for s in listeners],
        "harness_pid": os.getpid(),
        "stdlib": sandbox.interpreter()[1],
    }
    before = (hc.fingerprint(flywheel_home()), hc.fingerprint(REPO_ROOT))
    t0 = time.monotonic()
    verdicts = sandbox.run([hc.render(c, **values) for c in hc.CASES], CFG)
    verdicts += sandbox.run(
        [hc.render(c, **values) for c in hc.LEFTOVER_PAIR],
        sandbox.SandboxConfig(cpu_seconds=1, wall_seconds=3.0, workers=1),
    )
    seconds = time.monotonic() - t0
    for s in listeners:
        s.close()
    cases = hc.CASES + hc.LEFTOVER_PAIR
    ok = [hc.contained(c, v) for c, v in zip(cases, verdicts)]
    for c, v, good in zip(cases, verdicts, ok):
        print(f"{'contained' if good else 'ESCAPED  '} {c.name:32s} reward {v.reward:.1f} {','.join(v.contained)}")
    time.sleep(0.5)
    orphans = sum(
        1
        for p in psutil.process_iter(["uids"])
        if CFG.outer_uid_base <= p.info["uids"].real < CFG.outer_uid_base + UID_SPAN and p.status() != "zombie"
    )
    changed = (hc.fingerprint(flywheel_home()), hc.fingerprint(REPO_ROOT)) != before
    kinds = Counter(k for v in verdicts for k in v.contained)
    return {
        "cases": len(cases),
        "contained": sum(ok),
        "escapes": len(cases) - sum(ok) + int(changed),
        "outside_changed": changed,
        "orphans": orphans,
        "corpus_seconds": round(seconds, 1),
        "contained_by_kind": dict(sorted(kinds.items())),
    }


def throughput(reps: int = 3) -> dict:
    held = tasks.tasks("heldout")
    cands = [sandbox.candidate_for(t, b) for t in held for b in (t.reference, t.wrong_bodies()[0])]
    sandbox.run(cands[:4])  # warm: the root's library list, the first bwrap
    best = {False: float("inf"), True: float("inf")}
    for _ in range(reps):
        for bare in (False, True):
            t = time.perf_counter()
            verdicts = sandbox.run(cands, bare=bare)
            best[bare] = min(best[bare], time.perf_counter() - t)
            assert sum(v.ok for v in verdicts) == len(held), "the references pass, the wrong bodies fail"
    isolated, plain = len(cands) / best[False], len(cands) / best[True]
    return {
        "honest_candidates": len(cands),
        "candidates_per_s": round(isolated, 1),
        "plain_candidates_per_s": round(plain, 1),
        "overhead_ratio": round(plain / isolated, 2),
        "workers": min(len(cands), os.cpu_count() or 1),
    }


def main() -> dict:
    return {**corpus(), **throughput()}


if __name__ == "__main__":
    print(json.dumps(main()))
