"""`flywheel weights ...`: keys, publish, list, rollback, pin/unpin, the canary and the overrides of its trials and of
the eval gate, the store server, and the agent."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from infra.config import add_flags, build, option


def _home() -> Path:
    from infra.paths import flywheel_home

    return flywheel_home() / "weights"


@dataclass
class KeygenArgs:
    out: Path | None = option(None, help="where the key pair goes (None: $FLYWHEEL_HOME/weights/keys)")


@dataclass
class PublishArgs:
    checkpoint: Path = option(help="the checkpoint directory to publish")
    full: bool = option(False, help="a full snapshot even if a delta is possible")


@dataclass
class ListArgs:
    gateway: str | None = option(
        None, env="FLYWHEEL_GATEWAY_URL", help="the gateway to ask which replica serves which version"
    )
    admin_token: str | None = option(
        None, env="FLYWHEEL_ADMIN_TOKEN", cli=False, repr=False, help="the admin API's credential"
    )  # environment only (DESIGN: Trust)


@dataclass
class RollbackArgs:
    to: int = option(help="the version every replica goes back to")
    reason: str = option("rollback by SRE", help="recorded with the activation")


@dataclass
class GateOverrideArgs:
    reason: str = option(help="why the version goes out although the gate blocked it (recorded, signed)")
    by: str | None = option(None, help="who overrides (None: this login's name)")
    force: bool = option(False, help="release it although a newer version went out since (the fleet goes back to it)")


# PublishConfig's options that only `weights publish` takes; the other commands take its store, key and Kafka.
_PUBLISH_ONLY = ("full_every", "store_url", "s3_url")


def register(sub: argparse._SubParsersAction) -> None:
    """Every --flag from a config's options (infra.config); positionals and the subcommands written here."""
    from weight_sync.agent.config import AgentConfig
    from weight_sync.canary.controller import CanaryConfig
    from weight_sync.publish import PublishConfig
    from weight_sync.store.server import ServerConfig

    p = sub.add_parser("weights", help="versions of the served weights: publish, list, rollback, pin, agents")
    w = p.add_subparsers(dest="weights_cmd", required=True)

    def common(q, kafka=True):  # the store, the signing key and (kafka) the announcements' bootstrap
        add_flags(q, PublishConfig, skip=_PUBLISH_ONLY + (() if kafka else ("kafka",)))
        # what the command has no flag for is not read from the environment either
        q.set_defaults(publish_fixed=dict.fromkeys(("store_url", "s3_url") + (() if kafka else ("kafka_bootstrap",))))

    k = w.add_parser("keygen", help="create the trainer's ed25519 signing key pair")
    add_flags(k, KeygenArgs)
    k.set_defaults(func=_keygen)

    pub = w.add_parser("publish", help="publish a checkpoint as the next version (what the trainer calls)")
    add_flags(pub, PublishArgs)
    add_flags(pub, PublishConfig)
    pub.set_defaults(func=_publish, publish_fixed={})

    ls = w.add_parser("list", help="versions, sizes, ratios, activations, and which replica runs which")
    add_flags(ls, ListArgs)
    common(ls, kafka=False)
    ls.set_defaults(func=_list)

    rb = w.add_parser("rollback", help="activate an older version on every replica (a new activation)")
    add_flags(rb, RollbackArgs)
    common(rb)
    rb.set_defaults(func=_rollback)

    pin = w.add_parser("pin", help="serve version N and stop following new versions")
    pin.add_argument("version", type=int)
    common(pin)
    pin.set_defaults(func=lambda a: _activate(a, a.version, "pin", "pinned by SRE"))

    unpin = w.add_parser(
        "unpin", help="follow new versions again (switch to the newest released: never a canary that was not promoted)"
    )
    common(unpin)
    unpin.set_defaults(func=lambda a: _activate(a, -1, "unpin", "unpinned by SRE"))

    pro = w.add_parser("promote", help="end version N's canary trial now: every replica serves it")
    pro.add_argument("version", type=int)
    common(pro)
    pro.set_defaults(func=lambda a: _activate(a, a.version, "promote", "promoted by SRE override"))

    ab = w.add_parser("abort", help="end version N's canary trial now: back to the stable version")
    ab.add_argument("version", type=int)
    common(ab)
    ab.set_defaults(func=_abort)

    go = w.add_parser(
        "gate-override", help="announce version N although the eval gate blocked it (a signed record of who and why)"
    )
    go.add_argument("version", type=int)
    add_flags(go, GateOverrideArgs)
    common(go)
    go.set_defaults(func=_gate_override)

    can = w.add_parser(
        "canary",
        help="run the canary controller: trial each version the trainer publishes "
        "with --canary, then promote or roll back",
    )
    add_flags(can, CanaryConfig)
    common(can)
    can.set_defaults(func=_canary)

    srv = w.add_parser(
        "serve",
        help="serve the store over HTTP (range requests) for the agents, who must show the fleet read credential "
        "($FLYWHEEL_STORE_TOKEN, which this server reads too)",
    )
    add_flags(srv, ServerConfig)
    common(srv, kafka=False)
    srv.set_defaults(func=_serve)

    ag = w.add_parser("agent", help="run the weight agent of one replica (follows the weights topic)")
    add_flags(ag, AgentConfig)
    ag.set_defaults(func=_agent)


def _keygen(args) -> int:
    from weight_sync.manifest import generate_key

    out = build(KeygenArgs, args).out or _home() / "keys"
    if (out / "signing.pem").exists():
        raise ValueError(f"{out / 'signing.pem'} exists; refusing to overwrite a signing key")
    kid = generate_key(out / "signing.pem", out / "signing.pub")
    print(json.dumps({"key_id": kid, "private": str(out / "signing.pem"), "public": str(out / "signing.pub")}))
    return 0


def _cfg(args):
    """The store, key and announcements of any command; what only `weights publish` takes, from its flags."""
    from weight_sync.publish import PublishConfig

    cfg = build(PublishConfig, args, progress=True, **args.publish_fixed)
    _s3_url(cfg.s3_url)
    return cfg


def _s3_url(url: str | None) -> str | None:
    """A bucket URL checked before anything is published or followed (a typo fails here, not mid-publish)."""
    if url:
        from weight_sync.store.s3 import parse_url

        parse_url(url)
    return url


def _publish(args) -> int:
    from weight_sync.publish import publish

    cfg, what = _cfg(args), build(PublishArgs, args)
    try:
        r = publish(what.checkpoint, cfg, force_full=what.full)
    except ConnectionError as e:  # the bucket unreachable or refusing: one line, like other errors
        raise RuntimeError(str(e)) from None
    print(
        json.dumps(
            {
                "version": r.version,
                "kind": r.kind,
                "base_version": r.base_version,
                "raw_mb": round(r.raw_bytes / 2**20, 2),
                "published_mb": round(r.published_bytes / 2**20, 3),
                "ratio": round(r.ratio, 1),
                "changed_pct": round(100 * r.changed_share, 2),
                "seconds": round(r.seconds, 2),
            }
        )
    )
    return 0


def _activate(args, version: int, kind: str, reason: str, **extra) -> int:
    from weight_sync.publish import activate

    print(json.dumps(activate(_cfg(args), version, reason, kind, **extra)))
    return 0


def _rollback(args) -> int:
    what = build(RollbackArgs, args)
    return _activate(args, what.to, "activate", what.reason)


def _abort(args) -> int:
    from weight_sync.store.server import Store

    activations = Store(_cfg(args).store).activations()
    trials = [a for a in activations if a["type"] == "canary" and a["version"] == args.version]
    if not trials:
        raise ValueError(f"no canary trial of v{args.version} in the store's activations")
    return _activate(args, args.version, "rollback", "aborted by SRE override", stable=trials[-1]["stable"])


def _gate_override(args) -> int:
    from weight_sync.gate import override

    what = build(GateOverrideArgs, args)
    print(json.dumps(override(_cfg(args), args.version, what.reason, what.by, force=what.force)))
    return 0


def _canary(args) -> int:
    from weight_sync.canary.controller import CanaryConfig, CanaryController

    cfg = build(CanaryConfig, args, publish=_cfg(args))
    if not (cfg.gateway_url and cfg.admin_token and cfg.publish.kafka_bootstrap):
        raise ValueError(
            "the canary controller needs --gateway and --kafka (or their env vars) and FLYWHEEL_ADMIN_TOKEN"
        )
    CanaryController(cfg).run()
    return 0


def _list(args) -> int:
    from admin_api.client import AdminClient
    from weight_sync.store.server import Store

    store, what = Store(_cfg(args).store), build(ListArgs, args)
    serving: dict = {}
    if what.gateway and what.admin_token:
        serving = AdminClient(what.gateway, what.admin_token).weights()["replicas"]
    print(f"{'version':>7} {'kind':5} {'base':>4} {'raw MB':>8} {'sent MB':>8} {'ratio':>7}  replicas")
    for v in store.versions():
        m = store.manifest(v)
        reps = ",".join(sorted(r for r, sv in serving.items() if sv == v))
        print(
            f"{v:>7} {m.kind:5} {'' if m.base_version is None else m.base_version:>4} "
            f"{m.nbytes_raw / 2**20:8.2f} {m.nbytes_compressed / 2**20:8.3f} "
            f"{m.nbytes_raw / max(1, m.nbytes_compressed):7.1f}  {reps}"
        )
    for a in store.activations():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.get("ts", 0)))
        extra = "".join(f" {k}={a[k]}" for k in ("verdict", "by", "replicas", "stable", "trial_s") if k in a)
        print(f"#{a['seq']} {when} {a['type']:8} v{a['version']}{extra}: {a['reason']}")
    return 0


def _serve(args) -> int:
    from aiohttp import web

    from weight_sync.store.server import ServerConfig, Store

    cfg = build(ServerConfig, args)
    app = Store(_cfg(args).store).app(cfg.tracker, token=cfg.token)
    web.run_app(app, host=cfg.host, port=cfg.port, access_log=None)
    return 0


def _agent(args) -> int:
    from weight_sync import fleet_credential
    from weight_sync.agent.loop import Agent, AgentConfig

    cfg = build(AgentConfig, args, gateway_replica_id=args.name)
    if cfg.store_url.startswith("s3://"):
        _s3_url(cfg.store_url)
    else:
        fleet_credential.checked(cfg.store_token, "an agent of a store server")
    Agent(cfg).run()
    return 0
