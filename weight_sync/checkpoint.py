"""Tensor-at-a-time access to safetensors checkpoints, as raw bit patterns (no framework, bounded memory).

Reading maps the file and hands out one tensor's bits at a time; writing lays out the header first (from
the names, dtypes and shapes, known up front) and then streams each tensor to its place, so neither side
ever holds more than one tensor. The byte layout is the safetensors format, read back by `safetensors`.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from pathlib import Path

import numpy as np

from weight_sync.codec import BIT_VIEWS

# Files besides the weights that make a checkpoint directory loadable (SGLang, transformers).
SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def weight_files(ckpt: Path) -> list[Path]:
    files = sorted(Path(ckpt).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {ckpt}")
    return files


class CheckpointReader:
    """All tensors of a checkpoint directory (one or more safetensors shards), read lazily via mmap."""

    def __init__(self, ckpt: Path):
        self.dir = Path(ckpt)
        self._index: dict[str, tuple[mmap.mmap, str, list[int], int, int]] = {}
        self._files: dict[str, Path] = {}
        self._maps = []
        for f in weight_files(self.dir):
            with open(f, "rb") as fh:
                m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps.append(m)
            (n,) = struct.unpack("<Q", m[:8])
            header = json.loads(m[8 : 8 + n])
            base = 8 + n
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                self._index[name] = (m, info["dtype"], list(info["shape"]), base + start, base + end)
                self._files[name] = f

    def names(self) -> list[str]:
        return list(self._index)

    def spec(self, name: str) -> tuple[str, list[int]]:
        _, dtype, shape, _, _ = self._index[name]
        return dtype, shape

    def specs(self) -> dict[str, tuple[str, list[int]]]:
        return {n: self.spec(n) for n in self._index}

    def layout(self) -> dict[str, tuple[Path, str, list[int], int]]:
        """Every tensor's file, dtype, shape and byte offset in that file (for writing it in place)."""
        return {n: (self._files[n], dtype, shape, start) for n, (_, dtype, shape, start, _) in self._index.items()}

    def bits(self, name: str) -> np.ndarray:
        """The tensor's bits as a flat read-only uint array over the mapped file (no copy)."""
        m, dtype, shape, start, end = self._index[name]
        view = BIT_VIEWS[dtype]
        n = math.prod(shape)
        if end - start != n * np.dtype(view).itemsize:
            raise ValueError(f"{name}: {end - start} bytes for {dtype}{shape}")
        return np.frombuffer(m, dtype=view, count=n, offset=start)

    def close(self) -> None:
        self._index.clear()
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # an array still points into it; the map closes when that is collected
                pass
        self._maps.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CheckpointWriter:
    """Write model.safetensors tensor by tensor, in the order given up front."""

    def __init__(self, path: Path, specs: list[tuple[str, str, list[int]]]):
        self.path = Path(path)
        header, offset = {}, 0
        self._slots = {}
        for name, dtype, shape in specs:
            size = math.prod(shape) * np.dtype(BIT_VIEWS[dtype]).itemsize
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
            self._slots[name] = (offset, size)
            offset += size
        header["__metadata__"] = {"format": "pt"}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._data_start = 8 + len(raw)
        self._f = open(self.path, "wb")
        self._f.write(struct.pack("<Q", len(raw)) + raw)
        self._f.truncate(self._data_start + offset)
        self._written: set[str] = set()

    def write(self, name: str, bits: np.ndarray) -> None:
        offset, size = self._slots[name]
        if bits.nbytes != size:
            raise ValueError(f"{name}: {bits.nbytes} bytes, slot holds {size}")
        self._f.seek(self._data_start + offset)
        self._f.write(memoryview(np.ascontiguousarray(bits)).cast("B"))  # type: ignore[arg-type]  # a buffer
        self._written.add(name)

    def abort(self) -> None:
        """Give the file up unfinished (its caller removes it): the descriptor is not left open. Closing
        flushes what is buffered, which on a full disk fails again: the descriptor is closed all the same,
        and that second error is not the one to report."""
        try:
            self._f.close()
        except OSError:
            pass

    def close(self) -> None:
        missing = set(self._slots) - self._written
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        if missing:
            raise ValueError(f"tensors never written: {sorted(missing)[:3]}")


def config_digest(config_path: Path) -> str:
    """Digest of a config.json's content (canonical JSON), independent of formatting."""
    from weight_sync.codec import digest

    return digest(json.dumps(json.loads(Path(config_path).read_text()), sort_keys=True, separators=(",", ":")).encode())
