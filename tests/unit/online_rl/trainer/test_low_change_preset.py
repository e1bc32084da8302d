"""The trainer's low-change preset (online_rl.config.LOW_CHANGE) is a valid optimizer config that a trainer
config takes, and its flags (`flywheel train --lr ... --epochs ...`) build the same settings."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from infra.config import add_flags, build
from online_rl.config import LOW_CHANGE, OptimConfig, TrainerConfig


def test_the_preset_is_a_small_step_per_version():
    assert isinstance(LOW_CHANGE, OptimConfig)
    # one optimizer step an update, at a rate under the trainer's default: most bf16 weights round back unchanged
    assert LOW_CHANGE.epochs == 1 and LOW_CHANGE.lr < OptimConfig().lr
    cfg = TrainerConfig(model_dir=Path("m"), optim=dataclasses.replace(LOW_CHANGE))
    assert cfg.optim == LOW_CHANGE


def test_the_preset_s_flags_build_it():
    ap = argparse.ArgumentParser()
    add_flags(ap, TrainerConfig)
    args = ap.parse_args(["--lr", repr(LOW_CHANGE.lr), "--epochs", str(LOW_CHANGE.epochs)])
    assert build(TrainerConfig, args, model_dir=Path("m")).optim == LOW_CHANGE
