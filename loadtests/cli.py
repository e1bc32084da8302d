"""`flywheel loadtest SCENARIO`: locust scenarios for SREs (see loadtests/runner.py and docs/loadtests.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from infra.config import add_flags, build, option
from loadtests.runner import SCENARIOS, LoadTestConfig


@dataclass
class DurationArg:
    duration: str = option(
        f"{LoadTestConfig.duration_s:g}s",
        help="run time: seconds, or 90s, 5m, 1h (a scenario runs on until its last action ends)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("loadtest", help="run a locust scenario against the fleet and judge it (exit 0 = pass)")
    p.add_argument("scenario", choices=list(SCENARIOS))
    add_flags(p, LoadTestConfig)
    add_flags(p, DurationArg)
    p.set_defaults(func=_run)


def _run(args) -> int:
    from loadtests.runner import parse_duration, run

    duration_s = parse_duration(build(DurationArg, args).duration)
    return run(build(LoadTestConfig, args, scenario=args.scenario, duration_s=duration_s))
