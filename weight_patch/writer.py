"""Writing a weight patch (weight_patch.format): the file a weights agent lays down for the SGLang loader next to
it (weight_patch.loader) to apply. The agent (weight_sync.agent.inplace) decides what changed and how each tensor
travels (format.travels_sparse); this module turns that into the patch's arrays and metadata, the one place that
knows how they are laid out on the writing side.

    writer = PatchWriter()
    writer.sparse(name, "BF16", shape, idx, xor, base_bits)   # positions, XORs, the base's bits at the first few
    writer.whole(name, "BF16", shape, new_bits)               # the whole new tensor
    writer.write(path)                                         # one safetensors file with its metadata

or, where every entry's size is known before its contents (the agent's in-place switch: the manifest says how
many elements each tensor changes), laid out first and filled where it lies, with no copy into the file:

    with PatchFile(path, [(name, "BF16", shape, k), ...]) as f:   # k changed elements, or None: whole
        idx, xor, was = f.sparse(name)                             # views of the mapped file, to fill
        bits = f.whole(name)

Values travel as their bit patterns, viewed as the signed integer of their width (format.BIT_DTYPES): any
array of the same item size is accepted and viewed so.
"""

from __future__ import annotations

import json
import math
import struct
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


_ST_DTYPES = {np.dtype(np.int16): "I16", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}


class PatchFile:
    """A patch file laid out from its entries' sizes, its arrays filled in place through a shared mapping
    (the bytes a decoder writes there are the file's: no array to collect and copy into it afterwards, which
    cost 60-350 ms for the 64 MB of a 2% patch of 1 GB). entries: (name, dtype, shape, k), k the changed
    elements of a tensor that travels sparse, None for one that travels whole. The file is what
    PatchWriter.write makes of the same arrays (safetensors, the same metadata); its contents are undefined
    until every view is filled. Nothing is fsynced: the engine next to the agent reads it from the page cache."""

    def __init__(self, path: Path | str, entries: list[tuple[str, str, list[int], int | None]]) -> None:
        self.path = Path(path)
        self._where: dict[str, tuple[int, np.dtype, tuple[int, ...]]]
        specs: dict[str, tuple[str, list[int]]] = {}
        arrays: list[tuple[str, np.dtype, tuple[int, ...]]] = []
        for name, dtype, shape, k in entries:
            if name in specs:
                raise ValueError(f"{name} named twice in a patch")
            if dtype not in wp.BIT_DTYPES:
                raise ValueError(f"{name}: {dtype} has no patch form ({sorted(wp.BIT_DTYPES)})")
            signed, numel = np.dtype(wp.BIT_DTYPES[dtype]), math.prod(shape)
            specs[name] = (dtype, list(shape))
            if k is None:
                arrays.append((name, signed, tuple(shape)))
            elif not 0 <= k <= numel:
                raise ValueError(f"{name}: {k} changed of {numel} elements")
            else:
                arrays += [
                    (name + wp.IDX, np.dtype(index_dtype(numel)), (k,)),
                    (name + wp.XOR, signed, (k,)),
                    (name + wp.WAS, signed, (min(wp.WAS_SAMPLE, k),)),
                ]
        # widest items first: every array then starts aligned to its item size (safetensors leaves no gaps)
        arrays.sort(key=lambda a: -a[1].itemsize)
        header: dict = {"__metadata__": wp.encode_meta(specs)}
        at, self._where = 0, {}
        for key, dt, dims in arrays:
            size = dt.itemsize * math.prod(dims)
            header[key] = {"dtype": _ST_DTYPES[dt], "shape": list(dims), "data_offsets": [at, at + size]}
            self._where[key] = (at, dt, dims)
            at += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(8 + len(raw)) % 8)  # the data starts 8-aligned, as safetensors pads it
        self._data, self.size = 8 + len(raw), 8 + len(raw) + at
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw)
            fh.truncate(self.size)
        self._map: np.ndarray | None = None
        if at:  # an empty mapping is an error; a patch of empty arrays needs none
            self._map = np.memmap(self.path, np.uint8, "r+", offset=0, shape=(self.size,))

    def _view(self, key: str) -> np.ndarray:
        at, dt, shape = self._where[key]
        if self._map is None:
            return np.empty(shape, dt)
        start = self._data + at
        return self._map[start : start + dt.itemsize * math.prod(shape)].view(dt).reshape(shape)

    def sparse(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positions, XORs, base bits at the first WAS_SAMPLE positions) of an entry that travels sparse."""
        return self._view(name + wp.IDX), self._view(name + wp.XOR), self._view(name + wp.WAS)

    def whole(self, name: str) -> np.ndarray:
        """The flat new bits of an entry that travels whole."""
        return self._view(name).reshape(-1)

    def close(self) -> None:
        """Unmap the file (the views handed out must not be used after). Its bytes are in the page cache."""
        self._map = None

    def __enter__(self) -> "PatchFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
