"""`flywheel gate [N]`: judge version N (published with the gate on: in the store, not announced) against the
version the fleet serves, on the held-out suite; announce it if it passes, record the block if not. Without N, every
version still waiting for a verdict, oldest first; with --follow, those the trainer publishes from then on too."""

from __future__ import annotations

import argparse
import json
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.config import add_flags, build, option

if TYPE_CHECKING:
    from online_rl.gate.run import BaselineCache, GateConfig

log = logging.getLogger(__name__)


@dataclass
class GateArgs:
    baseline: int | None = option(
        None,
        help="the version to compare against (None: the one most replicas serve, from --gateway; else the newest "
        "announced)",
    )
    gateway: str | None = option(
        None, env="FLYWHEEL_GATEWAY_URL", help="the gateway to ask which version the fleet serves"
    )
    admin_token: str | None = option(
        None, env="FLYWHEEL_ADMIN_TOKEN", cli=False, repr=False, help="the admin credential"
    )
    canary: bool = option(
        False, help="announce a version that passes as a canary candidate (as the trainer's --canary)"
    )
    follow: bool = option(False, help="keep judging the versions the trainer publishes (no N)")
    poll_s: float = option(10.0, flag="poll", help="seconds between looks at the store, with --follow")
    threads: int = option(
        0, help="torch threads the suite runs on (0: torch's default; 1 beside serving replicas: spare capacity)"
    )


def register(sub: argparse._SubParsersAction) -> None:
    from online_rl.gate.run import GateConfig
    from weight_sync.publish import PublishConfig

    g = sub.add_parser(
        "gate",
        help="the eval gate: judge a published, unannounced version on the held-out suite, then announce or block it",
    )
    g.add_argument("version", type=int, nargs="?", help="the version (none: every version waiting for a verdict)")
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

        replicas = AdminClient(args.gateway, args.admin_token).weights()["replicas"]
        served = [v for v in replicas.values() if v is not None]
        if served:
            return max(set(served), key=lambda v: (served.count(v), v))
    announced = store.announced()
    if announced is None or announced < 0:
        raise ValueError("no version announced yet to compare against: give --baseline")
    return announced


def waiting(store) -> list[int]:
    """Versions in the store, not announced, without a gate verdict: the gate's queue, oldest first. Never v0: the
    trainer announces its first version itself (there is nothing to judge it against), also after a restart."""
    judged = store.gate_verdicts()
    return [v for v in store.unannounced() if v > 0 and v not in judged]


def released_unsent(store) -> list[int]:
    """Versions passed (or overridden) whose announcement never reached the broker: sent again, not judged again."""
    judged = store.gate_verdicts()
    return [v for v in store.unannounced() if v > 0 and judged.get(v, {}).get("verdict") in ("pass", "override")]


def _gate(args) -> int:
    from online_rl.gate.run import GateConfig
    from weight_sync.publish import PublishConfig
    from weight_sync.store.server import Store

    what = build(GateArgs, args)
    if what.follow and args.version is not None:
        raise ValueError("--follow judges every new version: give no version with it")
    publish = build(PublishConfig, args, full_every=10, s3_url=None, canary=what.canary)
    if what.follow and not publish.kafka_bootstrap:
        raise ValueError("--follow announces on the weights topic: give --kafka (or FLYWHEEL_KAFKA_BOOTSTRAP)")
    cfg = build(GateConfig, args, publish=publish)
    if what.threads < 0:
        raise ValueError(f"--threads is a count of torch threads (0: torch's default), not {what.threads}")
    if what.threads:
        import torch

        torch.set_num_threads(what.threads)
    if what.follow:
        follow(cfg, what, threading.Event())  # until Ctrl-C
        return 0
    store = Store(cfg.publish.store)
    if cfg.publish.kafka_bootstrap:  # a pass whose announcement failed before: sent now, not judged again
        from weight_sync.publish import announce, stored_announcement

        for v in released_unsent(store):
            _retried(lambda v=v: announce(cfg.publish, stored_announcement(cfg.publish, v)), v)  # or at the next run
    cache: BaselineCache = {}  # the serving version's suite runs once for all the versions judged against it
    todo = [args.version] if args.version is not None else waiting(store)
    results = [_one(cfg, v, serving_version(what, store), cache) for v in todo]
    return 3 if "block" in results else 0  # 3: a version was blocked (a script may stop there)


def follow(cfg: GateConfig, what: GateArgs, stop: threading.Event) -> None:
    """`flywheel gate --follow`: every `poll_s`, send what passed but never reached the broker, then judge what
    waits, oldest first; until `stop` is set."""
    from weight_sync.publish import announce, stored_announcement
    from weight_sync.store.server import Store

    store = Store(cfg.publish.store)
    cache: BaselineCache = {}
    while not stop.is_set():
        for v in released_unsent(store):
            _retried(lambda v=v: announce(cfg.publish, stored_announcement(cfg.publish, v)), v)
        for v in waiting(store):
            if stop.is_set():
                return
            _retried(lambda v=v: _one(cfg, v, serving_version(what, store), cache), v)
        stop.wait(what.poll_s)


def _one(cfg, version: int, baseline: int, cache: BaselineCache) -> str:
    from online_rl.gate.run import run_gate

    r = run_gate(cfg, version, baseline, cache)
    summary = {"version": r.version, "baseline": r.baseline, "verdict": r.verdict, "seq": r.record["seq"]}
    print(json.dumps(summary | {"seconds": round(r.seconds, 1), "reason": r.judgement.reason}), flush=True)
    return r.verdict


def _retried(step, version: int) -> None:
    """One version's step in --follow: a failure (the broker or the gateway away, a baseline not there, a bug) is
    logged and tried again at the next look, and the versions after it are still judged; the follower lives on.
    A candidate that fails its own verification is not a failure here: the gate blocks it (online_rl.gate.run)."""
    try:
        step()
    except Exception as e:  # noqa: BLE001 - one version's trouble must not stop the gate for every later one
        log.error("gate: v%d not done (%s: %s); trying again in the next round", version, type(e).__name__, e)
