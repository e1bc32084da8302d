"""The trainer's low-change preset (online_rl.config.low_change) builds a trainer config, and the flags the manual
gives for it (`flywheel train --lr ... --epochs 1 --batch-size 8 --min-batch 8 --publish-interval 0`) build the same."""

from __future__ import annotations

import argparse
from pathlib import Path

from infra.config import add_flags, build
from online_rl.config import LOW_CHANGE, LOW_CHANGE_BATCH, OptimConfig, TrainerConfig, low_change


def test_the_preset_is_one_small_step_a_version():
    cfg = low_change(Path("m"))
    # one optimizer step an update, at a rate under the trainer's default: most bf16 weights round back unchanged
    assert cfg.optim.epochs == 1 and cfg.optim.lr == LOW_CHANGE.lr < OptimConfig().lr
    assert cfg.publish.interval_s == 0.0  # a version after every update
    assert cfg.batch_size == cfg.min_batch == LOW_CHANGE_BATCH


def test_the_manual_s_flags_build_the_preset():
    ap = argparse.ArgumentParser()
    add_flags(ap, TrainerConfig)
    flags = ["--lr", repr(LOW_CHANGE.lr), "--epochs", "1", "--batch-size", "8", "--min-batch", "8"]
    args = ap.parse_args([*flags, "--publish-interval", "0"])
    built = build(TrainerConfig, args, model_dir=Path("m"))
    preset = low_change(Path("m"))
    assert (built.optim, built.batch_size, built.min_batch) == (preset.optim, preset.batch_size, preset.min_batch)
    assert built.publish.interval_s == preset.publish.interval_s
