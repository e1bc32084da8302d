"""The versions an agent keeps on disk, apart from the loop that decides which to serve (weight_sync.agent.loop).

    <work>/versions/<N>/     a checkpoint directory per version (the launch checkpoint: a link to it)
    <work>/state.json        the served version, the pin, the newest announced and released, the control seq
    <work>/.build-<N>/       a version being rebuilt; renamed into versions/ once every digest matched

A version is rebuilt from its signed manifest: tensor by tensor, each from the store's chunks over its base
(materialized first, down the chain to a full snapshot), every digest checked. A base whose own copy went bad
(a disk error) is told apart from a bad version and dropped, to be rebuilt from the store. Pruning keeps the
newest few, the served one and the launch checkpoint. Memory: one tensor and a few chunks at a time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from weight_sync import codec
from weight_sync.agent import inplace
from weight_sync.agent.fetch import FetchError, NotInStore, StoreClient
from weight_sync.agent.rejected import PERMANENT, Rejected
from weight_sync.checkpoint import CheckpointReader, CheckpointWriter, config_digest
from weight_sync.manifest import Manifest, ManifestError, verify
from weight_sync.store.server import version_number

if TYPE_CHECKING:
    from weight_sync.agent.config import AgentConfig
    from weight_sync.agent.metrics import AgentMetrics
    from weight_sync.agent.relay import RelayCache

log = logging.getLogger(__name__)


class LocalCopies:
    """<work>/versions/<N>/ (N: a checkpoint directory; the launch checkpoint a link) and <work>/state.json."""

    def __init__(self, cfg: AgentConfig, public, metrics: AgentMetrics, pool: ThreadPoolExecutor):
        self.cfg, self.public, self.metrics, self.pool = cfg, public, metrics, pool
        self.work = Path(cfg.work_dir)
        self.versions_dir = self.work / "versions"
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        self.state = self._load_state()
        served = self.path(self.state["version"])
        if not served.exists():  # dropped as damaged before a restart; every version has the model's shapes
            served = self.path(cfg.initial_version)
        self.expected = CheckpointReader(served).specs()
        self.config_digest = config_digest(served / "config.json")

    def _load_state(self) -> dict:
        path = self.work / "state.json"
        if path.exists():
            state = json.loads(path.read_text())
        else:
            state = {
                "version": self.cfg.initial_version,
                "pinned": None,
                "latest_seen": self.cfg.initial_version,
                "released": self.cfg.initial_version,
            }
        seed = self.versions_dir / str(self.cfg.initial_version)
        if not seed.exists():
            seed.symlink_to(Path(self.cfg.initial_model).resolve(), target_is_directory=True)
        return state

    def save_state(self) -> None:
        tmp = self.work / "state.json.tmp"
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.work / "state.json")

    def path(self, version: int) -> Path:
        return self.versions_dir / str(int(version))

    def versions(self) -> list[int]:
        return sorted(v for p in self.versions_dir.iterdir() if (v := version_number(p.name)) is not None)

    async def manifest(self, client: StoreClient, version: int) -> Manifest:
        """`version`'s manifest, its signature verified and its model checked against the served one."""
        t = time.monotonic()
        try:
            body, sig = await client.manifest(version)
        except NotInStore as e:
            raise Rejected("unknown_version", str(e)) from None
        except FetchError as e:  # the store failing (a 5xx, a proxy's 502) says nothing of the version: retried
            raise Rejected("fetch_failed", str(e)) from None
        try:
            manifest = verify(body, sig, self.public)
            manifest.check_model(self.expected, self.config_digest)
        except ManifestError as e:
            raise Rejected("bad_manifest", str(e)) from None
        if manifest.version != version:
            raise Rejected("bad_manifest", f"asked for v{version}, manifest says v{manifest.version}")
        self.metrics.phase.labels("verify_manifest").observe(time.monotonic() - t)
        return manifest

    async def materialize(self, client: StoreClient, version: int, depth: int = 0) -> Path:
        """A local checkpoint directory of `version`, rebuilt from the store (and its base chain) if needed."""
        target = self.path(version)
        if target.exists():
            return target
        if depth > 64:
            raise Rejected("chain_too_long", f"no full snapshot within 64 bases of v{version}")
        manifest = await self.manifest(client, version)
        base_dir = None
        if manifest.kind == "delta":
            base_dir = await self.materialize(client, manifest.base, depth + 1)
        t = time.monotonic()
        staging = self.work / f".build-{version}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        base = CheckpointReader(base_dir) if base_dir else None
        writer, built = None, False
        try:
            writer = CheckpointWriter(
                staging / "model.safetensors", [(e.name, e.dtype, e.shape) for e in manifest.tensors]
            )
            loop = asyncio.get_running_loop()
            for ti, entry in enumerate(manifest.tensors):
                base_bits = base.bits(entry.name) if base else None
                if base_bits is not None and not any(c.changed for c in entry.chunks):
                    bits, frames = base_bits, None  # unchanged (the signed manifest says so; the digest checks it)
                else:
                    frames = await asyncio.gather(
                        *(client.chunk(version, ti, ci, c.size, c.digest) for ci, c in enumerate(entry.chunks))
                    )
                    bits = await loop.run_in_executor(
                        None,
                        codec.decode_tensor,
                        list(zip(entry.chunks, frames)),
                        codec.bit_view(entry.dtype),
                        entry.numel,
                        base_bits,
                        self.pool,
                    )
                if codec.digest(bits) != entry.digest:
                    if base_bits is not None and await self._base_damaged(client, manifest.base, entry.name):
                        # This agent's own copy of the base went bad (a disk error): the version is fine. The
                        # copy goes; the retry rebuilds the base from the store (before: rejected for good).
                        self.drop(manifest.base)
                        raise Rejected(
                            "damaged_base",
                            f"the local copy of v{manifest.base_version} differs from its manifest at "
                            f"{entry.name}: dropped, rebuilt from the store on retry",
                        )
                    raise Rejected(
                        "digest_mismatch",
                        f"tensor {entry.name} of v{version} rebuilds to other bytes "
                        f"(wrong base v{manifest.base_version}?)",
                    )
                writer.write(entry.name, bits)
                del bits, frames, base_bits
            writer.close()
            writer = None
            for name, want in manifest.files.items():
                (staging / name).write_bytes(await client.file(version, name, want))
            os.replace(staging, target)
            built = True
        except FetchError as e:
            raise Rejected("fetch_failed", str(e)) from None
        except ValueError as e:
            raise Rejected("corrupt_chunk", str(e)) from None
        finally:  # whatever ended it (a disk full, the store gone, a cancel): no model-sized leftover, no open file
            if writer is not None:
                writer.abort()
            if not built:
                shutil.rmtree(staging, ignore_errors=True)
            if base is not None:
                base.close()
        self.metrics.phase.labels("rebuild").observe(time.monotonic() - t)
        log.info(
            "rebuilt v%d (%s of v%s) in %.2fs", version, manifest.kind, manifest.base_version, time.monotonic() - t
        )
        return target

    async def _base_damaged(self, client: StoreClient, base_version: int, name: str) -> bool:
        """Whether this agent's copy of `base_version` has tensor `name` other than the store's manifest says
        (False when that cannot be told for good: the base is no longer in the store, nor can it be rebuilt).
        A store failing meanwhile raises its transient rejection: the version is not judged on a guess."""
        try:
            entry = next((e for e in (await self.manifest(client, base_version)).tensors if e.name == name), None)
        except Rejected as e:
            if e.reason not in PERMANENT:
                raise
            return False
        if entry is None:
            return False
        reader = CheckpointReader(self.path(base_version))
        try:
            return codec.digest(reader.bits(name)) != entry.digest
        finally:
            reader.close()

    def drop(self, version: int) -> None:
        p = self.path(version)
        if p.is_symlink():  # the launch checkpoint: only the link goes (materialize fetches the version)
            p.unlink()
        else:
            shutil.rmtree(p, ignore_errors=True)

    async def persist_patch(self, version: int, base_version: int, patch) -> bool:
        """Write `version` as its base with the in-place `patch` applied (weight_sync.agent.inplace.persist), checked
        against the manifest's digests. False: the local base is damaged, and was dropped."""
        t, staging, base = time.monotonic(), self.work / f".build-{version}", self.path(base_version)
        shutil.rmtree(staging, ignore_errors=True)
        try:
            await asyncio.get_running_loop().run_in_executor(None, inplace.persist, base, patch, staging)
        except (ValueError, KeyError) as e:  # DigestMismatch among them
            # The local base is damaged, so what the replica now serves may be too: that copy goes, and
            # the caller rebuilds the version from the store and reloads it whole, now.
            shutil.rmtree(staging, ignore_errors=True)
            self.drop(base_version)
            self.metrics.inplace_fallbacks.labels("damaged_base").inc()
            log.error("v%d applied in place over a damaged base (%s): reloading it from the store", version, e)
            return False
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        os.replace(staging, self.path(version))
        self.metrics.phase.labels("persist").observe(time.monotonic() - t)
        return True

    def prune(self, relay_cache: RelayCache | None) -> None:
        """Keep the newest `keep_local` versions, the served one and the launch checkpoint; drop what a killed
        agent left (patches, rebuilds, partial downloads); the relay offers peers only what is kept."""
        for stale in (self.work / "patches").glob("*"):  # left by an agent that died mid-switch
            stale.unlink(missing_ok=True)
        for stale in self.work.glob(".build-*"):  # a rebuild a killed agent left (a live one removes its own)
            shutil.rmtree(stale, ignore_errors=True)
        for stale in (self.work / "downloads").glob("*.part"):  # of applies never finished (superseded versions)
            stale.unlink(missing_ok=True)
        keep = set(self.versions()[-self.cfg.keep_local :]) | {self.state["version"], self.cfg.initial_version}
        for v in self.versions():
            if v not in keep:
                p = self.path(v)
                if p.is_symlink():
                    p.unlink()
                else:
                    shutil.rmtree(p, ignore_errors=True)
        if relay_cache is not None:  # peers are offered what this agent still keeps, no more
            relay_cache.prune(keep)
