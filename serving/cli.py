"""`flywheel replica start|stop|status`: SGLang replicas on this machine."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replica", help="SGLang serving replicas (CPU flags and compat layer on a CPU machine)")
    rsub = p.add_subparsers(dest="replica_cmd", required=True)
    s = rsub.add_parser("start", help="launch a replica in the background and wait until it generates")
    s.add_argument("--model", type=Path, required=True, help="checkpoint dir (Hugging Face layout)")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default="float32")
    s.add_argument("--max-total-tokens", type=int, default=32768, help="KV pool bound (tokens)")
    s.add_argument("--weight-version", default="0")
    s.set_defaults(func=_start)
    t = rsub.add_parser("stop", help="stop a replica by port (or all with --all)")
    t.add_argument("--port", type=int)
    t.add_argument("--all", action="store_true")
    t.set_defaults(func=_stop)
    st = rsub.add_parser("status", help="replicas started from this machine")
    st.set_defaults(func=_status)


def _start(args) -> int:
    import time

    from serving.replica import ReplicaConfig, start

    cfg = ReplicaConfig(model_path=args.model, port=args.port, device=args.device, dtype=args.dtype,
                        max_total_tokens=args.max_total_tokens, weight_version=args.weight_version)
    t0 = time.monotonic()
    r = start(cfg)
    print(json.dumps({"url": r.url, "pid": r.pid, "log": str(r.log_file), "start_s": round(time.monotonic() - t0, 1)}))
    return 0


def _stop(args) -> int:
    from serving.replica import find, running

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
    from serving.replica import healthy, running

    for r in running():
        try:
            h = healthy(r.url)
        except Exception:
            h = False
        print(json.dumps({"url": r.url, "pid": r.pid, "healthy": h, "model": r.model_path, "log": str(r.log_file)}))
    return 0
