"""Checkpoints of our Qwen3-MoE shape at sizes the bootstrap presets never reach, randomly initialised.

They measure what grows with the model (a reload from disk, an in-place apply, a delta's size), not what it
answers: nothing is trained, and the tokenizer is the test preset's. Built once per shape and seed, cached
under $FLYWHEEL_HOME/models like the presets; `python -m online_rl.model.random_checkpoint large` builds one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from infra.paths import flywheel_home
from online_rl.model.transformer import ModelConfig

SHAPES: dict[str, ModelConfig] = {
    # 531M parameters: 1.06 GB of bf16 (per layer 16 experts x 3 x 1024 x 1024, plus attention), 2.1 GB
    # as a float32 replica holds it. Large enough that a reload from disk costs seconds on 2 cores.
    "large": ModelConfig(
        hidden_size=1024,
        num_hidden_layers=10,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=64,
        num_experts=16,
        num_experts_per_tok=2,
        moe_intermediate_size=1024,
    ),
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def random_checkpoint(shape: str = "large", seed: int = 0) -> Path:
    """The checkpoint directory of `shape` (a key of SHAPES) and seed: from the cache, or built once."""
    import torch

    from online_rl.model.bootstrap import bootstrap
    from online_rl.model.transformer import MoECoder, save_pretrained

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {sorted(SHAPES)}")
    tok_dir = bootstrap("test", seed=0, progress=False)
    vocab = json.loads((tok_dir / "config.json").read_text())
    cfg = dataclasses.replace(
        SHAPES[shape],
        vocab_size=vocab["vocab_size"],
        eos_token_id=vocab["eos_token_id"],
        bos_token_id=vocab["bos_token_id"],
    )
    key = hashlib.sha256(json.dumps([dataclasses.asdict(cfg), seed], sort_keys=True).encode()).hexdigest()[:16]
    out = flywheel_home() / "models" / f"random-{shape}-seed{seed}-{key}"
    if (out / ".complete").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        with torch.no_grad():
            model = MoECoder(cfg)
            model.init_weights(seed)
            save_pretrained(model, staging, torch.bfloat16)
        del model
        for name in _TOKENIZER_FILES:
            shutil.copy2(tok_dir / name, staging / name)
        (staging / ".complete").write_text("ok\n")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(staging, out)  # atomic: a half-written checkpoint is never visible
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(random_checkpoint(sys.argv[1] if len(sys.argv) > 1 else "large"))
