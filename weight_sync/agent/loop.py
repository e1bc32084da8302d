"""The serving-side agent, one per replica: follow the `weights` topic, rebuild each version, hot-switch.

    weights topic --> decide the target version (newest, or the activated / pinned one)
                  --> fetch manifest + signature --> verify signature, model, base
                  --> rebuild tensor by tensor (chunks fetched in parallel, digests checked) into
                      <work>/versions/<N>/ --> switch the replica (weight_sync.agent.switch) --> record state

Anything wrong with a version (bad signature, digest mismatch, truncated chunk, wrong base, unknown
version, a replica that will not load it) is rejected with one log line and a metric; the replica keeps
the version it has. State (<work>/state.json) holds the last good version, so a restarted agent or
replica comes back on it. Memory: one tensor and a few chunks at a time, whatever the model size.

Why one file: the agent is one loop (verify, fetch, rebuild, switch, report) over state that every
step reads (the served version, the pin, the local copies); split, each part would take all of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from contracts import control
from contracts.events import TOPIC_WEIGHTS
from infra import kafka_auth
from infra.config import check_modes
from infra.dead_letter import DeadLetters
from kernels import delta as delta_kernels
from weight_sync import codec, fleet_credential
from weight_sync.agent import inplace
from weight_sync.agent.fetch import FetchError, NotInStore, PeerLink, StoreClient, open_store
from weight_sync.agent.peer_rate import PeerBound
from weight_sync.agent.relay import RelayCache, RelayConfig, RelayServer
from weight_sync.agent.switch import (
    GatewayLink,
    InPlace,
    LoadRefused,
    SwitchError,
    SwitchMode,
    served_version,
    switch,
    takes_patches,
)
from weight_sync.checkpoint import CheckpointReader, CheckpointWriter, config_digest
from weight_sync.manifest import Manifest, ManifestError, load_public, verify
from weight_sync.store.server import version_number

log = logging.getLogger(__name__)


class Rejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass
class AgentConfig:
    name: str
    replica_url: str
    store_url: str
    public_key: Path
    work_dir: Path
    initial_model: Path  # the checkpoint the replica was started with
    initial_version: int = 0
    kafka_bootstrap: str | None = None
    gateway_url: str | None = None  # one gateway, or several comma-separated: the replica is drained on each
    admin_token: str | None = None
    gateway_replica_id: str | None = None
    switch_mode: SwitchMode = "drain"
    retry_base_s: float = 1.0  # a transient failure (store or replica unreachable) is retried after this,
    retry_max_s: float = 30.0  # doubling up to this; the offset is committed only once it succeeds
    keep_local: int = 3
    parallel_downloads: int = 4
    threads: int = 2
    inplace: bool = True  # a delta against the served version is applied in place (weight_sync.agent.inplace)
    metrics_port: int = 0  # 0: no /metrics server
    metrics_host: str = "127.0.0.1"
    # The peer relay (weight_sync.agent.relay): other agents fetch the pieces this one verified from here, so the
    # store sends each version about once. 0: no relay (every piece from the store, as before relays).
    relay_port: int = 0
    relay_host: str = "127.0.0.1"
    relay_url: str | None = None  # what peers are told (default http://relay_host:relay_port)
    relay_wait_s: float = 4.0  # a peer asking for a piece still arriving here waits this long
    # The fleet read credential (weight_sync.fleet_credential; $FLYWHEEL_STORE_TOKEN): the store server and
    # every relay want it, this agent's relay asks it of its peers. An s3:// store signs with AWS_* instead.
    store_token: str | None = field(default=None, repr=False)
    # A peer slower than this is dropped within seconds and the store serves instead (weight_sync.agent.peer_rate).
    peer_bound: PeerBound = field(default_factory=PeerBound)

    def __post_init__(self):
        check_modes(self)
        if self.relay_port:
            self.relay_config()  # checks port, host and URL now, not at the first apply
            fleet_credential.checked(self.store_token, "a relay")  # never one that anyone could read from
            if self.relay_wait_s >= self.peer_bound.first_byte_s:  # an honest relay, still waiting, taken for slow
                raise ValueError("relay_wait_s must be below the peers' first-byte deadline (peer_bound.first_byte_s)")

    def relay_config(self) -> RelayConfig | None:
        if not self.relay_port:
            return None
        return RelayConfig(
            Path(self.work_dir) / "relay",
            self.relay_port,
            self.relay_host,
            self.relay_url,
            self.relay_wait_s,
            token=self.store_token,
        )


class AgentMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.version = Gauge("flywheel_agent_weight_version", "Version the agent's replica serves", registry=r)
        self.pinned = Gauge("flywheel_agent_pinned", "1 while the fleet is pinned to a version", registry=r)
        # Served vs target is what the FleetNotOnAnnouncedVersion alert compares; announced, across agents,
        # shows one that stopped reading the topic (deploy/prometheus/alerts.yml).
        self.target = Gauge(
            "flywheel_agent_target_version",
            "Version the weights topic says this replica should serve (the newest, or the pinned, activated, "
            "rolled-back-to or canary one)",
            registry=r,
        )
        self.announced = Gauge(
            "flywheel_agent_announced_version", "Newest version announced on the weights topic", registry=r
        )
        self.rejected = Counter(
            "flywheel_agent_rejected_versions", "Versions rejected, by reason", ["reason"], registry=r
        )
        self.switches = Counter("flywheel_agent_switches", "Completed hot-switches", ["mode"], registry=r)
        self.bad_records = Counter(
            "flywheel_agent_bad_control_records",
            "Weights records refused (malformed, unsigned, bad signature, invalid, replayed)",
            ["reason"],
            registry=r,
        )
        self.retries = Counter(
            "flywheel_agent_apply_retries",
            "Applies that failed for a transient reason (store or replica unreachable) and were retried",
            registry=r,
        )
        self.poll_failures = Counter(
            "flywheel_agent_poll_failures",
            "Reads of the weights topic that failed (the broker away) and were retried",
            registry=r,
        )
        self.commit_failures = Counter(
            "flywheel_agent_offset_commit_failures",
            "Weights-topic offset commits that failed (the broker away) and were retried",
            registry=r,
        )
        self.inplace_fallbacks = Counter(
            "flywheel_agent_inplace_fallbacks",
            "Versions reloaded whole after an in-place apply failed: patch_failed (could not be built), "
            "refused (by the engine), damaged_base (the local base did not rebuild to the manifest's digests)",
            ["reason"],
            registry=r,
        )
        self.fetched = Counter(
            "flywheel_agent_fetched_bytes",
            "Bytes of versions downloaded, by source (the store, or a peer's relay)",
            ["source"],
            registry=r,
        )
        self.peer_fallbacks = Counter(
            "flywheel_agent_peer_fallbacks",
            "Pieces a peer failed to give (missing, unreachable, slow, corrupt, http_error) and the store sent instead",
            ["reason"],
            registry=r,
        )
        self.relay_requests = Counter(
            "flywheel_agent_relay_requests",
            "Requests to this agent's relay, by result (served; missing: not here, not yet, or never; bad name; "
            "unauthorized: without the fleet read credential)",
            ["result"],
            registry=r,
        )
        self.relay_sent = Counter(
            "flywheel_agent_relay_sent_bytes", "Bytes this agent's relay sent to peers", registry=r
        )
        self.phase = Histogram(
            "flywheel_agent_phase_seconds",
            "Time per phase of applying a version",
            ["phase"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        # What users felt of a switch (the switch report's pause_ms: a drained replica pauses nobody), apart from
        # the "switch" phase above, which also counts a drain's wait and the load behind it.
        self.switch_pause = Histogram(
            "flywheel_agent_switch_pause_seconds",
            "User-visible pause of each switch (0 when the replica was drained first)",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        # Every reason exported from the start at 0: a series born at 1 has no increase to alert on.
        for reason in (*Agent.PERMANENT, "fetch_failed", "switch_failed", "damaged_base"):
            self.rejected.labels(reason)
        for reason in control.REASONS:
            self.bad_records.labels(reason)
        for reason in ("missing", "unreachable", "slow", "corrupt", "http_error"):
            self.peer_fallbacks.labels(reason)
        self._dead_letters: DeadLetters | None = None

    def dead_letters(self, consumer: str, bootstrap: str | None) -> DeadLetters:
        """Refused weights records: flywheel_agent_bad_records_total{topic,reason} and the dead-letter topic
        (infra.dead_letter). Made once per registry: a run() after another reuses its counters."""
        if self._dead_letters is None:
            self._dead_letters = DeadLetters(self.registry, "flywheel_agent", consumer, bootstrap, (TOPIC_WEIGHTS,))
        return self._dead_letters


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.work = Path(cfg.work_dir)
        self.versions_dir = self.work / "versions"
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        self.public = load_public(cfg.public_key)
        self.metrics = AgentMetrics()
        self.state = self._load_state()
        served = self.local_dir(self.state["version"])
        if not served.exists():  # dropped as damaged before a restart; every version has the model's shapes
            served = self.local_dir(self.cfg.initial_version)
        self.expected = CheckpointReader(served).specs()
        self.config_digest = config_digest(served / "config.json")
        self.metrics.version.set(self.state["version"])
        self.metrics.target.set(self.state["version"])  # until the topic says otherwise
        self.metrics.announced.set(self.state.get("latest_seen", self.state["version"]))
        self.metrics.pinned.set(1 if self.state.get("pinned") is not None else 0)
        self.pool = ThreadPoolExecutor(cfg.threads)
        self.last_apply: dict = {}
        self.retry = False  # whether the last failed apply is worth trying again
        self._warm_tries = 0  # warm-ups of the replica's in-place path that failed (WARM_TRIES: done)
        if cfg.inplace:  # at start, not on the first switch: the first import of torch takes seconds, and
            import torch.multiprocessing  # noqa: F401  # the fused patch kernels compile (or load their cache)

            try:
                if (ops := delta_kernels.cpu_ops()) is not None:
                    ops.warm()
            except Exception:  # an optimisation: the first patch compiles them, or numpy does the work
                log.exception("could not compile the in-place kernels at start")
        relay = cfg.relay_config()
        self.relay_cache = RelayCache(relay.root) if relay else None
        self.relay_server: RelayServer | None = None

    # ------------------------------------------------------------------ state
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

    def _save_state(self) -> None:
        tmp = self.work / "state.json.tmp"
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.work / "state.json")

    def local_dir(self, version: int) -> Path:
        return self.versions_dir / str(int(version))

    def local_versions(self) -> list[int]:
        return sorted(v for p in self.versions_dir.iterdir() if (v := version_number(p.name)) is not None)

    # ------------------------------------------------------------------ rebuild
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
        target = self.local_dir(version)
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
                        self._drop_local(manifest.base)
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
            if e.reason not in self.PERMANENT:
                raise
            return False
        if entry is None:
            return False
        reader = CheckpointReader(self.local_dir(base_version))
        try:
            return codec.digest(reader.bits(name)) != entry.digest
        finally:
            reader.close()

    def _drop_local(self, version: int) -> None:
        p = self.local_dir(version)
        if p.is_symlink():  # the launch checkpoint: only the link goes (materialize fetches the version)
            p.unlink()
        else:
            shutil.rmtree(p, ignore_errors=True)

    async def _apply_inplace(self, client: StoreClient, session, version: int, t0: float) -> dict | None:
        """Switch by handing the replica only what changed (weight_sync.agent.inplace), when `version` is a delta
        against the version the replica serves. None: not possible here, or it failed in a way a reload
        from disk repairs (the engine refused the patch, the local base is damaged): the caller reloads."""
        if not self.cfg.inplace or self.local_dir(version).exists():
            return None
        manifest = await self.manifest(client, version)
        base_dir = self.local_dir(manifest.base_version or 0)
        if (
            manifest.kind != "delta"
            or manifest.base_version != self.state["version"]
            or not base_dir.exists()
            or not inplace.supported(manifest)
            # what the replica serves, not what this agent last did: one restarted by its supervisor serves
            # its launch checkpoint until the agent notices
            or await served_version(session, self.cfg.replica_url) != manifest.base_version
            or not await takes_patches(session, self.cfg.replica_url)
        ):
            return None
        out, t_patch = self.work / "patches" / f"v{version}.safetensors", time.monotonic()
        try:
            patch = await inplace.build_patch(client, manifest, base_dir, self.pool, out)
        except FetchError as e:
            raise Rejected("fetch_failed", str(e)) from None
        except (ValueError, KeyError) as e:  # the base or the delta: the rebuild from disk tells which
            self.metrics.inplace_fallbacks.labels("patch_failed").inc()
            log.warning("v%d: no in-place patch (%s: %s); rebuilding it whole", version, type(e).__name__, e)
            out.unlink(missing_ok=True)
            return None
        patch_ms = 1000 * (time.monotonic() - t_patch)
        try:
            self.metrics.phase.labels("patch").observe(patch_ms / 1000)
            t = time.monotonic()
            try:
                load = InPlace(str(patch.path.resolve()), manifest.base)
                report = await switch(
                    self.cfg.replica_url,
                    None,
                    version,
                    self.cfg.switch_mode,
                    self.gateways(),
                    patch=load,
                    restore_dir=str(base_dir.resolve()),
                )
            except LoadRefused as e:
                self.metrics.inplace_fallbacks.labels("refused").inc()
                log.warning(
                    "replica %s refused the in-place patch of v%d (%s): reloading it", self.cfg.name, version, e
                )
                return None
            self.metrics.phase.labels("switch").observe(time.monotonic() - t)
            serving_ms = 1000 * (time.monotonic() - t0)
            t = time.monotonic()
            staging = self.work / f".build-{version}"
            shutil.rmtree(staging, ignore_errors=True)
            try:
                await asyncio.get_running_loop().run_in_executor(None, inplace.persist, base_dir, patch, staging)
            except (ValueError, KeyError) as e:  # DigestMismatch among them
                # The local base is damaged, so what the replica now serves may be too: that copy goes, and
                # the caller rebuilds the version from the store and reloads it whole, now.
                shutil.rmtree(staging, ignore_errors=True)
                self._drop_local(manifest.base)
                self.metrics.inplace_fallbacks.labels("damaged_base").inc()
                log.error("v%d applied in place over a damaged base (%s): reloading it from the store", version, e)
                return None
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            os.replace(staging, self.local_dir(version))
            self.metrics.phase.labels("persist").observe(time.monotonic() - t)
        finally:
            patch.path.unlink(missing_ok=True)
        return {
            "apply": "in_place",
            **report,
            "serving_ms": round(serving_ms, 1),
            "patch_ms": round(patch_ms, 1),  # fetching what changed and writing the patch
            "persist_ms": round(1000 * (time.monotonic() - t), 1),
            "patch_tensors": patch.tensors,
            "patch_bytes": patch.bytes,
            "patch_sparse_elems": patch.sparse_elems,
            "patch_full_elems": patch.full_elems,
        }

    def _prune(self) -> None:
        for stale in (self.work / "patches").glob("*"):  # left by an agent that died mid-switch
            stale.unlink(missing_ok=True)
        for stale in self.work.glob(".build-*"):  # a rebuild a killed agent left (a live one removes its own)
            shutil.rmtree(stale, ignore_errors=True)
        for stale in (self.work / "downloads").glob("*.part"):  # of applies never finished (superseded versions)
            stale.unlink(missing_ok=True)
        keep = set(self.local_versions()[-self.cfg.keep_local :]) | {self.state["version"], self.cfg.initial_version}
        for v in self.local_versions():
            if v not in keep:
                p = self.local_dir(v)
                if p.is_symlink():
                    p.unlink()
                else:
                    shutil.rmtree(p, ignore_errors=True)
        if self.relay_cache is not None:  # peers are offered what this agent still keeps, no more
            self.relay_cache.prune(keep)

    # ------------------------------------------------------------------ relay
    def store_client(self, session: aiohttp.ClientSession) -> StoreClient:
        """A client of the store (of the bucket, for an s3:// store: same interface); with a relay running, one
        that fetches from peers and fills this agent's relay (never advertise a relay that does not listen:
        peers sent there would only fall back)."""
        if self.cfg.store_url.startswith("s3://"):  # a bucket: no tracker, so no relay
            # S3StoreClient: StoreClient's interface, duck-typed
            return open_store(self.cfg.store_url, session, self.work / "downloads", self.cfg.parallel_downloads)  # type: ignore[return-value]
        link = None
        if self.relay_cache is not None and self.relay_server is not None and (relay := self.cfg.relay_config()):
            link = PeerLink(relay.advertised, self.relay_cache, self.public, self.cfg.peer_bound)
        return StoreClient(
            self.cfg.store_url,
            session,
            self.work / "downloads",
            self.cfg.parallel_downloads,
            relay=link,
            on_bytes=lambda source, n: self.metrics.fetched.labels(source).inc(n),
            on_fallback=lambda reason: self.metrics.peer_fallbacks.labels(reason).inc(),
            token=self.cfg.store_token,
        )

    def start_relay(self) -> None:
        """Serve this agent's verified pieces to its peers (no-op without relay_port)."""
        relay = self.cfg.relay_config()
        if self.relay_cache is None or self.relay_server is not None or relay is None:
            return

        def count(result: str, nbytes: int) -> None:
            self.metrics.relay_requests.labels(result).inc()
            self.metrics.relay_sent.inc(nbytes)

        self.relay_server = RelayServer(relay, self.relay_cache, count).start()
        log.info("agent %s relays verified pieces at %s", self.cfg.name, relay.advertised)

    def stop_relay(self) -> None:
        if self.relay_server is not None:
            self.relay_server.stop()
            self.relay_server = None

    # ------------------------------------------------------------------ apply
    # What the store or the replica says about the version itself: trying again gives the same answer.
    PERMANENT = ("bad_manifest", "digest_mismatch", "corrupt_chunk", "chain_too_long", "unknown_version")

    async def apply(self, version: int) -> dict | None:
        """Rebuild and switch to `version`. Returns the switch report, or None if it was rejected or failed
        (`self.retry` then says whether it is worth trying again)."""
        self.retry = False
        t0 = time.monotonic()
        try:
            async with aiohttp.ClientSession() as session:
                client = self.store_client(session)
                report = await self._apply_inplace(client, session, version, t0)
                if report is None:
                    path = await self.materialize(client, version)
            if report is None:
                t = time.monotonic()
                report = await switch(
                    self.cfg.replica_url, str(path.resolve()), version, self.cfg.switch_mode, self.gateways()
                )
                self.metrics.phase.labels("switch").observe(time.monotonic() - t)
                report = {"apply": "reload", **report, "serving_ms": round(1000 * (time.monotonic() - t0), 1)}
        except Rejected as e:
            self.metrics.rejected.labels(e.reason).inc()
            self.retry = e.reason not in self.PERMANENT
            log.error(
                "rejected v%d: %s; replica %s keeps serving v%d%s",
                version,
                e,
                self.cfg.name,
                self.state["version"],
                " (will retry)" if self.retry else "",
            )
            return None
        except (SwitchError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            # The store or the replica unreachable, a load that failed: transient, retried with backoff.
            self.metrics.rejected.labels("switch_failed").inc()
            self.retry = True
            log.error(
                "switch to v%d failed: %s (%s); replica %s keeps serving v%d (will retry)",
                version,
                type(e).__name__,
                e,
                self.cfg.name,
                self.state["version"],
            )
            return None
        self.state["version"] = version
        self._save_state()
        self.metrics.version.set(version)
        self.metrics.switches.labels(report["mode"]).inc()
        if report.get("pause_ms") is not None:
            self.metrics.switch_pause.observe(report["pause_ms"] / 1000)
        report["apply_ms"] = round(1000 * (time.monotonic() - t0), 1)
        self.last_apply = {"version": version, **report}
        with open(self.work / "switches.jsonl", "a") as f:  # the switch history operators and the demo read
            f.write(json.dumps({"version": version, "at": time.time(), **report}) + "\n")
        log.info("replica %s now serves v%d (%s)", self.cfg.name, version, report)
        self._prune()
        return report

    def gateways(self) -> list[GatewayLink]:
        """Every gateway that routes to this replica (drained on each during a switch)."""
        if not (self.cfg.gateway_url and self.cfg.admin_token and self.cfg.gateway_replica_id):
            return []
        urls = [u.strip() for u in self.cfg.gateway_url.split(",") if u.strip()]
        return [GatewayLink(u, self.cfg.admin_token, self.cfg.gateway_replica_id) for u in urls]

    async def warm_inplace(self) -> dict | None:
        """Warm the replica's in-place path so that its first patch costs what later ones do: a patch that
        changes nothing but names every tensor (weight_sync.agent.inplace.warmup_patch), handed over in the agent's
        switch mode (drained or paused like a switch: SGLang holds requests while its loader runs), which
        keeps the label and the prefix cache. At agent start, and after the agent puts a restarted replica
        back on its version. Best effort: a failure is logged, and the first switch pays for it (or falls
        back to a reload). Returns the loader's outcome (or the error), None when there is no in-place path."""
        version = self.state["version"]
        base = self.local_dir(version)
        if not self.cfg.inplace or not base.exists():
            return None
        out = self.work / "patches" / "warmup.safetensors"
        t = time.monotonic()
        try:
            async with aiohttp.ClientSession() as session:
                if not await takes_patches(session, self.cfg.replica_url):
                    return None
            await asyncio.get_running_loop().run_in_executor(self.pool, inplace.warmup_patch, base, out)
            load = InPlace(str(out.resolve()), version, warmup=True)
            report = await switch(
                self.cfg.replica_url, None, version, self.cfg.switch_mode, self.gateways(), patch=load
            )
            result = report.get("engine") or {"ok": False, "error": "no outcome from the engine's loader"}
        except Exception as e:  # best effort, never the agent's end
            log.warning("replica %s: could not warm its in-place path (%s: %s)", self.cfg.name, type(e).__name__, e)
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        finally:
            out.unlink(missing_ok=True)
        result["warm_s"] = round(time.monotonic() - t, 3)
        (log.info if result.get("ok") else log.warning)("replica %s: in-place path warmed: %s", self.cfg.name, result)
        return result

    WARM_TRIES = 3  # a warm-up that keeps failing is given up (the first switch then pays, or reloads)

    async def ensure_replica_on_current(self) -> None:
        """After a restart (of the agent or of the replica): make the replica serve the last good version,
        and warm its in-place path (at agent start, and again after putting a restarted replica back)."""
        async with aiohttp.ClientSession() as session:
            served = await served_version(session, self.cfg.replica_url)
        if served != self.state["version"]:
            log.info(
                "replica %s serves %s, last good version is v%d: switching back",
                self.cfg.name,
                served,
                self.state["version"],
            )
            version = self.state["version"]
            async with aiohttp.ClientSession() as session:
                report = await switch(self.cfg.replica_url, str(self.local_dir(version).resolve()), version, "no_pause")
            self.metrics.switches.labels(report["mode"]).inc()
            self._warm_tries = 0  # a restarted replica has placed nothing yet
        if self._warm_tries < self.WARM_TRIES:
            result = await self.warm_inplace()
            ok = result is None or result.get("ok")  # None: no in-place path to warm
            self._warm_tries = self.WARM_TRIES if ok else self._warm_tries + 1

    # ------------------------------------------------------------------ topic
    def decide(self, records: list[dict]) -> int | None:
        """Fold a batch of weights records (in topic order) into the version to serve."""
        target = None
        for r in records:
            kind, v = r.get("type"), r.get("version")
            if not isinstance(v, int) and kind != "unpin":
                log.error("ignoring a weights record without a version: %s", r)
                continue
            if kind == "version":
                assert isinstance(v, int)  # (checked above: only an unpin has none)
                self.state["latest_seen"] = max(self.state.get("latest_seen", 0), v)
                if not r.get("canary"):  # a canary waits for its trial, and is released only when promoted
                    self._released(v)
                if self.state.get("pinned") is None and not r.get("canary"):
                    target = v
            elif kind == "canary":  # a trial: only the replicas named serve the candidate
                if self.state.get("pinned") is None and self.cfg.name in r.get("replicas", []):
                    target = v
            elif kind == "rollback":  # the trial failed: everyone (back) on the stable version
                if self.state.get("pinned") is None and isinstance(r.get("stable"), int):
                    target = r["stable"]
            elif kind in ("activate", "promote"):
                if kind == "promote":
                    assert isinstance(v, int)  # (checked above: only an unpin has none)
                    self._released(v)
                if self.state.get("pinned") is None:
                    target = v
            elif kind == "pin":
                self.state["pinned"] = v
                target = v
            elif kind == "unpin":  # the newest released version: never a canary that was not promoted
                self.state["pinned"] = None
                target = self.state.get("released", self.state.get("latest_seen", self.state["version"]))
            else:
                log.error("ignoring a weights record of unknown type %r", kind)
        self.metrics.pinned.set(1 if self.state.get("pinned") is not None else 0)
        self.metrics.announced.set(self.state.get("latest_seen", self.state["version"]))
        if target is not None:
            self.metrics.target.set(target)
        return target

    def _released(self, version: int) -> None:
        """The newest version released to the whole fleet (announced without a trial, or promoted after one)."""
        self.state["released"] = max(self.state.get("released", self.state["version"]), version)

    def run(self, stop=None) -> None:
        """Follow the weights topic until `stop` (a threading.Event) is set."""
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        from infra.kafka_admin import RECONNECT_BACKOFF_MAX_MS

        if self.cfg.metrics_port:
            from prometheus_client import start_http_server

            start_http_server(self.cfg.metrics_port, addr=self.cfg.metrics_host, registry=self.metrics.registry)
        try:
            asyncio.run(self.ensure_replica_on_current())
        except (aiohttp.ClientError, asyncio.TimeoutError, SwitchError, OSError) as e:  # retried in the loop
            log.warning(
                "replica %s not ready at start (%s); will put v%d on it when it is",
                self.cfg.name,
                e,
                self.state["version"],
            )
        consumer = KafkaConsumer(
            TOPIC_WEIGHTS,
            bootstrap_servers=self.cfg.kafka_bootstrap,
            **kafka_auth.client_config(),
            group_id=f"flywheel-agent-{self.cfg.name}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            client_id=f"flywheel-agent-{self.cfg.name}",
            reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
        )
        log.info(
            "agent %s following %s (replica %s on v%d)",
            self.cfg.name,
            TOPIC_WEIGHTS,
            self.cfg.replica_url,
            self.state["version"],
        )
        pending, retry_at, backoff, uncommitted = None, 0.0, self.cfg.retry_base_s, False
        checked, stuck = time.monotonic(), 0
        # The sequence is persisted with the offsets it belongs to: records read again after a restart
        # (not committed: an apply still being retried) are accepted again.
        guard = control.ReplayGuard(self.state.get("control_seq", 0))
        dead_letters = self.metrics.dead_letters(f"agent-{self.cfg.name}", self.cfg.kafka_bootstrap)
        try:
            self.start_relay()  # peers may ask for this agent's pieces from the first apply on
            while stop is None or not stop.is_set():
                try:
                    batch = consumer.poll(timeout_ms=500)
                except KafkaError as e:  # kafka-python 3 raises from poll while the broker is down
                    self.metrics.poll_failures.inc()
                    log.warning("agent %s cannot read %s (%s); retrying", self.cfg.name, TOPIC_WEIGHTS, e)
                    time.sleep(1.0)
                    batch = {}
                records = []
                for recs in batch.values():
                    for rec in recs:
                        uncommitted = True
                        try:
                            records.append(guard.check(control.decode(rec.value, self.public)))
                        except Exception as e:  # counted, dead-lettered, never acted on (ControlError says why)
                            self.metrics.bad_records.labels(getattr(e, "reason", "malformed")).inc()
                            log.error("ignoring weights record at offset %d: %s", rec.offset, e)
                            dead_letters.refuse(TOPIC_WEIGHTS, rec.value, e, rec)
                if records:
                    target = self.decide(records)
                    if target is not None:
                        pending, retry_at = target, 0.0  # a newer decision replaces one still being retried
                    self._save_state()
                if pending == self.state["version"]:
                    pending = None
                if pending is None and time.monotonic() - checked > 5.0:
                    # A replica restarted by its supervisor comes back on its launch checkpoint: put the
                    # version this agent last applied back on it.
                    checked = time.monotonic()
                    try:
                        asyncio.run(self.ensure_replica_on_current())
                        stuck = 0
                    except (aiohttp.ClientError, asyncio.TimeoutError, SwitchError, OSError) as e:
                        stuck += 1
                        (log.warning if stuck == 1 else log.debug)(
                            "replica %s not back on v%d yet (%s); trying every 5 s",
                            self.cfg.name,
                            self.state["version"],
                            e,
                        )
                if pending is not None and time.monotonic() >= retry_at:
                    asyncio.run(self.apply(pending))
                    if self.retry:  # not committed: a restart reads the record again and retries too
                        self.metrics.retries.inc()
                        retry_at, backoff = time.monotonic() + backoff, min(self.cfg.retry_max_s, 2 * backoff)
                        continue
                    pending, backoff = None, self.cfg.retry_base_s
                if pending is None and uncommitted:
                    try:
                        consumer.commit(timeout_ms=2000)  # bounded: the loop must go on while the broker is away
                    except KafkaError as e:  # the broker away: the records stay uncommitted, tried again next loop
                        self.metrics.commit_failures.inc()
                        log.warning("agent %s could not commit its weights offset (%s); retrying", self.cfg.name, e)
                        continue
                    self.state["control_seq"] = guard.last
                    self._save_state()
                    uncommitted = False
        finally:
            consumer.close()
            dead_letters.close()
            self.stop_relay()
