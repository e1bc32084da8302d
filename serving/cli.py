"""`flywheel replica start|stop|status`: SGLang replicas on this machine."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from infra.config import add_flags, build, option, resolve


@dataclass
class StopArgs:
    port: int | None = option(None, help="the replica's port")
    all: bool = option(False, help="every replica started from this machine")


@dataclass
class ServeArgs:
    """Where `flywheel serve` finds its replicas, model and state (the rest: serving.config.GatewayConfig)."""

    replicas: list[str] = option(
        default_factory=list,
        flag="replica",
        help="replica base URL (repeat); default: every replica started on this machine",
    )
    model: Path | None = option(None, help="model dir (tokenizer); None: the replicas' model")
    state_dir: Path | None = option(None, help="event spool and id secret (None: $FLYWHEEL_HOME/gateway)")
    keys_file: Path | None = option(None, help="hashed API keys (see `flywheel keys add`; None: <state-dir>/keys.json)")


@dataclass
class FleetArgs:
    gateway: str = option("http://127.0.0.1:8000", env="FLYWHEEL_GATEWAY_URL", help="the gateway's URL")
    admin_token: str | None = option(
        None, env="FLYWHEEL_ADMIN_TOKEN", cli=False, repr=False, help="the gateway's admin token"
    )  # environment only (DESIGN: Trust)


@dataclass
class KeysFile:
    keys_file: Path | None = option(None, help="the gateway's keys (None: $FLYWHEEL_HOME/gateway/keys.json)")


@dataclass
class TenantName:
    name: str = option(help="the tenant")


@dataclass
class PolicyArgs:
    train: Literal["allow", "deny"] | None = option(None, help="deny: served and counted, never logged or trained")
    retention_days: float | None = option(None, help="its events older than this are not trained on (0: none)")


def _command(p: argparse.ArgumentParser, func, *classes) -> None:
    """p's flags from `classes`; func called with them resolved (infra.config.resolve)."""
    for cls in classes:
        add_flags(p, cls)
    p.set_defaults(func=lambda args: func(resolve(args, *classes)))


def register(sub: argparse._SubParsersAction) -> None:
    from serving.config import GatewayConfig
    from serving.replica.process import ReplicaConfig

    p = sub.add_parser("replica", help="SGLang serving replicas (CPU flags and compat layer on a CPU machine)")
    rsub = p.add_subparsers(dest="replica_cmd", required=True)
    s = rsub.add_parser("start", help="launch a replica in the background and wait until it generates")
    add_flags(s, ReplicaConfig)  # declared once, on the config's fields (serving.replica.process)
    s.set_defaults(func=_start)
    t = rsub.add_parser("stop", help="stop a replica by port (or all with --all)")
    _command(t, _stop, StopArgs)
    st = rsub.add_parser("status", help="replicas started from this machine")
    st.set_defaults(func=_status)

    g = sub.add_parser("serve", help="run the OpenAI-compatible gateway in front of SGLang replicas")
    add_flags(g, ServeArgs)
    add_flags(g, GatewayConfig)  # the rest: declared once, on the config's fields (serving.config)
    g.set_defaults(func=_serve)

    f = sub.add_parser("fleet", help="SRE view of the fleet behind a gateway (admin token)")
    fsub = f.add_subparsers(dest="fleet_cmd", required=True)
    for name, doc in (
        ("status", "each replica: state, load, version"),
        ("borrow", "lend a replica to rollouts"),
        ("return", "give a borrowed replica back to users"),
        ("drain", "stop routing users to it"),
        ("activate", "route users to it again"),
    ):
        q = fsub.add_parser(name, help=doc)
        if name != "status":
            q.add_argument("replica", help="replica id, e.g. r0")
        _command(q, _fleet, FleetArgs)

    k = sub.add_parser("keys", help="API keys of the gateway (stored hashed)")
    ksub = k.add_subparsers(dest="keys_cmd", required=True)
    ka = ksub.add_parser("add", help="create a key for a tenant; prints it once")
    _command(ka, _keys_add, TenantName, KeysFile)
    kl = ksub.add_parser("list", help="tenants, their key ids and privacy policies")
    _command(kl, _keys_list, KeysFile)
    kp = ksub.add_parser(
        "policy", help="a tenant's training policy and retention (running gateways apply it within a second)"
    )
    _command(kp, _keys_policy, TenantName, PolicyArgs, KeysFile)


def replica_config(args: argparse.Namespace):
    """`flywheel replica start`'s flags (else FLYWHEEL_REPLICA_THREADS for --threads, else the defaults)."""
    from serving.replica.process import ReplicaConfig

    return build(ReplicaConfig, args)


def _start(args) -> int:
    import time

    from serving.replica.process import start

    cfg = replica_config(args)
    t0 = time.monotonic()
    r = start(cfg, die_with_parent=False)  # the command returns; the replica stays
    print(json.dumps({"url": r.url, "pid": r.pid, "log": str(r.log_file), "start_s": round(time.monotonic() - t0, 1)}))
    return 0


def _stop(args) -> int:
    from serving.replica.process import find, running

    if args.all:
        targets = running()
    elif args.port:
        r = find(args.port)
        targets = [r] if r else []
    else:
        raise ValueError("give --port P or --all")
    if not targets:
        print("no replica running")
    ok = True
    for r in targets:
        stopped = r.stop()
        ok &= stopped
        print(f"{'stopped' if stopped else 'could not stop'} replica on port {r.port} (pid {r.pid})")
    return 0 if ok else 1


def _status(args) -> int:
    from serving.replica.process import healthy, running

    for r in running():
        try:
            h = healthy(r.url)
        except Exception:
            h = False
        print(json.dumps({"url": r.url, "pid": r.pid, "healthy": h, "model": r.model_path, "log": str(r.log_file)}))
    return 0


def _serve(args) -> int:
    from infra.paths import flywheel_home
    from serving.config import GatewayConfig
    from serving.gateway import run
    from serving.replica.process import running

    where = build(ServeArgs, args)
    replicas = where.replicas
    model = where.model
    if not replicas:
        local = running()
        replicas = [r.url for r in local]
        model = model or (Path(local[0].model_path) if local else None)
    if not replicas:
        raise ValueError("no replica: pass --replica URL or start one with `flywheel replica start`")
    if model is None:
        raise ValueError("pass --model DIR (the served checkpoint, for its tokenizer)")
    state = where.state_dir or flywheel_home() / "gateway"
    keys_file = where.keys_file or state / "keys.json"
    cfg = build(GatewayConfig, args, replicas=replicas, model_dir=model, state_dir=state, keys_file=keys_file)
    run(cfg)
    return 0


def _keys_add(args) -> int:
    from infra.paths import flywheel_home
    from serving.auth import add_key

    path = args.keys_file or flywheel_home() / "gateway" / "keys.json"
    key = add_key(path, args.name)
    print(key)
    return 0


def _keys_path(args) -> Path:
    from infra.paths import flywheel_home

    return args.keys_file or flywheel_home() / "gateway" / "keys.json"


def _keys_list(args) -> int:
    from serving.auth import KeyStore

    store = KeyStore.load(_keys_path(args))
    print(f"{'tenant':20} {'train':5} {'retention':>9}  key ids")
    for name, ids in store.tenants().items():
        p = store.policy(name)
        retention = "-" if p.retention_days is None else f"{p.retention_days:g}d"
        print(f"{name:20} {p.train:5} {retention:>9}  {','.join(ids)}")
    return 0


def _keys_policy(args) -> int:
    from serving.auth import KeyStore, set_policy

    path = _keys_path(args)
    if args.name not in KeyStore.load(path).tenants():
        raise ValueError(f"no tenant {args.name!r} in {path} (`flywheel keys add --name {args.name}` first)")
    changes = {k: v for k, v in (("train", args.train), ("retention_days", args.retention_days)) if v is not None}
    if not changes:
        raise ValueError("give --train and/or --retention-days")
    if changes.get("retention_days") == 0:
        changes["retention_days"] = None
    print(json.dumps({"name": args.name, "policy": set_policy(path, args.name, **changes).view()}))
    return 0


def _fleet(args) -> int:
    import urllib.error

    from admin_api.client import AdminClient

    if not args.admin_token:
        raise ValueError("the admin token is needed: set FLYWHEEL_ADMIN_TOKEN (it never goes on a command line)")
    admin = AdminClient(args.gateway, args.admin_token)
    if args.fleet_cmd != "status":
        try:
            print(json.dumps(admin.replica_action(args.replica, args.fleet_cmd)))
        except urllib.error.HTTPError as e:
            raise RuntimeError(json.loads(e.read())["error"]["message"]) from None
        return 0
    load = admin.load()
    print(
        f"{'replica':8} {'state':9} {'healthy':7} {'users':>5} {'rollouts':>8} {'queue':>5} {'req/s':>6} version  url"
    )
    for x in load["replicas"]:
        state = x["state"] + ("*" if x["borrow_pending"] else "")
        print(
            f"{x['id']:8} {state:9} {str(x['healthy']):7} {x['outstanding']:>5} {x['rollout_outstanding']:>8} "
            f"{x['queue_depth']:>5} {x['request_rate']:>6.2f} {str(x['weight_version']):8} {x['url']}"
        )
    f = load["fleet"]
    print(
        f"fleet: {f['active']} active, {f['borrowed']} borrowed, {f['in_flight']} user requests in flight, "
        f"{f['load_per_active']:.2f} per active replica   (* = draining before it is borrowed)"
    )
    return 0
