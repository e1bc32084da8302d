"""The serving-side agent, one per replica: follow the `weights` topic, rebuild each version, hot-switch.

    weights topic --> decide the target version (newest, or the activated / pinned one)
                  --> fetch manifest + signature --> verify signature, model, base
                  --> rebuild tensor by tensor (chunks fetched in parallel, digests checked) into
                      <work>/versions/<N>/ (weight_sync.agent.local)
                  --> switch the replica: in place (weight_sync.agent.inplace_switch), else a reload
                      (weight_sync.agent.switch) --> record state

Anything wrong with a version (bad signature, digest mismatch, truncated chunk, wrong base, unknown
version, a replica that will not load it) is rejected with one log line and a metric; the replica keeps
the version it has. State (<work>/state.json) holds the last good version, so a restarted agent or
replica comes back on it. Memory: one tensor and a few chunks at a time, whatever the model size.

Here: the loop over the topic, the decision, the switch and its report, the relay's start and stop; the
local copies (rebuild, state, pruning), the metrics and the in-place switch each in their module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp

from contracts import control
from contracts.events import TOPIC_WEIGHTS
from infra import kafka_auth
from kernels import delta as delta_kernels
from weight_sync.agent import inplace_switch
from weight_sync.agent.config import AgentConfig
from weight_sync.agent.fetch import PeerLink, StoreClient
from weight_sync.agent.local import LocalCopies
from weight_sync.agent.metrics import AgentMetrics
from weight_sync.agent.rejected import PERMANENT, Rejected
from weight_sync.agent.relay import RelayCache, RelayServer
from weight_sync.agent.stores import open_store
from weight_sync.agent.switch import GatewayLink, SwitchError, served_version, switch
from weight_sync.manifest import Manifest, load_public

log = logging.getLogger(__name__)


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.public = load_public(cfg.public_key)
        self.metrics = AgentMetrics()
        self.pool = ThreadPoolExecutor(cfg.threads)
        self.local = LocalCopies(cfg, self.public, self.metrics, self.pool)
        self.state = self.local.state  # the one dict: decided here, saved there (state.json)
        self.inplace_parts = inplace_switch.InPlaceParts(cfg, self.metrics, self.local, self.pool, self.gateways)
        self.metrics.version.set(self.state["version"])
        self.metrics.target.set(self.state["version"])  # until the topic says otherwise
        self.metrics.announced.set(self.state.get("latest_seen", self.state["version"]))
        self.metrics.pinned.set(1 if self.state.get("pinned") is not None else 0)
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

    # ------------------------------------------------------------------ local copies (weight_sync.agent.local)
    @property
    def work(self) -> Path:
        return self.local.work

    def local_dir(self, version: int) -> Path:
        return self.local.path(version)

    async def manifest(self, client: StoreClient, version: int) -> Manifest:
        return await self.local.manifest(client, version)

    async def materialize(self, client: StoreClient, version: int) -> Path:
        return await self.local.materialize(client, version)

    def _save_state(self) -> None:
        self.local.save_state()

    def _prune(self) -> None:
        self.local.prune(self.relay_cache)

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
    PERMANENT = PERMANENT  # weight_sync.agent.rejected

    async def apply(self, version: int) -> dict | None:
        """Rebuild and switch to `version`. Returns the switch report, or None if it was rejected or failed
        (`self.retry` then says whether it is worth trying again)."""
        self.retry = False
        t0 = time.monotonic()
        try:
            async with aiohttp.ClientSession() as session:
                client = self.store_client(session)
                report = await inplace_switch.apply(self.inplace_parts, client, session, version, t0)
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
        """Warm the replica's in-place path (weight_sync.agent.inplace_switch.warm)."""
        return await inplace_switch.warm(self.inplace_parts)

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
            elif kind == "gate":  # the eval gate's verdict: nothing to load; a version it passes is announced after
                pass
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
