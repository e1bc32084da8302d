"""The trainer's weights as a Hugging Face checkpoint for weight_sync, streamed tensor by tensor.

A sharded model (FSDP) holds no full tensor anywhere: each is gathered from every rank in turn
(online_rl.trainer.sharding.full_tensors), converted, written and dropped before the next, so the peak is one
full tensor, not the model. safetensors' own writer takes a whole dict, so the file is written here in
its format (8-byte little-endian header length, the JSON header with every tensor's dtype, shape and
byte range, then the bytes in that order): the header is known before any tensor is gathered, because
a sharded tensor knows its global shape.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

from online_rl.trainer.sharding import full_tensors, metadata

DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def _header(entries: dict[str, tuple[tuple[int, ...], torch.dtype]], dtype: torch.dtype) -> bytes:
    head: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    size = torch.tensor([], dtype=dtype).element_size()
    for name, (shape, _) in entries.items():
        n = size
        for d in shape:
            n *= d
        head[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(head, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it


def save_streaming(
    model: torch.nn.Module, out_dir: Path, dtype: torch.dtype = torch.bfloat16, write: bool = True
) -> None:
    """model.safetensors of `model` (tied lm_head left out) under `out_dir`. Sharded: collective, every
    rank calls it (rank 0 with write=True). A failed write is raised only after the last tensor is
    gathered, so that the other ranks are never left waiting in a collective."""
    tied = bool(getattr(getattr(model, "cfg", None), "tie_word_embeddings", False))
    entries = {k: v for k, v in metadata(model).items() if not (tied and k == "lm_head.weight")}
    error: Exception | None = None
    f = None
    if write:
        try:
            out_dir = Path(out_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            header = _header(entries, dtype)
            f = open(out_dir / "model.safetensors.tmp", "wb")  # noqa: SIM115 (closed below, also on error)
            f.write(struct.pack("<Q", len(header)) + header)
        except Exception as e:  # whatever it is: the other ranks are about to gather with this one
            error = e
    for _, t in full_tensors(model, names=entries):  # every rank computed the same `entries`
        if f is not None and error is None:
            try:
                f.write(memoryview(t.to("cpu", dtype).contiguous().view(torch.uint8).numpy()))  # type: ignore[arg-type]  # an ndarray is a buffer
            except Exception as e:  # recorded, raised after the last gather
                error = e
        del t  # the next tensor is gathered with this one gone
    if f is not None:
        try:
            f.flush()
            os.fsync(f.fileno())
        except OSError as e:
            error = error or e
        finally:
            f.close()
    if error is not None:
        raise error
    if write:
        os.replace(out_dir / "model.safetensors.tmp", out_dir / "model.safetensors")


def gather_for_export(model: torch.nn.Module) -> None:
    """A rank other than 0's part of save_streaming: the gathers, nothing written."""
    save_streaming(model, Path("."), write=False)
