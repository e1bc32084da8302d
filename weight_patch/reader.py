"""A patch read back with numpy, entry by entry: what the weight agent does to persist a version it handed the
replica in place (weight_sync.agent.inplace.persist). The engine's side reads the same file with torch
(weight_patch.loader)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from weight_patch import format as wp


@dataclass
class Entry:
    """One patched tensor: its whole new bits, or the positions that changed and the XOR to apply there."""

    name: str
    dtype: str  # safetensors' name: BF16 | F16 | F32
    whole: np.ndarray | None = None
    idx: np.ndarray | None = None
    xor: np.ndarray | None = None


def entries(path: Path) -> Iterator[Entry]:
    """Every entry of the patch at `path`, in the order its metadata lists them."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        specs, keys = wp.decode_meta(f.metadata()), set(f.keys())
        for name, (dtype, _) in specs.items():
            if name in keys:
                yield Entry(name, dtype, whole=f.get_tensor(name).reshape(-1))
            else:
                yield Entry(name, dtype, idx=f.get_tensor(name + wp.IDX), xor=f.get_tensor(name + wp.XOR))
