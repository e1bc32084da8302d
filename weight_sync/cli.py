"""`flywheel weights ...`: keys, publish, list, rollback, pin/unpin, the store server, and the agent."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from infra.config import env


def _home() -> Path:
    from infra.paths import flywheel_home

    return flywheel_home() / "weights"


def register(sub: argparse._SubParsersAction) -> None:
    from weight_sync.agent.switch import MODES

    p = sub.add_parser("weights", help="versions of the served weights: publish, list, rollback, pin, agents")
    w = p.add_subparsers(dest="weights_cmd", required=True)

    def common(q, kafka=True):
        q.add_argument("--store", type=Path, default=None, help="store dir (default $FLYWHEEL_HOME/weights/store)")
        if kafka:
            q.add_argument(
                "--kafka",
                default=env("FLYWHEEL_KAFKA_BOOTSTRAP"),
                help="bootstrap servers for announcements (default $FLYWHEEL_KAFKA_BOOTSTRAP)",
            )
        q.add_argument(
            "--key", type=Path, default=None, help="signing key (default $FLYWHEEL_HOME/weights/keys/signing.pem)"
        )

    k = w.add_parser("keygen", help="create the trainer's ed25519 signing key pair")
    k.add_argument("--out", type=Path, default=None, help="default $FLYWHEEL_HOME/weights/keys")
    k.set_defaults(func=_keygen)

    pub = w.add_parser("publish", help="publish a checkpoint as the next version (what the trainer calls)")
    pub.add_argument("--checkpoint", type=Path, required=True)
    pub.add_argument("--full", action="store_true", help="a full snapshot even if a delta is possible")
    pub.add_argument("--full-every", type=int, default=10)
    pub.add_argument("--store-url", default=env("FLYWHEEL_STORE_URL"), help="where agents fetch from")
    pub.add_argument(
        "--s3-url",
        default=env("FLYWHEEL_S3_URL"),
        help="also upload to this bucket, s3://BUCKET/PREFIX, and announce it there (endpoint and credentials: "
        "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION; default $FLYWHEEL_S3_URL)",
    )
    common(pub)
    pub.set_defaults(func=_publish)

    ls = w.add_parser("list", help="versions, sizes, ratios, activations, and which replica runs which")
    ls.add_argument("--gateway", default=env("FLYWHEEL_GATEWAY_URL"))
    ls.set_defaults(admin_token=env("FLYWHEEL_ADMIN_TOKEN"))  # environment only (DESIGN: Trust)
    common(ls, kafka=False)
    ls.set_defaults(func=_list)

    rb = w.add_parser("rollback", help="activate an older version on every replica (a new activation)")
    rb.add_argument("--to", type=int, required=True)
    rb.add_argument("--reason", default="rollback by SRE")
    common(rb)
    rb.set_defaults(func=lambda a: _activate(a, a.to, "activate", a.reason))

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

    can = w.add_parser(
        "canary",
        help="run the canary controller: trial each version the trainer publishes "
        "with --canary, then promote or roll back",
    )
    can.add_argument("--gateway", default=env("FLYWHEEL_GATEWAY_URL"), required=False)
    can.set_defaults(admin_token=env("FLYWHEEL_ADMIN_TOKEN"))
    can.add_argument("--replica-share", type=float, default=0.5)
    can.add_argument("--traffic-share", type=float, default=0.5)
    can.add_argument("--min-feedback", type=int, default=100, help="feedback events per arm before judging")
    can.add_argument("--margin", type=float, default=0.05, help="acceptance drop still promoted")
    can.add_argument("--confidence", type=float, default=0.95)
    can.add_argument("--p99-ratio", type=float, default=1.5)
    can.add_argument("--max-trial", type=float, default=900.0, help="seconds before an undecided trial rolls back")
    can.add_argument(
        "--tool-min-answers",
        type=int,
        default=100,
        help="tool-call answers per arm before the malformed-call rate is judged",
    )
    can.add_argument(
        "--tool-margin",
        type=float,
        default=0.05,
        help="malformed-call rate above stable's that rolls back (with confidence)",
    )
    can.add_argument(
        "--max-tenant-share",
        type=float,
        default=0.5,
        help="of an arm's counted votes, the most one tenant's count for (1: no cap; weight_sync.canary.votes)",
    )
    common(can)
    can.set_defaults(func=_canary)

    srv = w.add_parser(
        "serve",
        help="serve the store over HTTP (range requests) for the agents, who must show the fleet read credential "
        "($FLYWHEEL_STORE_TOKEN, which this server reads too)",
    )
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8100)
    srv.add_argument(
        "--relay-fanout",
        type=int,
        default=2,
        help="peers each agent's relay is sent per piece (a tree of this degree); 0: serve everything here",
    )
    common(srv, kafka=False)
    srv.set_defaults(func=_serve, store_token=env("FLYWHEEL_STORE_TOKEN"))  # environment only (DESIGN: Trust)

    ag = w.add_parser("agent", help="run the weight agent of one replica (follows the weights topic)")
    ag.add_argument("--name", required=True, help="agent name (the replica's id in the gateway, e.g. r0)")
    ag.add_argument("--replica", required=True, help="replica base URL")
    ag.add_argument(
        "--store-url",
        required=True,
        help="the store server's URL, or a bucket: s3://BUCKET/PREFIX (endpoint and credentials from AWS_*)",
    )
    ag.add_argument("--public-key", type=Path, default=None, help="default $FLYWHEEL_HOME/weights/keys/signing.pub")
    ag.add_argument("--initial-model", type=Path, required=True, help="the checkpoint the replica started with")
    ag.add_argument("--work-dir", type=Path, default=None)
    ag.add_argument("--kafka", default=env("FLYWHEEL_KAFKA_BOOTSTRAP"))
    ag.add_argument(
        "--gateway",
        default=env("FLYWHEEL_GATEWAY_URL"),
        help="the gateway's URL, or every gateway's, comma-separated (the replica is drained on each)",
    )
    ag.set_defaults(admin_token=env("FLYWHEEL_ADMIN_TOKEN"), store_token=env("FLYWHEEL_STORE_TOKEN"))
    ag.add_argument("--switch-mode", default="drain", choices=MODES)
    ag.add_argument(
        "--no-inplace",
        dest="inplace",
        action="store_false",
        help="always reload whole checkpoints from disk (default: a delta is applied in place, on the same host)",
    )
    ag.add_argument("--metrics-port", type=int, default=0)
    ag.add_argument("--metrics-host", default="127.0.0.1", help="address /metrics listens on")
    ag.add_argument(
        "--relay-port", type=int, default=0, help="serve verified pieces to peer agents on this port (0: no relay)"
    )
    ag.add_argument("--relay-host", default="127.0.0.1", help="address the relay listens on")
    ag.add_argument("--relay-url", default=None, help="URL peers reach the relay at (default http://HOST:PORT)")
    ag.set_defaults(func=_agent)


def _store(args) -> Path:
    return args.store or _home() / "store"


def _key(args) -> Path:
    return args.key or _home() / "keys" / "signing.pem"


def _keygen(args) -> int:
    from weight_sync.manifest import generate_key

    out = args.out or _home() / "keys"
    if (out / "signing.pem").exists():
        raise ValueError(f"{out / 'signing.pem'} exists; refusing to overwrite a signing key")
    kid = generate_key(out / "signing.pem", out / "signing.pub")
    print(json.dumps({"key_id": kid, "private": str(out / "signing.pem"), "public": str(out / "signing.pub")}))
    return 0


def _cfg(args):
    from weight_sync.publish import PublishConfig

    return PublishConfig(
        store=_store(args),
        private_key=_key(args),
        kafka_bootstrap=getattr(args, "kafka", None),
        store_url=getattr(args, "store_url", None),
        s3_url=_s3_url(getattr(args, "s3_url", None)),
        full_every=getattr(args, "full_every", 10),
        progress=True,
    )


def _s3_url(url: str | None) -> str | None:
    """A bucket URL checked before anything is published or followed (a typo fails here, not mid-publish)."""
    if url:
        from weight_sync.store.s3 import parse_url

        parse_url(url)
    return url


def _publish(args) -> int:
    from weight_sync.publish import publish

    cfg = _cfg(args)
    try:
        r = publish(args.checkpoint, cfg, force_full=args.full)
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


def _abort(args) -> int:
    from weight_sync.store.server import Store

    trials = [a for a in Store(_store(args)).activations() if a["type"] == "canary" and a["version"] == args.version]
    if not trials:
        raise ValueError(f"no canary trial of v{args.version} in the store's activations")
    return _activate(args, args.version, "rollback", "aborted by SRE override", stable=trials[-1]["stable"])


def _canary(args) -> int:
    from weight_sync.canary.controller import CanaryConfig, CanaryController

    if not (args.gateway and args.admin_token and args.kafka):
        raise ValueError(
            "the canary controller needs --gateway and --kafka (or their env vars) and FLYWHEEL_ADMIN_TOKEN"
        )
    cfg = CanaryConfig(
        gateway_url=args.gateway,
        admin_token=args.admin_token,
        publish=_cfg(args),
        replica_share=args.replica_share,
        traffic_share=args.traffic_share,
        min_feedback=args.min_feedback,
        margin=args.margin,
        confidence=args.confidence,
        p99_ratio=args.p99_ratio,
        max_trial_s=args.max_trial,
        tool_min_answers=args.tool_min_answers,
        tool_margin=args.tool_margin,
        max_tenant_share=args.max_tenant_share,
    )
    CanaryController(cfg).run()
    return 0


def _list(args) -> int:
    from admin_api.client import AdminClient
    from weight_sync.store.server import Store

    store = Store(_store(args))
    serving: dict = {}
    if args.gateway and args.admin_token:
        serving = AdminClient(args.gateway, args.admin_token).weights()["replicas"]
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
        extra = "".join(f" {k}={a[k]}" for k in ("replicas", "stable", "trial_s") if k in a)
        print(f"#{a['seq']} {when} {a['type']:8} v{a['version']}{extra}: {a['reason']}")
    return 0


def _serve(args) -> int:
    from aiohttp import web

    from weight_sync.store.server import Store
    from weight_sync.store.tracker import TrackerConfig

    app = Store(_store(args)).app(TrackerConfig(fanout=args.relay_fanout), token=args.store_token)
    web.run_app(app, host=args.host, port=args.port, access_log=None)
    return 0


def _agent(args) -> int:
    from weight_sync import fleet_credential
    from weight_sync.agent.loop import Agent, AgentConfig

    if args.store_url.startswith("s3://"):
        _s3_url(args.store_url)
    else:
        fleet_credential.checked(args.store_token, "an agent of a store server")
    cfg = AgentConfig(
        name=args.name,
        replica_url=args.replica,
        store_url=args.store_url,
        public_key=args.public_key or _home() / "keys" / "signing.pub",
        work_dir=args.work_dir or _home() / "agents" / args.name,
        initial_model=args.initial_model,
        kafka_bootstrap=args.kafka,
        gateway_url=args.gateway,
        admin_token=args.admin_token,
        gateway_replica_id=args.name,
        switch_mode=args.switch_mode,
        inplace=args.inplace,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        relay_port=args.relay_port,
        relay_host=args.relay_host,
        relay_url=args.relay_url,
        store_token=args.store_token,
    )
    Agent(cfg).run()
    return 0
