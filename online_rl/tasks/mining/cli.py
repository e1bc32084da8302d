"""`flywheel tasks mine SOURCE [--mode body|feature]`: feature-deletion tasks from real code, verified in the sandbox.

SOURCE is a folder (a repository with its tests), `stdlib` (the interpreter's standard library with Debian's test
suite), `pypi:NAME==VERSION`, or the name of a pinned PyPI package (online_rl.tasks.mining.sources.PINNED). Writes
OUT/SOURCE/tasks.jsonl (the valid tasks, with provenance), rejected.jsonl (each rejected candidate and why) and
summary.json (counts by reason, sandbox seconds per task), and prints the summary. --mode body (the default) deletes
one function's body (online_rl.tasks.mining.verify); --mode feature deletes a function with its call sites
(online_rl.tasks.mining.verify_feature) and writes to OUT/SOURCE-feature/ (OUT by default
$FLYWHEEL_HOME/tasks/mined-feature: apart from the body tasks the off-peak rollouts read).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from infra.config import add_flags, build, option


@dataclass
class OutArgs:
    out: Path | None = option(
        None, help="where the tasks go (None: $FLYWHEEL_HOME/tasks/mined, or mined-feature); one folder per source"
    )
    progress: bool = option(True, help="progress bars")


def register(sub: argparse._SubParsersAction) -> None:
    from online_rl.tasks.mining.verify import MiningConfig

    t = sub.add_parser("tasks", help="coding tasks: mine feature-deletion tasks from real code")
    tsub = t.add_subparsers(dest="tasks_cmd", required=True)
    p = tsub.add_parser(
        "mine", help="mine a repository, `stdlib`, or a PyPI package for tasks, verified in the sandbox"
    )
    p.add_argument("source", help="a folder, `stdlib`, `pypi:NAME==VERSION`, or a pinned package's name")
    add_flags(p, MiningConfig)
    add_flags(p, OutArgs)
    p.set_defaults(func=_mine)


def mine(source, cfg, progress: bool = True):
    """Mine `source` in cfg.mode: a MiningReport."""
    if cfg.mode == "feature":
        from online_rl.tasks.mining.verify_feature import mine_features

        return mine_features(source, cfg, progress)
    from online_rl.tasks.mining.verify import mine as mine_bodies

    return mine_bodies(source, cfg, progress)


def summary(report) -> dict:
    """What a mining run reports: candidates, valid tasks, rejections by reason, sandbox seconds per task."""
    from online_rl.tasks.mining import verify

    return {
        "source": report.source,
        "version": report.version,
        "origin": report.origin,
        "found": report.found,
        "candidates": report.candidates,
        "valid": len(report.tasks),
        "rejected": report.counts(),
        "sandbox_s": report.sandbox_s,
        "sandbox_s_per_candidate": round(report.sandbox_s / report.candidates, 3) if report.candidates else None,
        "sandbox_s_per_task": round(report.sandbox_s / len(report.tasks), 3) if report.tasks else None,
        "wall_s": report.wall_s,
        "runner": verify.runner_digest(),  # the suite runner that verified the tasks
    }


def write(report, cfg, out: Path) -> dict:
    from online_rl.tasks.mining import store

    folder = out / (re.sub(r"[^A-Za-z0-9_.-]+", "_", report.source) + ("-feature" if cfg.mode == "feature" else ""))
    store.save(report.tasks, folder / "tasks.jsonl")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "rejected.jsonl", "w") as f:
        for r in report.rejected:
            f.write(json.dumps(asdict(r)) + "\n")
    result = {**summary(report), "mode": cfg.mode, "config": asdict(cfg), "tasks_file": str(folder / "tasks.jsonl")}
    (folder / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _mine(args) -> int:
    from infra.paths import flywheel_home
    from online_rl.tasks.mining import sources
    from online_rl.tasks.mining.verify import MiningConfig

    cfg = build(MiningConfig, args)
    opts = build(OutArgs, args)
    source = sources.resolve(args.source)
    report = mine(source, cfg, progress=opts.progress)
    default = flywheel_home() / "tasks" / ("mined" if cfg.mode == "body" else "mined-feature")
    result = write(report, cfg, opts.out or default)
    print(json.dumps(result, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command without the `flywheel` entry point (tests; a checkout not installed): `tasks mine ...`."""
    parser = argparse.ArgumentParser(prog="flywheel")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
