"""`flywheel gate N`: judge version N (published with the gate on: in the store, not announced) against the
version the fleet serves, on the held-out suite; announce it if it passes, record the block if not."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from infra.config import add_flags, build, option


@dataclass
class GateArgs:
    baseline: int | None = option(
        None, help="the version to compare against (None: the one most replicas serve, from --gateway; else the newest announced)"
    )
    gateway: str | None = option(None, env="FLYWHEEL_GATEWAY_URL", help="the gateway to ask which version the fleet serves")
    admin_token: str | None = option(None, env="FLYWHEEL_ADMIN_TOKEN", cli=False, repr=False, help="the admin credential")


def register(sub: argparse._SubParsersAction) -> None:
    from online_rl.gate.run import GateConfig
    from weight_sync.publish import PublishConfig

    g = sub.add_parser(
        "gate", help="the eval gate: judge a published, unannounced version on the held-out suite, then announce or block it"
    )
    g.add_argument("version", type=int)
    add_flags(g, GateArgs)
    add_flags(g, GateConfig)
    add_flags(g, PublishConfig, skip=("full_every", "s3_url"))
    g.set_defaults(func=_gate)


def serving_version(args: GateArgs, store) -> int:
    """The version to judge against: given, the fleet's (the version most replicas serve), or the newest announced."""
    if args.baseline is not None:
        return args.baseline
    if args.gateway and args.admin_token:
        from admin_api.client import AdminClient

        served = [v for v in AdminClient(args.gateway, args.admin_token).weights()["replicas"].values() if v is not None]
        if served:
            return max(set(served), key=lambda v: (served.count(v), v))
    announced = store.announced()
    if announced is None or announced < 0:
        raise ValueError("no version announced yet to compare against: give --baseline")
    return announced


def _gate(args) -> int:
    from online_rl.gate.run import GateConfig, run_gate
    from weight_sync.publish import PublishConfig
    from weight_sync.store.server import Store

    what = build(GateArgs, args)
    cfg = build(GateConfig, args, publish=build(PublishConfig, args, full_every=10, s3_url=None))
    baseline = serving_version(what, Store(cfg.publish.store))
    r = run_gate(cfg, args.version, baseline)
    print(json.dumps({"version": r.version, "baseline": r.baseline, "verdict": r.verdict, "reason": r.judgement.reason,
                      "seconds": round(r.seconds, 1), "cpu_seconds": round(r.cpu_seconds, 1), "seq": r.record["seq"]}))
    return 0 if r.verdict == "pass" else 3
