"""`flywheel tenants list|policy|forget|provenance`: tenants' privacy, for the operator.

list, policy and forget go through a gateway's admin API (serving.api.tenants): the change is in effect
(spool redacted, records on their way to the trainer) when the command returns. provenance reads the
trainer's per-version records (online_rl.data.provenance): the versions whose weights saw the tenant's samples,
which are the ones to roll back or retrain from after a deletion (weights are never un-trained).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from admin_api.client import AdminClient
from admin_api.types import ForgetRequest, PolicyChange
from infra.config import add_flags, option, resolve


@dataclass
class GatewayArgs:
    gateway: str = option("http://127.0.0.1:8000", env="FLYWHEEL_GATEWAY_URL", help="the gateway's URL")
    admin_token: str | None = option(
        None, env="FLYWHEEL_ADMIN_TOKEN", cli=False, repr=False, help="the gateway's admin token"
    )  # environment only (DESIGN: Trust)
    json: bool = option(False, help="print the gateway's answer as JSON")


@dataclass
class PolicyArgs:
    train: Literal["allow", "deny"] | None = option(None, help="deny: served and counted, never logged or trained")
    retention_days: float | None = option(None, help="its events older than this are not trained on (0: none)")


@dataclass
class ForgetArgs:
    deny: bool = option(False, help="also stop logging and training on what comes next")


@dataclass
class ProvenanceArgs:
    trainer_dir: Path = option(help="the trainer's --work-dir")
    keys_file: Path | None = option(None, help="the gateway's keys (None: $FLYWHEEL_HOME/gateway/keys.json)")


T = TypeVar("T")


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("tenants", help="tenants' privacy: training opt-out, retention, deletion, provenance")
    tsub = t.add_subparsers(dest="tenants_cmd", required=True)

    def command(name: str, func, own, help: str, positional: str | None = None):
        p = tsub.add_parser(name, help=help)
        if positional is not None:
            p.add_argument("name", help=positional or None)
        for cls in (*own, GatewayArgs):
            add_flags(p, cls)
        p.set_defaults(func=lambda args: func(resolve(args, *own, GatewayArgs)))

    command("list", _list, (), "every tenant, its key ids and policy")
    command("policy", _policy, (PolicyArgs,), "set a tenant's training policy and retention", "")
    forget = "delete a tenant's events up to now from every buffer that holds them"
    command("forget", _forget, (ForgetArgs,), forget, "")
    command(
        "provenance",
        _provenance,
        (ProvenanceArgs,),
        "the published versions trained on a tenant's samples",
        "tenant name (its key ids are read from --keys-file, else the gateway)",
    )


def _call(args, ask: Callable[[AdminClient], T]) -> T:
    """One call on the gateway's admin API, its refusal a clear error."""
    import urllib.error

    if not args.admin_token:
        raise ValueError("the admin token is needed: set FLYWHEEL_ADMIN_TOKEN (it never goes on a command line)")
    try:  # longer than the gateway's own wait for its spool, so its 503 is what we show
        return ask(AdminClient(args.gateway, args.admin_token, timeout=60))
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            message = json.loads(raw)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = raw[:200].decode("utf-8", "replace") or e.reason
        raise RuntimeError(f"{e.code}: {message}") from None
    except urllib.error.URLError as e:
        raise RuntimeError(f"cannot reach the gateway at {args.gateway}: {e.reason}") from None


def _line(t: Mapping[str, Any]) -> str:
    p = t["policy"]
    retention = "-" if p["retention_days"] is None else f"{p['retention_days']:g}d"
    forgotten = "-" if p["forgotten_before"] is None else f"{p['forgotten_before']:.0f}"
    limited = sum(t.get("limited", {}).values())  # a gateway from before limits were counted by tenant here: none
    return f"{t['name']:20} {p['train']:5} {retention:>9} {forgotten:>12} {limited:>7}  {','.join(t['ids'])}"


def _print(args, answer: Mapping[str, Any], tenants: Sequence[Mapping[str, Any]]) -> None:
    if args.json:
        print(json.dumps(answer, indent=2))
        return
    print(f"{'tenant':20} {'train':5} {'retention':>9} {'forgotten':>12} {'limited':>7}  key ids")
    for t in tenants:
        print(_line(t))


def _list(args) -> int:
    answer = _call(args, lambda admin: admin.tenants())
    _print(args, answer, answer["tenants"])
    return 0


def _policy(args) -> int:
    body = PolicyChange()
    if args.train is not None:
        body["train"] = args.train
    if args.retention_days is not None:
        body["retention_days"] = args.retention_days
    if not body:
        raise ValueError("give --train and/or --retention-days")
    answer = _call(args, lambda admin: admin.set_policy(args.name, body))
    _print(args, answer, [answer])
    return 0


def _forget(args) -> int:
    answer = _call(args, lambda admin: admin.forget(args.name, ForgetRequest(train="deny") if args.deny else {}))
    _print(args, answer, [answer])
    if not args.json:
        print(
            f"forgotten: every event of {args.name} up to {answer['forgotten_before']:.3f}. Weights already trained "
            f"on them are not un-trained: `flywheel tenants provenance {args.name} --trainer-dir DIR` lists them."
        )
    return 0


def _ids(args) -> list[str]:
    from infra.paths import flywheel_home
    from serving.auth import KeyStore

    keys_file = args.keys_file or flywheel_home() / "gateway" / "keys.json"
    if keys_file.exists():
        ids = KeyStore.load(keys_file).tenants().get(args.name)
        if ids:
            return ids
    if args.admin_token:
        return _call(args, lambda admin: admin.tenant(args.name))["ids"]
    raise ValueError(f"no tenant {args.name!r} in {keys_file} (or give --gateway, with FLYWHEEL_ADMIN_TOKEN set)")


def _provenance(args) -> int:
    from online_rl.data.provenance import versions_for

    if not Path(args.trainer_dir).is_dir():
        raise FileNotFoundError(f"no trainer work dir at {args.trainer_dir}")
    ids = _ids(args)
    versions = versions_for(args.trainer_dir, set(ids))
    if args.json:
        print(json.dumps({"name": args.name, "ids": ids, "versions": versions}, indent=2))
        return 0
    if not versions:
        print(f"no published version in {args.trainer_dir} was trained on samples of {args.name}")
        return 0
    print(f"versions trained on {args.name}'s samples ({', '.join(ids)}); distilled: contexts it commented on")
    print(f"{'version':>7} {'step':>7} {'new':>6} {'total':>6} {'distilled':>9}  published")
    for v in versions:
        when = "-" if v["published"] is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(v["published"]))
        step = "-" if v["step"] is None else v["step"]
        if v.get("unknown"):  # nothing proves it did not see them: listed, and says why
            print(f"{v['version']:>7} {step:>7} {'?':>6} {'?':>6} {'?':>9}  {when}  unknown: {v.get('why', '')}")
            continue
        new, total = sum(v["tenants"].values()), sum(v["tenants_total"].values())
        distilled = sum(v.get("distilled_total", {}).values())
        print(f"{v['version']:>7} {step:>7} {new:>6} {total:>6} {distilled:>9}  {when}")
    return 0
