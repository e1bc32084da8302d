"""`flywheel model bootstrap`: build (or fetch from the cache) the base checkpoint."""

from __future__ import annotations

import argparse
import json
import os
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

    t = sub.add_parser("train", help="the online RL trainer daemon (Kafka stream + sandbox rollouts)")
    t.add_argument("--model", type=Path, default=None, help="starting checkpoint (default: the bootstrap preset)")
    t.add_argument("--preset", default="demo", choices=["test", "demo"])
    t.add_argument("--work-dir", type=Path, default=None, help="default $FLYWHEEL_HOME/trainer")
    t.add_argument("--kafka", default=os.environ.get("FLYWHEEL_KAFKA_BOOTSTRAP"))
    t.add_argument("--gateway", default=os.environ.get("FLYWHEEL_GATEWAY_URL"), help="for rollouts (admin path)")
    t.add_argument("--admin-token", default=os.environ.get("FLYWHEEL_ADMIN_TOKEN"))
    t.add_argument("--rollout-tasks", type=int, default=0, help="sandbox tasks per update (0: user feedback only)")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--min-batch", type=int, default=8, help="fewer buffered samples wait (rollouts aside)")
    t.add_argument("--checkpoint-every", type=int, default=1, help="updates between checkpoints + offset commits")
    t.add_argument("--lr", type=float, default=3e-5)
    t.add_argument("--kl", type=float, default=0.05)
    t.add_argument("--staleness", type=int, default=4)
    t.add_argument("--publish-interval", type=float, default=3600.0, help="seconds between published versions")
    t.add_argument("--store", type=Path, default=None, help="weights store to publish into (default: none)")
    t.add_argument(
        "--key", type=Path, default=None, help="signing key (default $FLYWHEEL_HOME/weights/keys/signing.pem)"
    )
    t.add_argument("--store-url", default=os.environ.get("FLYWHEEL_STORE_URL"))
    t.add_argument("--max-steps", type=int, default=None)
    t.add_argument("--nproc", type=int, default=1, help="data-parallel ranks (gloo on CPU)")
    t.add_argument(
        "--canary",
        action="store_true",
        help="announce new versions as canary candidates (flywheel weights canary judges them)",
    )
    t.add_argument(
        "--train-on-rolled-back",
        action="store_true",
        help="keep learning from samples of versions a canary trial rolled back",
    )
    t.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / ranks)")
    t.add_argument(
        "--batch-invariant",
        action="store_true",
        help="batch-invariant kernels in the model (slower; a row's logprobs never depend on its batch)",
    )
    t.add_argument("--metrics-port", type=int, default=0)
    t.add_argument(
        "--offpeak",
        action="store_true",
        help="borrow replicas for rollouts while user load is low (rollouts then run on borrowed replicas only)",
    )
    t.add_argument("--low-water", type=float, default=0.5, help="user requests per active replica to borrow under")
    t.add_argument("--high-water", type=float, default=2.0, help="user requests per active replica to return over")
    t.add_argument("--hold", type=float, default=10.0, help="seconds of low load before borrowing")
    t.set_defaults(func=_train)


def _bootstrap(args) -> int:
    from online_rl.bootstrap import bootstrap, report

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
    from online_rl.bootstrap import bootstrap
    from online_rl.numerics import measure

    model = args.model or bootstrap(args.preset, 0, progress=not args.json)
    replica = None
    url = args.replica
    if url is None:
        from serving.replica import ReplicaConfig, start

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
    from flywheel.core.paths import flywheel_home
    from online_rl.plots import reward_by_version

    work = args.work_dir or flywheel_home() / "trainer"
    print(reward_by_version(work / "history.json", args.out or work / "reward_by_version.png"))
    return 0


def _train(args) -> int:
    from flywheel.core.paths import flywheel_home
    from online_rl.bootstrap import bootstrap
    from online_rl.loss import LossConfig
    from online_rl.offpeak import OffPeakConfig
    from online_rl.publisher import PublisherConfig
    from online_rl.rollouts import RolloutConfig
    from online_rl.trainer import TrainerConfig, run_distributed
    from online_rl.update import OptimConfig

    cfg = TrainerConfig(
        model_dir=args.model or bootstrap(args.preset, 0),
        work_dir=args.work_dir or flywheel_home() / "trainer",
        kafka_bootstrap=args.kafka,
        batch_size=args.batch_size,
        min_batch=args.min_batch,
        checkpoint_every=args.checkpoint_every,
        staleness=args.staleness,
        publish=PublisherConfig(
            store=args.store,
            key=args.key or flywheel_home() / "weights" / "keys" / "signing.pem",
            store_url=args.store_url,
            canary=args.canary,
            interval_s=args.publish_interval,
        ),
        max_steps=args.max_steps,
        metrics_port=args.metrics_port,
        threads=args.threads,
        batch_invariant=args.batch_invariant,
        train_on_rolled_back=args.train_on_rolled_back,
        loss=LossConfig(kl_coef=args.kl),
        optim=OptimConfig(lr=args.lr),
        rollouts=RolloutConfig(
            gateway_url=args.gateway,
            admin_token=args.admin_token,
            tasks_per_step=args.rollout_tasks,
            replicas="borrowed" if args.offpeak else "any",
        ),
        offpeak=OffPeakConfig(
            gateway_url=args.gateway,
            admin_token=args.admin_token,
            low_water=args.low_water,
            high_water=args.high_water,
            hold_s=args.hold,
        )
        if args.offpeak
        else None,
    )
    run_distributed(cfg, args.nproc)
    return 0
