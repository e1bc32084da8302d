"""In-place apply: a delta handed to the replica as only what changed, then persisted locally.

    1. patch    the chunks of the tensors the manifest says changed are fetched (from a store server, in
                one request: its pack) and checked against their digests (the manifest is signed); they
                are decoded straight into a patch file laid out beforehand (weight_patch.format; its
                layout by weight_patch.writer.PatchFile, from the changed counts the manifest signs) as the
                positions of the changed elements and their XOR with the base while few changed (the base
                is not read: a 2% change touches most of its cache lines), else as the whole new tensor.
                Unchanged tensors are neither fetched nor read: the work follows what changed, not the
                model's size.
    2. switch   the replica applies the patch through its custom loader (weight_sync.agent.switch, same modes,
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

from kernels import delta as delta_kernels
from weight_patch import format as wp, reader, writer as patch_writer
from weight_sync import codec
from weight_sync.agent.fetch import PackUnsupported, StoreClient
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
    """Whether every tensor's dtype has a patch form (weight_patch.format.BIT_DTYPES)."""
    return all(t.dtype in wp.BIT_DTYPES for t in manifest.tensors)


def _tensor_changes(
    chunks, numel: int, dtype: str, idx_dtype: type, out: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The positions (idx_dtype) of every element a tensor's delta chunks change and their XOR with the base,
    decoded straight into arrays as long as the manifest says they change: `out` (idx, xor views of the
    patch file, weight_patch.writer.PatchFile) or new ones."""
    view = codec.bit_view(dtype)
    total = sum(meta.changed for meta, _ in chunks)
    if out is None:
        idx, xor = np.empty(total, idx_dtype), np.empty(total, view)
    else:
        idx, xor = out[0], out[1].view(view)
        if idx.size != total or xor.size != total or idx.dtype != np.dtype(idx_dtype):
            raise ValueError(f"{total} changes for {idx.size} places in the patch")
    at = 0
    for meta, frame in chunks:  # frames come from the store client, which checked their digests
        if meta.offset < 0 or meta.elems < 0 or meta.offset + meta.elems > numel:
            raise ValueError(f"chunk at element {meta.offset} (+{meta.elems}) is outside a tensor of {numel}")
        codec.changes_into(frame, meta, view, idx[at : at + meta.changed], xor[at : at + meta.changed])
        at += meta.changed
    return idx, xor


def _with_changes(base_bits: np.ndarray, idx: np.ndarray, xor: np.ndarray, out: np.ndarray) -> None:
    """out (a whole entry of the patch file) = the base's bits with the changes XORed in."""
    bits = out.view(base_bits.dtype)
    bits[:] = base_bits
    delta_kernels.xor_scatter(bits, idx, xor)


async def build_patch(client, manifest: Manifest, base_dir: Path, pool: Executor, out: Path) -> Patch:
    """Fetch what changed in `manifest` (a delta against `base_dir`) and write it as a patch file, in time and
    memory that follow what changed: each chunk's digest is checked (the manifest that lists them is
    signed); the base is read only for a tensor that travels whole, and for the few base bits a sparse one
    carries (weight_patch.format.WAS). The rebuilt tensors' own digests are checked by `persist`, which writes
    them whole. The file is laid out first (the manifest says how many elements each tensor changes) and the
    chunks decoded straight into it; it is removed again when this raises ValueError (a corrupt chunk) or
    FetchError."""
    patch = Patch(Path(out), digests={t.name: t.digest for t in manifest.tensors})
    changed = manifest.changed_tensors()
    arrived, feeder = _fetch_changed(client, manifest, changed)
    # the side files (config, tokenizer: only `persist` needs them) while the tensors arrive, not after
    files = asyncio.ensure_future(_side_files(client, manifest))
    try:
        return await _build(manifest, changed, arrived, base_dir, pool, patch, files)
    except BaseException:
        patch.path.unlink(missing_ok=True)
        raise
    finally:
        feeder.cancel()
        files.cancel()
        for f in arrived:
            f.cancel()
        await asyncio.gather(feeder, files, *arrived, return_exceptions=True)


async def _side_files(client, manifest: Manifest) -> dict[str, bytes]:
    names = list(manifest.files)
    data = await asyncio.gather(*(client.file(manifest.version, n, manifest.files[n]) for n in names))
    return dict(zip(names, data))


def _fetch_changed(client, manifest: Manifest, changed: list[int]) -> tuple[list[asyncio.Future], asyncio.Task]:
    """Start fetching every chunk of the changed tensors: one future per tensor (its frames, in order), done
    as soon as its last chunk is here, so the work on a tensor overlaps the downloads of the next. From a
    store server without a relay, all of them come in one response (the store's pack: one request instead
    of hundreds); else chunk by chunk, as many at once as the client allows."""
    loop = asyncio.get_running_loop()
    arrived = {t: loop.create_future() for t in changed}
    frames: dict[int, list[bytes | None]] = {t: [None] * len(manifest.tensors[t].chunks) for t in changed}
    left = {t: len(frames[t]) for t in changed}

    def got(t: int, c: int, data: bytes) -> None:
        frames[t][c] = data
        left[t] -= 1
        if left[t] == 0 and not arrived[t].done():
            arrived[t].set_result(frames[t])

    async def chunk_by_chunk(t: int) -> None:
        entry = manifest.tensors[t]
        try:
            data = await asyncio.gather(
                *(client.chunk(manifest.version, t, c, m.size, m.digest) for c, m in enumerate(entry.chunks))
            )
            if not arrived[t].done():
                arrived[t].set_result(list(data))
        except BaseException as e:
            if not arrived[t].done():
                arrived[t].set_exception(e)
            raise

    async def feed() -> None:
        try:
            if isinstance(client, StoreClient) and client.relay is None:
                try:
                    return await client.pack(manifest.version, manifest.pack(), got)
                except PackUnsupported:
                    pass
            try:  # the first failure cancels the other tensors' downloads
                async with asyncio.TaskGroup() as group:
                    for t in changed:
                        group.create_task(chunk_by_chunk(t))
            except ExceptionGroup as e:
                raise e.exceptions[0] from None
        except BaseException as e:
            for f in arrived.values():
                if not f.done():
                    f.set_exception(e) if isinstance(e, Exception) else f.cancel()
            raise

    return [arrived[t] for t in changed], asyncio.ensure_future(feed())


def _layout(manifest: Manifest, changed: list[int]) -> list[tuple[str, str, list[int], int | None]]:
    """The patch file's entries: each changed tensor with the elements it changes (the manifest's count) while
    few changed, else None (it travels whole)."""
    entries = []
    for ti in changed:
        e = manifest.tensors[ti]
        k = sum(meta.changed for meta in e.chunks)
        entries.append((e.name, e.dtype, list(e.shape), k if wp.travels_sparse(k, e.numel) else None))
    return entries


async def _build(manifest, changed, fetches, base_dir, pool, patch: Patch, files: asyncio.Future) -> Patch:
    loop = asyncio.get_running_loop()
    entries = _layout(manifest, changed)
    out = await loop.run_in_executor(pool, patch_writer.PatchFile, patch.path, entries)
    with out, CheckpointReader(base_dir) as base:

        async def one(ti: int, fetch, sparse: bool) -> None:
            entry = manifest.tensors[ti]
            frames = await fetch
            base_bits = base.bits(entry.name)
            if base_bits.size != entry.numel:
                raise ValueError(f"{entry.name}: {base_bits.size} elements in the base, {entry.numel} in the manifest")
            chunks = list(zip(entry.chunks, frames))
            idx_dtype = patch_writer.index_dtype(entry.numel)
            if sparse:
                idx, xor, was = out.sparse(entry.name)
                await loop.run_in_executor(
                    pool, _tensor_changes, chunks, entry.numel, entry.dtype, idx_dtype, (idx, xor)
                )
                was[:] = base_bits[idx[: was.size]].view(was.dtype)  # the loader checks the model holds these
                patch.sparse_elems += idx.size
            else:
                idx, xor = await loop.run_in_executor(
                    pool, _tensor_changes, chunks, entry.numel, entry.dtype, idx_dtype
                )
                await loop.run_in_executor(pool, _with_changes, base_bits, idx, xor, out.whole(entry.name))
                patch.full_elems += entry.numel

        # Tensors in parallel, as many as the pool has threads (zstd and numpy release the GIL); the first
        # failure cancels the rest before the base is closed.
        try:
            async with asyncio.TaskGroup() as group:
                for ti, f, (*_, k) in zip(changed, fetches, entries, strict=True):
                    group.create_task(one(ti, f, k is not None))
        except ExceptionGroup as e:  # the first failure is the one to report (FetchError, ValueError)
            raise e.exceptions[0] from None
    patch.files = await files
    patch.bytes, patch.tensors = out.size, len(entries)
    return patch


def warmup_patch(base_dir: Path, out: Path) -> Path:
    """A patch that names every tensor of the checkpoint at `base_dir` and changes none (Agent.warm_inplace)."""
    with CheckpointReader(base_dir) as base:
        specs = base.specs()
    return patch_writer.warmup(specs, out)


def persist(base_dir: Path, patch: Patch, staging: Path) -> None:
    """Write the version's checkpoint into `staging`: the base's weight files with the patch applied, and the
    version's side files; then check every tensor, patched or not, against the manifest's digest (a damaged
    base must not live on in the versions built on it). Every file is fsynced; the caller renames `staging`
    into place. Raises DigestMismatch, or ValueError/KeyError for a base that does not fit the manifest."""
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
    for e in reader.entries(patch.path):
        dst, offset, have_dtype, numel = where[e.name]
        if have_dtype != e.dtype:
            raise ValueError(f"{e.name}: the base holds {have_dtype}, the patch {e.dtype}")
        mm = np.memmap(dst, dtype=wp.BIT_DTYPES[e.dtype], mode="r+", offset=offset, shape=(numel,))
        if e.whole is not None:
            mm[:] = e.whole
        else:
            assert e.xor is not None and e.idx is not None  # a sparse entry carries both
            x: np.ndarray = e.xor.view(codec.bit_view(e.dtype))
            delta_kernels.xor_scatter(np.asarray(mm).view(x.dtype), e.idx, x)
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
