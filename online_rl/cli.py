"""`flywheel model bootstrap`: build (or fetch from the cache) the base checkpoint."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from infra.config import add_flags, option, resolve


@dataclass
class BootstrapArgs:
    preset: Literal["test", "agent", "demo"] = option("test", help="the model's size and training (presets.py)")
    seed: int = option(0, help="the seed it is built from (the cache key with the preset)")
    out: Path | None = option(None, help="copy the checkpoint here (None: print the cache dir)")
    force: bool = option(False, help="rebuild even when cached")
    quiet: bool = option(False, help="no progress bars")


@dataclass
class NumericsArgs:
    replica: str | None = option(None, help="replica URL (None: start one on the model)")
    model: Path | None = option(None, help="checkpoint dir (None: the bootstrap preset)")
    preset: Literal["test", "demo"] = option("demo", help="the bootstrap preset, without --model")
    prompts: int = option(16, help="prompts compared")
    max_tokens: int = option(24, help="tokens generated per prompt")
    json: bool = option(False, help="print only the JSON report")


@dataclass
class TrainPlotArgs:
    work_dir: Path | None = option(None, help="the trainer's work dir (None: $FLYWHEEL_HOME/trainer)")
    out: Path | None = option(None, help="the image (None: <work-dir>/reward_by_version.png)")


@dataclass
class TrainArgs:
    model: Path | None = option(None, help="starting checkpoint (None: the bootstrap preset)")
    preset: Literal["test", "demo"] = option("demo", help="the bootstrap preset, without --model")
    work_dir: Path | None = option(None, help="the trainer's work dir (None: $FLYWHEEL_HOME/trainer)")
    nproc: int = option(1, help="ranks (gloo on CPU, NCCL with --device cuda; --shard: how the model spreads)")
    offpeak: bool = option(
        False,
        help="borrow replicas for rollouts while user load is low (rollouts then run on borrowed replicas only)",
    )


def _command(p: argparse.ArgumentParser, func, args_cls) -> None:
    add_flags(p, args_cls)
    p.set_defaults(func=lambda args: func(resolve(args, args_cls)))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="the base model: build it here from a seed")
    msub = p.add_subparsers(dest="model_cmd", required=True)
    b = msub.add_parser("bootstrap", help="train tokenizer + tiny Qwen3-MoE on the synthetic code corpus (cached)")
    _command(b, _bootstrap, BootstrapArgs)

    n = sub.add_parser("numerics", help="trainer vs served logprobs of the same tokens, router replay on and off")
    _command(n, _numerics, NumericsArgs)

    g = sub.add_parser("train-plot", help="draw a trainer's reward and acceptance by version (reward_by_version.png)")
    _command(g, _train_plot, TrainPlotArgs)

    from online_rl.config import TrainerConfig
    from online_rl.gate.cli import register as register_gate
    from online_rl.offpeak import OffPeakConfig

    register_gate(sub)

    t = sub.add_parser("train", help="the online RL trainer daemon (Kafka stream + sandbox rollouts)")
    _command(t, _train, TrainArgs)
    add_flags(t, TrainerConfig)  # every other flag: declared once, on the config's fields (online_rl.config)
    add_flags(t, OffPeakConfig)


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
