"""`flywheel kafka fetch|start|stop|status`: the local single-node broker."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    from flywheel.kafka.broker import BrokerConfig
    from infra.config import add_flags

    p = sub.add_parser("kafka", help="run a local Kafka 4 broker (KRaft, broker+controller)")
    ksub = p.add_subparsers(dest="kafka_cmd", required=True)
    for name, fn, doc in [
        ("fetch", _fetch, "resolve the broker jars from Maven Central into the cache"),
        ("start", _start, "start a broker (127.0.0.1, free ports, by default), wait until it serves, make the topics"),
        ("stop", _stop, "stop the broker of a data dir (by PID)"),
        ("status", _status, "is the broker of a data dir running and answering"),
    ]:
        q = ksub.add_parser(name, help=doc)
        if name != "fetch":  # stop and status: only the data dir says which broker
            add_flags(q, BrokerConfig, skip=() if name == "start" else ("port", "host", "heap"))
        q.set_defaults(func=fn)


def _cfg(args):
    from flywheel.kafka.broker import BrokerConfig
    from infra.config import build

    return build(BrokerConfig, args)


def _fetch(args) -> int:
    from flywheel.kafka.broker import fetch_jars

    print(fetch_jars())
    return 0


def _start(args) -> int:
    import time

    from flywheel.kafka.broker import start
    from infra import kafka_auth
    from infra.kafka_admin import ensure_topics

    cfg = _cfg(args)
    t0 = time.monotonic()
    b = start(cfg, die_with_parent=False)  # the command returns; the broker stays
    try:
        # Made by the operator, now: no role may create a topic (infra.kafka_auth), so a gateway's first
        # event to a broker without them would be refused rather than create its topic.
        with kafka_auth.acting_as(b.client_env("admin")):
            ensure_topics(b.bootstrap)
    except BaseException:
        b.stop()
        raise
    print(
        json.dumps(
            {
                "bootstrap": b.bootstrap,
                "pid": b.pid,
                "data_dir": str(b.data_dir),
                "log": str(b.log_file),
                # Each role's password and the CA (files of its owner's alone): hand a process its role's.
                "security_dir": str(b.security.dir) if b.security else None,
                "start_s": round(time.monotonic() - t0, 1),
            }
        )
    )
    return 0


def _stop(args) -> int:
    from flywheel.kafka.broker import running

    b = running(_cfg(args).data_dir)
    if b is None:
        print("no broker running")
        return 0
    ok = b.stop()
    print(f"stopped pid {b.pid}" if ok else f"pid {b.pid} did not stop")
    return 0 if ok else 1


def _status(args) -> int:
    from flywheel.kafka.broker import metadata_ok, running

    b = running(_cfg(args).data_dir)
    if b is None:
        print(json.dumps({"running": False}))
        return 1
    try:
        answering = metadata_ok(b.bootstrap)
    except Exception:
        answering = False
    print(
        json.dumps(
            {"running": True, "answering": answering, "pid": b.pid, "bootstrap": b.bootstrap, "log": str(b.log_file)}
        )
    )
    return 0 if answering else 1
