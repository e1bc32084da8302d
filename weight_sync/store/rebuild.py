"""A published version as a checkpoint directory again, rebuilt from a local store directory (its chain of
deltas back to a full snapshot, each tensor checked against its signed digest): what the eval gate loads to
judge a version against another without an agent or a replica."""

from __future__ import annotations

import shutil
from pathlib import Path

from weight_sync import codec
from weight_sync.checkpoint import CheckpointReader, CheckpointWriter
from weight_sync.manifest import verify
from weight_sync.store.server import Store, chunk_name


class RebuildError(ValueError):
    """The version's stored bytes are not what its signed manifest says (a corrupt chunk, a tensor that rebuilds to
    other bytes): the version itself is at fault, not the store's state or this process (as is a ManifestError)."""


def rebuild(store: Store, version: int, out: Path, public) -> Path:
    """`out` holding `version` (model.safetensors and its side files); a manifest that does not verify with
    `public` (the trainer's ed25519 key) raises ManifestError; a corrupt chunk, or a tensor that rebuilds to other
    bytes than its manifest says, RebuildError; a version not in the store, ValueError."""
    if version not in store.versions():
        raise ValueError(f"version {version} is not in the store (have {store.versions()})")
    out = Path(out)
    previous: Path | None = None
    for i, v in enumerate(store.chain(version)):
        vdir = store.version_dir(v)
        sig = vdir / "manifest.sig"
        manifest = verify((vdir / "manifest.json").read_bytes(), sig.read_bytes() if sig.exists() else None, public)
        target = out if v == version else out.with_name(f".{out.name}.chain{i}")
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        base = CheckpointReader(previous) if previous is not None else None
        writer = CheckpointWriter(target / "model.safetensors", [(e.name, e.dtype, e.shape) for e in manifest.tensors])
        try:
            for t, entry in enumerate(manifest.tensors):
                frames = [(m, (vdir / "chunks" / chunk_name(t, c)).read_bytes()) for c, m in enumerate(entry.chunks)]
                base_bits = base.bits(entry.name) if base is not None else None
                try:
                    bits = codec.decode_tensor(frames, codec.bit_view(entry.dtype), entry.numel, base_bits)
                except ValueError as e:  # a chunk whose digest or frame is wrong
                    raise RebuildError(f"v{v}: tensor {entry.name}: {e}") from e
                if codec.digest(bits) != entry.digest:
                    raise RebuildError(f"v{v}: tensor {entry.name} rebuilds to other bytes than its manifest says")
                writer.write(entry.name, bits)
            writer.close()
        except BaseException:
            writer.abort()
            raise
        finally:
            if base is not None:
                base.close()
        for name in manifest.files:
            shutil.copyfile(vdir / "files" / name, target / name)
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        previous = target
    return out
