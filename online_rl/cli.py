"""`flywheel model bootstrap`: build (or fetch from the cache) the base checkpoint."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="the base model: build it here from a seed")
    msub = p.add_subparsers(dest="model_cmd", required=True)
    b = msub.add_parser("bootstrap", help="train tokenizer + tiny Qwen3-MoE on the synthetic code corpus (cached)")
    b.add_argument("--preset", default="test", choices=["test", "agent", "demo"])
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", type=Path, default=None, help="copy the checkpoint here (default: print the cache dir)")
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=_bootstrap)

    n = sub.add_parser("numerics", help="trainer vs served logprobs of the same tokens, router replay on and off")
    n.add_argument("--replica", default=None, help="replica URL (default: start one on the model)")
    n.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: the bootstrap preset)")
    n.add_argument("--preset", default="demo", choices=["test", "demo"])
    n.add_argument("--prompts", type=int, default=16)
    n.add_argument("--max-tokens", type=int, default=24)
    n.add_argument("--json", action="store_true", help="print only the JSON report")
    n.set_defaults(func=_numerics)

    g = sub.add_parser("train-plot", help="draw a trainer's reward and acceptance by version (reward_by_version.png)")
    g.add_argument(
        "--work-dir", type=Path, default=None, help="the trainer's work dir (default $FLYWHEEL_HOME/trainer)"
    )
    g.add_argument("--out", type=Path, default=None, help="default <work-dir>/reward_by_version.png")
    g.set_defaults(func=_train_plot)

    from infra.config import add_flags
    from online_rl.config import TrainerConfig
    from online_rl.offpeak import OffPeakConfig

    t = sub.add_parser("train", help="the online RL trainer daemon (Kafka stream + sandbox rollouts)")
    t.add_argument("--model", type=Path, default=None, help="starting checkpoint (default: the bootstrap preset)")
    t.add_argument("--preset", default="demo", choices=["test", "demo"])
    t.add_argument("--work-dir", type=Path, default=None, help="default $FLYWHEEL_HOME/trainer")
    t.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="ranks (gloo on CPU, NCCL with --device cuda; --shard: how the model spreads)",
    )
    t.add_argument(
        "--offpeak",
        action="store_true",
        help="borrow replicas for rollouts while user load is low (rollouts then run on borrowed replicas only)",
    )
    add_flags(t, TrainerConfig)  # every other flag: declared once, on the config's fields (online_rl.config)
    add_flags(t, OffPeakConfig)
    t.set_defaults(func=_train)


def _bootstrap(args) -> int:
    from online_rl.model.bootstrap import bootstrap, report

    path = bootstrap(args.preset, args.seed, args.out, progress=not args.quiet, force=args.force)
    r = report(path)
    summary = {
        "path": str(path),
        "parameters": r["parameters"],
        "final_loss": r["final_loss"],
        **{k: v for k, v in r.get("eval", {}).items() if k.startswith(("pass_rate", "tool_call_valid_rate"))},
        **r["timings"],
    }
    print(json.dumps(summary))
    return 0


def _numerics(args) -> int:
    from online_rl.model.bootstrap import bootstrap
    from online_rl.numerics import measure

    model = args.model or bootstrap(args.preset, 0, progress=not args.json)
    replica = None
    url = args.replica
    if url is None:
        from serving.replica.process import ReplicaConfig, start

        replica = start(ReplicaConfig(model_path=model))
        url = replica.url
    try:
        report = measure(url, model, args.prompts, args.max_tokens)
    finally:
        if replica is not None:
            replica.stop()
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0


def _train_plot(args) -> int:
    from infra.paths import flywheel_home
    from online_rl.plots import reward_by_version

    work = args.work_dir or flywheel_home() / "trainer"
    print(reward_by_version(work / "history.json", args.out or work / "reward_by_version.png"))
    return 0


def _train(args) -> int:
    from infra.config import build
    from infra.paths import flywheel_home
    from online_rl.config import PublisherConfig, RolloutConfig, TrainerConfig
    from online_rl.model.bootstrap import bootstrap
    from online_rl.offpeak import OffPeakConfig
    from online_rl.trainer.loop import Trainer
    from online_rl.trainer.ranks import run_distributed

    rollouts = build(RolloutConfig, args, replicas="borrowed" if args.offpeak else "any")
    publish = build(PublisherConfig, args)
    publish.key = publish.key or flywheel_home() / "weights" / "keys" / "signing.pem"
    offpeak = None
    if args.offpeak:
        if not rollouts.gateway_url or not rollouts.admin_token:
            raise ValueError("--offpeak needs the gateway and its admin token (--gateway, FLYWHEEL_ADMIN_TOKEN)")
        offpeak = build(OffPeakConfig, args, gateway_url=rollouts.gateway_url, admin_token=rollouts.admin_token)
    cfg = build(
        TrainerConfig,
        args,
        model_dir=args.model or bootstrap(args.preset, 0),
        work_dir=args.work_dir or flywheel_home() / "trainer",
        publish=publish,
        rollouts=rollouts,
        offpeak=offpeak,
    )
    run_distributed(cfg, args.nproc, Trainer)
    return 0
