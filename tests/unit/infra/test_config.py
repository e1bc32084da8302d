"""Configs are the one source of options: flags generated from the fields, the environment read through
one function, modes checked with a clear error."""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from infra.config import add_flags, build, check_modes, nested, option


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Inner:
    rate: float = option(0.5, help="a rate")
    hidden: int = 3  # not an option: no flag


@dataclass
class Outer:
    name: Path  # required, given by the command
    count: int = option(2, help="how many")
    url: str | None = option(None, flag="where", env="FLYWHEEL_TEST_URL", help="where to go")
    fast: bool = option(False, help="go fast")
    color: Color = option(Color.RED, help="which color")
    mode: Literal["a", "b"] = option("a", help="which mode")
    inner: Inner = nested(Inner, prefix="in-")

    def __post_init__(self):
        check_modes(self)


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_flags(p, Outer)
    return p.parse_args(argv)


def test_no_flags_gives_the_dataclass_defaults(monkeypatch):
    monkeypatch.delenv("FLYWHEEL_TEST_URL", raising=False)
    assert build(Outer, parse(), name=Path("x")) == Outer(name=Path("x"))


def test_flags_then_environment_then_defaults(monkeypatch):
    monkeypatch.setenv("FLYWHEEL_TEST_URL", "http://env")
    cfg = build(Outer, parse("--count", "5", "--fast", "--color", "blue", "--in-rate", "0.25"), name=Path("x"))
    assert (cfg.count, cfg.fast, cfg.color, cfg.inner.rate, cfg.url) == (5, True, Color.BLUE, 0.25, "http://env")
    assert build(Outer, parse("--where", "http://flag"), name=Path("x")).url == "http://flag"
    assert build(Outer, parse(), name=Path("x"), count=9).count == 9  # what the command fixed wins


def test_modes_are_checked_with_a_clear_error():
    with pytest.raises(ValueError, match=r"Outer.mode must be one of a, b, got 'c'"):
        Outer(name=Path("x"), mode="c")
    with pytest.raises(ValueError, match=r"Outer.color must be one of red, blue, got 'green'"):
        Outer(name=Path("x"), color="green")
    assert Outer(name=Path("x"), color="blue").color is Color.BLUE  # an Enum's value converts
    with pytest.raises(SystemExit):  # argparse refuses a choice outside the Literal
        parse("--mode", "c")


def test_help_names_default_and_environment():
    p = argparse.ArgumentParser()
    add_flags(p, Outer)
    text = p.format_help()
    assert "where to go [env FLYWHEEL_TEST_URL] (default: None)" in text and "--in-rate" in text
    assert "--hidden" not in text and "--name" not in text


def test_the_trainer_command_and_its_config_agree(monkeypatch):
    """`flywheel train` with no flags makes the default TrainerConfig (no default copied into the parser)."""
    from flywheel.cli import build_parser
    from infra.config import build as build_cfg
    from online_rl.config import RolloutConfig, TrainerConfig

    for name in (
        "FLYWHEEL_KAFKA_BOOTSTRAP",
        "FLYWHEEL_GATEWAY_URL",
        "FLYWHEEL_ADMIN_TOKEN",
        "FLYWHEEL_STORE_URL",
        "FLYWHEEL_S3_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    args = build_parser().parse_args(["train"])
    assert build_cfg(TrainerConfig, args, model_dir=Path("m")) == TrainerConfig(model_dir=Path("m"))
    args = build_parser().parse_args(["train", "--lr", "1e-4", "--kl", "0", "--publish-interval", "60", "--canary"])
    cfg = build_cfg(TrainerConfig, args, model_dir=Path("m"))
    assert (cfg.optim.lr, cfg.loss.kl_coef, cfg.publish.interval_s, cfg.publish.canary) == (1e-4, 0.0, 60.0, True)
    with pytest.raises(ValueError, match="RolloutConfig.replicas must be one of any, borrowed"):
        RolloutConfig(replicas="some")


def test_the_replica_command_and_its_config_agree(monkeypatch):
    """`flywheel replica start` with no flags makes the default ReplicaConfig; --threads (or its variable) sets
    the torch threads that the replica's environment then carries."""
    from flywheel.cli import build_parser
    from serving.cli import replica_config
    from serving.replica.process import ReplicaConfig, _env

    monkeypatch.delenv("FLYWHEEL_REPLICA_THREADS", raising=False)
    args = build_parser().parse_args(["replica", "start", "--model", "m"])
    assert replica_config(args) == ReplicaConfig(model_path=Path("m"))
    argv = ["replica", "start", "--model", "m", "--port", "31001", "--threads", "2", "--max-total-tokens", "4096"]
    cfg = replica_config(build_parser().parse_args(argv))
    assert (cfg.port, cfg.threads, cfg.max_total_tokens, cfg.dtype) == (31001, 2, 4096, "float32")
    assert _env(cfg)["OMP_NUM_THREADS"] == "2"
    monkeypatch.setenv("FLYWHEEL_REPLICA_THREADS", "2")
    assert replica_config(build_parser().parse_args(["replica", "start", "--model", "m"])).threads == 2
    assert (
        replica_config(build_parser().parse_args(["replica", "start", "--model", "m", "--threads", "1"])).threads == 1
    )
