"""`flywheel hosts up N | list | down K | down --all`: test hosts (flywheel.hosts.netns) on this machine."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from infra.config import add_flags, build, option


@dataclass
class DownArgs:
    all: bool = option(False, help="every recorded set not in use by a running process")
    force: bool = option(False, help="also sets a running process owns (its servers die)")


def register(sub: argparse._SubParsersAction) -> None:
    from flywheel.hosts.netns import HostsConfig

    p = sub.add_parser("hosts", help="test hosts: network namespaces on a bridge, addressed from 198.18.0.0/15")
    hsub = p.add_subparsers(dest="hosts_cmd", required=True)
    up = hsub.add_parser("up", help="make N hosts (they stay until `flywheel hosts down K`); prints them")
    up.add_argument("n", type=int)
    add_flags(up, HostsConfig)
    up.set_defaults(func=_up)
    hsub.add_parser("list", help="the sets recorded here").set_defaults(func=_list)
    down = hsub.add_parser("down", help="remove a set (and end what runs in it)")
    down.add_argument("k", type=int, nargs="?", help="the set's number (see list)")
    add_flags(down, DownArgs)
    down.set_defaults(func=_down)


def _up(args) -> int:
    from flywheel.hosts.netns import HostsConfig, TestHosts

    hosts = TestHosts.up(build(HostsConfig, args, n=args.n), persistent=True)
    print(json.dumps(hosts.view()))
    print(f"on host i: ip netns exec {hosts.cfg.prefix}{hosts.k}h<i> CMD;  remove: flywheel hosts down {hosts.k}")
    return 0


def _list(args) -> int:
    from flywheel.hosts.netns import recorded

    for state in recorded():
        owner = state.get("owner")
        print(json.dumps({**state, "owner": owner and owner.get("pid")}))
    return 0


def _down(args) -> int:
    from flywheel.hosts.netns import down_recorded, in_use, recorded

    what = build(DownArgs, args)
    if what.all == (args.k is not None):
        raise ValueError("give a set's number K, or --all")
    ks = [int(s["k"]) for s in recorded() if what.force or not in_use(s)] if what.all else [args.k]
    missing = [k for k in ks if not down_recorded(k, force=what.force)]
    if missing:
        raise ValueError(f"no recorded test hosts {missing}")
    print(f"removed test hosts {ks}")
    return 0
