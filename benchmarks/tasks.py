"""Mined tasks (issue #50): feature-deletion tasks from code no one here wrote, verified in the sandbox.

Mines the standard library (with Debian's libpython3.11-testsuite) and pinned PyPI sdists that ship their tests
(online_rl.tasks.mining.sources.PINNED), each capped at a number of candidates (the cap bounds the sandbox time), and
writes the tasks to $FLYWHEEL_HOME/tasks/mined/SOURCE/. Then judges a sample of the valid tasks in the sandbox, with
the reference body (must pass) and with the body deleted (must fail): `rollouts_per_s` is that judging rate, one
rollout being one completion judged by its task's hidden tests (generation not included), and the two pass rates
check the tasks once more. Prints one JSON object as the last line.

Environment: FLYWHEEL_MINE_CAP (candidates per PyPI source, default 120), FLYWHEEL_MINE_STDLIB_CAP (default 300),
FLYWHEEL_MINE_WORKERS (sandbox runs at once, default 2), FLYWHEEL_MINE_SOURCES (comma-separated, default all).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

from infra.paths import flywheel_home
from online_rl.sandbox import suite
from online_rl.tasks.mining import cli, sources
from online_rl.tasks.mining.judge import judge
from online_rl.tasks.mining.verify import MiningConfig, mine

SOURCES = ("stdlib", *sources.PINNED)
JUDGE_SAMPLE = 60


def main() -> dict:
    cap = int(os.environ.get("FLYWHEEL_MINE_CAP", "120"))
    stdlib_cap = int(os.environ.get("FLYWHEEL_MINE_STDLIB_CAP", "300"))
    workers = int(os.environ.get("FLYWHEEL_MINE_WORKERS", "2"))
    names = [s for s in os.environ.get("FLYWHEEL_MINE_SOURCES", ",".join(SOURCES)).split(",") if s]
    out = flywheel_home() / "tasks" / "mined"
    per_source, tasks, rejected = {}, [], {}
    sandbox_s = 0.0
    for name in names:
        source = sources.resolve(name)
        cfg = MiningConfig(
            max_candidates=stdlib_cap if name == "stdlib" else cap,
            max_per_test_file=4 if name == "stdlib" else 40,
            workers=workers,
        )
        report = mine(source, cfg, progress=sys.stderr.isatty())
        result = cli.write(report, cfg, out)
        print(json.dumps({k: v for k, v in result.items() if k != "config"}), file=sys.stderr, flush=True)
        per_source[name] = {k: result[k] for k in ("version", "origin", "found", "candidates", "valid", "rejected")}
        per_source[name]["sandbox_s_per_task"] = result["sandbox_s_per_task"]
        tasks += report.tasks
        sandbox_s += report.sandbox_s
        for reason, n in report.counts().items():
            rejected[reason] = rejected.get(reason, 0) + n

    sample = random.Random(0).sample(tasks, min(JUDGE_SAMPLE, len(tasks)))
    pairs = [(t, None) for t in sample] + [(t, t.indent + "raise NotImplementedError\n") for t in sample]
    t0 = time.monotonic()
    verdicts = judge(pairs, suite.SuiteConfig(wall_seconds=30.0, cpu_seconds=30, workers=workers))
    judge_s = time.monotonic() - t0
    ref, empty = verdicts[: len(sample)], verdicts[len(sample) :]
    candidates = sum(p["candidates"] for p in per_source.values())
    return {
        "valid_tasks": len(tasks),
        "sources": per_source,
        "candidates": candidates,
        "rejected": dict(sorted(rejected.items())),
        "sandbox_s": round(sandbox_s, 1),
        "sandbox_s_per_task": round(sandbox_s / len(tasks), 3) if tasks else None,
        "sandbox_s_per_candidate": round(sandbox_s / candidates, 3) if candidates else None,
        "rollouts_per_s": round(len(pairs) / judge_s, 2) if judge_s else None,
        "rollouts_note": f"judging only (sandbox, {workers} at once): {len(pairs)} completions of {len(sample)} tasks",
        "reference_pass_rate": round(sum(v.ok for v in ref) / len(ref), 3) if ref else None,
        "deleted_body_pass_rate": round(sum(v.ok for v in empty) / len(empty), 3) if empty else None,
        "workers": workers,
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    print(json.dumps(main()))
