"""`flywheel loadtest SCENARIO`: locust scenarios for SREs (see loadtests/runner.py and README)."""

from __future__ import annotations

import argparse
from pathlib import Path

from infra.config import env


def register(sub: argparse._SubParsersAction) -> None:
    from loadtests.runner import SCENARIOS, LoadTestConfig

    d = LoadTestConfig(scenario="steady")
    p = sub.add_parser("loadtest", help="run a locust scenario against the fleet and judge it (exit 0 = pass)")
    p.add_argument("scenario", choices=list(SCENARIOS))
    p.add_argument("--users", type=int, default=d.users)
    p.add_argument("--duration", default=f"{int(d.duration_s)}s", help="run time: seconds, or 90s, 5m, 1h")
    p.add_argument("--spawn-rate", type=float, default=d.spawn_rate, help="users started per second")
    p.add_argument("--out", type=Path, default=d.out_dir)
    p.add_argument(
        "--p99-multiple",
        type=float,
        default=d.p99_multiple,
        help="allowed p99 after the first action, as a multiple of the p99 before it",
    )
    p.add_argument(
        "--gateway",
        default=env("FLYWHEEL_GATEWAY_URL"),
        help="a deployed gateway (default: start a local fleet)",
    )
    # Secrets from the environment only, never flags (a command line shows to every `ps`: DESIGN, Trust).
    p.set_defaults(keys=env("FLYWHEEL_LOADTEST_KEYS"), admin_token=env("FLYWHEEL_ADMIN_TOKEN"))
    p.add_argument("--preset", default=d.preset, choices=["test", "demo"], help="model of the local fleet")
    p.add_argument("--replicas", type=int, default=d.replicas, help="replicas of the local fleet")
    p.add_argument(
        "--no-observe",
        dest="observe",
        action="store_false",
        help="no Prometheus on the local fleet (default: one scrapes it; alerts seen go in result.json)",
    )
    p.set_defaults(func=_run)


def _run(args) -> int:
    from loadtests.runner import LoadTestConfig, parse_duration, run

    return run(
        LoadTestConfig(
            scenario=args.scenario,
            users=args.users,
            duration_s=parse_duration(args.duration),
            spawn_rate=args.spawn_rate,
            out_dir=args.out,
            p99_multiple=args.p99_multiple,
            gateway=args.gateway,
            keys=args.keys,
            admin_token=args.admin_token,
            preset=args.preset,
            replicas=args.replicas,
            observe=args.observe,
        )
    )
