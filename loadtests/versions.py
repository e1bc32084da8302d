"""Checkpoints to publish during load tests, made from the served model without a trainer run.

`nudged`: a trainer-like new version: a small share of every tensor's bf16 elements moved by one ULP
(public figure: over 98% of bf16 weights bit-identical between versions), so the model still behaves.
`noisy`: weights plus noise of a chosen scale (a worse version, by degree).
`broken`: a version that must be rolled back: every weight scrambled by noise of its own scale, so it still
loads and serves (same shapes, signed, valid) but produces garbage.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _rewrite(src: Path, dst: Path, change) -> Path:
    src, dst = Path(src), Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    sd = load_file(str(src / "model.safetensors"))
    save_file({k: change(k, v) for k, v in sd.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def nudged(src: Path, dst: Path, seed: int, share: float = 0.02) -> Path:
    g = torch.Generator().manual_seed(seed)

    def change(_name, v):
        if v.dtype != torch.bfloat16:
            raise ValueError(f"expected a bf16 checkpoint, found {v.dtype}")
        mask = torch.rand(v.shape, generator=g) < share
        return torch.where(mask, v.view(torch.int16) + 1, v.view(torch.int16)).view(torch.bfloat16)

    return _rewrite(src, dst, change)


def noisy(src: Path, dst: Path, seed: int, scale: float) -> Path:
    """Every weight plus Gaussian noise of `scale` times its tensor's std: 0.3 degrades the test model
    (house-style acceptance 92% -> 67% measured), 3 breaks it."""
    g = torch.Generator().manual_seed(seed)

    def change(_name, v):
        x = v.float()
        return (x + torch.randn(x.shape, generator=g) * (x.std() + 1e-3) * scale).to(v.dtype)

    return _rewrite(src, dst, change)


def broken(src: Path, dst: Path, seed: int) -> Path:
    return noisy(src, dst, seed, 3.0)
