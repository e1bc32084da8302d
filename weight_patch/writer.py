"""Writing a weight patch (weight_patch.format): the file a weights agent lays down for the SGLang loader next to
it (weight_patch.loader) to apply. The agent (weight_sync.agent.inplace) decides what changed and how each tensor
travels (format.travels_sparse); this module turns that into the patch's arrays and metadata, the one place that
knows how they are laid out on the writing side.

    writer = PatchWriter()
    writer.sparse(name, "BF16", shape, idx, xor, base_bits)   # positions, XORs, the base's bits at the first few
    writer.whole(name, "BF16", shape, new_bits)               # the whole new tensor
    writer.write(path)                                         # one safetensors file with its metadata

Values travel as their bit patterns, viewed as the signed integer of their width (format.BIT_DTYPES): any
array of the same item size is accepted and viewed so.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from weight_patch import format as wp


def index_dtype(numel: int) -> type:
    """The dtype of a tensor's positions in a patch: int32, or int64 past 2**31 elements."""
    return np.int32 if numel < 2**31 else np.int64


class PatchWriter:
    """A patch's entries, collected one tensor at a time, then written as one file."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.specs: dict[str, tuple[str, list[int]]] = {}

    def __len__(self) -> int:
        """How many tensors the patch names."""
        return len(self.specs)

    def sparse(self, name: str, dtype: str, shape, idx: np.ndarray, xor: np.ndarray, base_bits: np.ndarray) -> None:
        """`name` changed at the flat positions `idx` (index_dtype), by the XOR `xor` of its new bits with the
        base's; `base_bits` is the base tensor's bits, flat, from which the patch carries the first
        WAS_SAMPLE changed positions' (what the loader checks the model holds before it applies anything)."""
        signed = np.dtype(wp.BIT_DTYPES[dtype])
        self.specs[name] = (dtype, list(shape))
        self.arrays[name + wp.IDX] = idx
        self.arrays[name + wp.XOR] = xor.view(signed)
        self.arrays[name + wp.WAS] = base_bits[idx[: wp.WAS_SAMPLE]].view(signed)

    def whole(self, name: str, dtype: str, shape, bits: np.ndarray) -> None:
        """`name` travels whole: `bits` are the new tensor's bits (any shape with its element count)."""
        signed = np.dtype(wp.BIT_DTYPES[dtype])
        self.specs[name] = (dtype, list(shape))
        self.arrays[name] = bits.view(signed).reshape(shape)

    def write(self, path: Path | str) -> int:
        """Write the patch to `path` (a .safetensors file; its folder is made), and return its size in bytes."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(self.arrays, str(path), wp.encode_meta(self.specs))
        return path.stat().st_size


def warmup(specs: dict[str, tuple[str, list[int]]], out: Path | str) -> Path:
    """Write a patch that names every tensor of `specs` (name -> (dtype, shape), a checkpoint's) with a patch
    form and changes none: the loader places them all, and the first real patch finds its places known."""
    writer = PatchWriter()
    for name, (dtype, shape) in specs.items():
        if dtype in wp.BIT_DTYPES:
            signed = wp.BIT_DTYPES[dtype]
            empty = np.empty(0, signed)
            writer.sparse(name, dtype, shape, np.empty(0, index_dtype(math.prod(shape))), empty, empty)
    writer.write(out)
    return Path(out)
