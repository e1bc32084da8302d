"""`flywheel model bootstrap`: build (or fetch from the cache) the base checkpoint."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="the base model: build it here from a seed")
    msub = p.add_subparsers(dest="model_cmd", required=True)
    b = msub.add_parser("bootstrap", help="train tokenizer + tiny Qwen3-MoE on the synthetic code corpus (cached)")
    b.add_argument("--preset", default="test", choices=["test", "demo"])
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", type=Path, default=None, help="copy the checkpoint here (default: print the cache dir)")
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=_bootstrap)


def _bootstrap(args) -> int:
    from online_rl.bootstrap import bootstrap, report

    path = bootstrap(args.preset, args.seed, args.out, progress=not args.quiet, force=args.force)
    r = report(path)
    summary = {"path": str(path), "parameters": r["parameters"], "final_loss": r["final_loss"],
               **{k: v for k, v in r.get("eval", {}).items() if k.startswith("pass_rate")}, **r["timings"]}
    print(json.dumps(summary))
    return 0
