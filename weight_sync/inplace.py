"""In-place apply: a delta handed to the replica as only what changed, then persisted locally.

    1. patch    the chunks of the tensors the manifest says changed are fetched and checked against their
                digests (the manifest is signed); their changed elements, and only those, are read from
                the base the replica serves, and go into a patch file (flywheel.core.weight_patch:
                positions and values while few changed, else the whole tensor). Unchanged tensors are
                neither fetched nor read: the work follows what changed, not the model's size.
    2. switch   the replica applies the patch through its custom loader (weight_sync.switch, same modes,
                same version label and prefix-cache flush as a reload from disk).
    3. persist  the version's checkpoint directory, which restarts and rollbacks load from disk, is the
                base's files copied and the patch written into the copy, every patched tensor checked
                against its digest: after the switch, off its path. A mismatch (a damaged local base):
                the agent drops that copy, and its retry rebuilds the version from the store and reloads it.
A switch so costs what changed, not what the model weighs; the full reload stays for full snapshots, for a
delta against another base than the one served, and as the fallback when the engine refuses a patch.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from flywheel.core import weight_patch as wp
from weight_sync import codec
from weight_sync.checkpoint import CheckpointReader, weight_files
from weight_sync.manifest import Manifest


class DigestMismatch(ValueError):
    """A rebuilt tensor is not the one the manifest signed (a wrong or damaged base)."""


@dataclass
class Patch:
    path: Path
    files: dict[str, bytes] = field(default_factory=dict)  # the version's side files (config, tokenizer)
    digests: dict[str, str] = field(default_factory=dict)  # every tensor -> digest of the version's bytes
    tensors: int = 0  # tensors in the patch
    sparse_elems: int = 0  # elements sent as position + value
    full_elems: int = 0  # elements of tensors sent whole
    bytes: int = 0


def supported(manifest: Manifest) -> bool:
    """Whether every tensor's dtype has a patch form (flywheel.core.weight_patch.BIT_DTYPES)."""
    return all(t.dtype in wp.BIT_DTYPES for t in manifest.tensors)


def changed_tensors(manifest: Manifest) -> list[int]:
    """Indices of the tensors the (signed) manifest says differ from its base."""
    return [i for i, t in enumerate(manifest.tensors) if any(c.changed for c in t.chunks)]


def _tensor_changes(chunks, base_bits: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The positions and new bits of every element a tensor's delta chunks change."""
    view, idxs, vals = codec.bit_view(dtype), [], []
    for meta, frame in chunks:  # frames come from the store client, which checked their digests
        o, n = meta.offset, meta.elems
        if o < 0 or o + n > base_bits.size:
            raise ValueError(f"chunk at element {o} (+{n}) is outside a tensor of {base_bits.size}")
        idx, new = codec.chunk_changes(frame, meta.encoding, view, n, base_bits[o : o + n])
        idxs.append(idx + o)
        vals.append(new)
    if not idxs:
        return np.empty(0, np.int64), np.empty(0, view)
    return np.concatenate(idxs), np.concatenate(vals)


def _with_changes(base_bits: np.ndarray, idx: np.ndarray, vals: np.ndarray) -> np.ndarray:
    bits = base_bits.copy()
    bits[idx] = vals
    return bits


async def build_patch(client, manifest: Manifest, base_dir: Path, pool: Executor, out: Path) -> Patch:
    """Fetch what changed in `manifest` (a delta against `base_dir`) and write it as a patch file, in time and
    memory that follow what changed: each chunk's digest is checked (the manifest that lists them is
    signed), and only its changed elements are read from the base. The rebuilt tensors' own digests are
    checked by `persist`, which writes them whole. Raises ValueError (a corrupt chunk) or FetchError."""
    patch = Patch(Path(out), digests={t.name: t.digest for t in manifest.tensors})
    changed = changed_tensors(manifest)
    # Every changed chunk is asked for at once (the client bounds how many are in flight), so downloads
    # overlap the work on the tensors already here; together they weigh what the delta weighs.
    fetches = [
        asyncio.ensure_future(
            asyncio.gather(
                *(
                    client.chunk(manifest.version, ti, ci, c.size, c.digest)
                    for ci, c in enumerate(manifest.tensors[ti].chunks)
                )
            )
        )
        for ti in changed
    ]
    try:
        return await _build(manifest, changed, fetches, base_dir, pool, patch, client)
    finally:
        for f in fetches:
            f.cancel()
        await asyncio.gather(*fetches, return_exceptions=True)


async def _build(manifest, changed, fetches, base_dir, pool, patch: Patch, client) -> Patch:
    loop = asyncio.get_running_loop()
    arrays: dict[str, np.ndarray] = {}
    specs: dict[str, tuple[str, list[int]]] = {}
    with CheckpointReader(base_dir) as base:

        async def one(ti: int, fetch) -> None:
            entry = manifest.tensors[ti]
            frames = await fetch
            base_bits = base.bits(entry.name)
            chunks = list(zip(entry.chunks, frames))
            idx, vals = await loop.run_in_executor(pool, _tensor_changes, chunks, base_bits, entry.dtype)
            specs[entry.name] = (entry.dtype, list(entry.shape))
            signed = np.dtype(wp.BIT_DTYPES[entry.dtype])
            if wp.travels_sparse(idx.size, entry.numel):
                arrays[entry.name + wp.IDX] = idx.astype(np.int32 if entry.numel < 2**31 else np.int64)
                arrays[entry.name + wp.VAL] = vals.view(signed)
                patch.sparse_elems += idx.size
            else:
                bits = await loop.run_in_executor(pool, _with_changes, base_bits, idx, vals)
                arrays[entry.name] = bits.view(signed).reshape(entry.shape)
                patch.full_elems += entry.numel

        # Tensors in parallel, as many as the pool has threads (zstd and numpy release the GIL); the first
        # failure cancels the rest before the base is closed.
        try:
            async with asyncio.TaskGroup() as group:
                for ti, f in zip(changed, fetches, strict=True):
                    group.create_task(one(ti, f))
        except ExceptionGroup as e:  # the first failure is the one to report (FetchError, ValueError)
            raise e.exceptions[0] from None
        for name, want in manifest.files.items():
            patch.files[name] = await client.file(manifest.version, name, want)
    patch.path.parent.mkdir(parents=True, exist_ok=True)
    await loop.run_in_executor(None, save_file, arrays, str(patch.path), wp.encode_meta(specs))
    patch.tensors, patch.bytes = len(specs), patch.path.stat().st_size
    return patch


def persist(base_dir: Path, patch: Patch, staging: Path) -> None:
    """Write the version's checkpoint into `staging`: the base's weight files with the patch applied, and the
    version's side files; then check every tensor, patched or not, against the manifest's digest (a damaged
    base must not live on in the versions built on it). Every file is fsynced; the caller renames `staging`
    into place. Raises DigestMismatch, or ValueError/KeyError for a base that does not fit the manifest."""
    from safetensors import safe_open  # numpy's view of the patch (the module imports safetensors.numpy)

    staging.mkdir(parents=True)
    where: dict[str, tuple[Path, int, str, int]] = {}
    for src in weight_files(base_dir):
        shutil.copyfile(src, staging / src.name)
    with CheckpointReader(staging) as r:
        for name, (dst, dtype, shape, start) in r.layout().items():
            where[name] = (dst, start, dtype, math.prod(shape))
    if set(where) != set(patch.digests):
        raise ValueError(
            f"the base holds other tensors than the manifest ({sorted(set(where) ^ set(patch.digests))[:3]})"
        )
    with safe_open(str(patch.path), framework="numpy") as f:
        specs, keys = wp.decode_meta(f.metadata()), set(f.keys())
        for name, (dtype, _) in specs.items():
            dst, offset, have_dtype, numel = where[name]
            if have_dtype != dtype:
                raise ValueError(f"{name}: the base holds {have_dtype}, the patch {dtype}")
            mm = np.memmap(dst, dtype=wp.BIT_DTYPES[dtype], mode="r+", offset=offset, shape=(numel,))
            if name in keys:
                mm[:] = f.get_tensor(name).reshape(-1)
            else:
                mm[f.get_tensor(name + wp.IDX)] = f.get_tensor(name + wp.VAL)
            mm.flush()
            del mm
    for name, (dst, offset, dtype, numel) in where.items():
        itemsize = np.dtype(codec.bit_view(dtype)).itemsize
        mm = np.memmap(dst, dtype=np.uint8, mode="r", offset=offset, shape=(numel * itemsize,))
        if codec.digest(mm) != patch.digests[name]:
            raise DigestMismatch(f"tensor {name} rebuilds to other bytes than the manifest's (a damaged base?)")
        del mm
    for name, data in patch.files.items():
        (staging / name).write_bytes(data)
    for p in staging.iterdir():
        with open(p, "rb") as fh:
            os.fsync(fh.fileno())
