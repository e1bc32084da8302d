"""Publish a checkpoint as the next version: delta against the previous one (or a full snapshot every K),
signed, atomically visible in the store, announced on the Kafka `weights` topic."""

from __future__ import annotations

import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from contracts import control
from contracts.events import TOPIC_WEIGHTS
from infra import kafka_auth
from infra.config import option
from infra.paths import flywheel_home
from infra.progress import bar
from weight_sync import codec
from weight_sync.checkpoint import SIDE_FILES, CheckpointReader, config_digest, weight_files
from weight_sync.manifest import Manifest, TensorEntry, announcement, key_id, load_private, sign
from weight_sync.store.s3 import S3Options  # at run time: the config's types are read for its flags
from weight_sync.store.server import Store, chunk_name

if TYPE_CHECKING:
    from weight_sync.store.s3 import Bucket

log = logging.getLogger(__name__)


@dataclass
class PublishConfig:
    """Where versions go and how they are cut; the options of `flywheel weights publish` and of the commands
    that announce on the weights topic (infra.config: one flag per option)."""

    # None given: filled in by __post_init__, so a built config always holds a Path
    store: Path = option(None, help="the store directory (None: $FLYWHEEL_HOME/weights/store)")
    private_key: Path = option(None, flag="key", help="the signing key (None: $FLYWHEEL_HOME/weights/keys/signing.pem)")
    full_every: int = option(10, help="every K-th version is a full snapshot, so no chain grows without bound")
    chunk_elems: int = codec.DEFAULT_CHUNK_ELEMS
    level: int = codec.DEFAULT_LEVEL
    threads: int = 2
    keep: int = 10  # versions kept in the store (plus what their chains need)
    kafka_bootstrap: str | None = option(
        None, flag="kafka", env="FLYWHEEL_KAFKA_BOOTSTRAP", help="bootstrap servers for announcements"
    )
    store_url: str | None = option(
        None, env="FLYWHEEL_STORE_URL", help="where agents fetch from (the announcement's manifest location)"
    )
    # A bucket agents fetch from instead (s3://BUCKET/PREFIX; weight_sync/store/s3.py): each version is
    # uploaded there too, manifest last, and announced at its s3:// location. None: the directory store only.
    s3_url: str | None = option(
        None,
        env="FLYWHEEL_S3_URL",
        help="also upload to this bucket, s3://BUCKET/PREFIX, and announce it there (endpoint and credentials: "
        "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)",
    )
    s3_options: S3Options | None = None  # endpoint, credentials; None: the AWS_* environment variables
    canary: bool = False  # announce new versions as canary candidates: agents wait for the canary controller
    progress: bool = False

    def __post_init__(self):
        if self.store is None:
            self.store = flywheel_home() / "weights" / "store"
        if self.private_key is None:
            self.private_key = flywheel_home() / "weights" / "keys" / "signing.pem"


@dataclass
class PublishResult:
    version: int
    base_version: int | None
    kind: str
    raw_bytes: int
    published_bytes: int
    changed_share: float
    seconds: float
    announcement: dict = field(default_factory=dict)  # the weights-topic record (sent unless announce_now=False)

    @property
    def ratio(self) -> float:
        return self.raw_bytes / max(1, self.published_bytes)


def _kafka_send(bootstrap: str, value: bytes, timeout_s: float = 30.0) -> None:
    from kafka import KafkaProducer

    from infra.kafka_admin import RECONNECT_BACKOFF_MAX_MS

    # Bounded waits: a broker that is down fails this call in about timeout_s, and the caller retries.
    # The record expires with it (delivery timeout), so close() has nothing left to flush.
    ms = int(timeout_s * 1000)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        **kafka_auth.client_config(),
        acks="all",
        enable_idempotence=True,
        compression_type="zstd",
        client_id="flywheel-publisher",
        max_block_ms=ms,
        request_timeout_ms=ms // 2,
        delivery_timeout_ms=ms,
        reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
    )
    try:
        # One key for every weights record: a single partition keeps versions and activations in order.
        producer.send(TOPIC_WEIGHTS, key=b"weights", value=value).get(timeout=timeout_s + 5)
    finally:
        producer.close(timeout=5)


def _send_control(cfg: PublishConfig, store: Store, record: dict, timeout_s: float = 30.0, keep: bool = False) -> dict:
    """Number, sign and send one control record (contracts.control) under the store's sequence lock; with
    keep, record it in the store first (a decision retention must honour even if the send then fails)."""
    key = load_private(cfg.private_key)
    floor = None
    if bootstrap := cfg.kafka_bootstrap:
        from weight_sync.topic_floor import highest_seq

        def floor() -> int:
            return highest_seq(bootstrap, key.public_key(), timeout_s)

    with store.sequence(floor) as seq:
        record = control.validate({**record, "seq": seq, "ts": time.time()})
        # In a ledger before it is sent: it may go through even if the send then fails, and the next sequence
        # number must be above it whatever becomes of the counter.
        (store.record_activation if keep else store.record_announcement)(record)
        if cfg.kafka_bootstrap:
            _kafka_send(cfg.kafka_bootstrap, control.encode(record, key, key_id(key.public_key())), timeout_s)
    return record


def announce(cfg: PublishConfig, record: dict, timeout_s: float = 30.0) -> dict:
    """Put a version's announcement on the weights topic (publish() does this unless told not to). Each
    call takes a fresh sequence number, so a caller retrying a failed announcement calls it again. Once
    the broker has it, the store records it (Store.announced)."""
    store = Store(cfg.store)
    sent = _send_control(cfg, store, record, timeout_s)
    if cfg.kafka_bootstrap:
        try:
            store.mark_announced(int(record["version"]))
        except OSError as e:  # sent all the same; a restarted publisher announces it again (harmless)
            log.warning("v%s announced but not recorded as such in the store: %s", record["version"], e)
    return sent


def location(cfg: PublishConfig, store: Store, version: int) -> str:
    """Where the announcement says a version's manifest is: the bucket, the store server, or the directory."""
    base = cfg.s3_url or cfg.store_url
    if base:
        return f"{base.rstrip('/')}/versions/{version}/manifest.json"
    return str(store.version_dir(version) / "manifest.json")


def _bucket(cfg: PublishConfig) -> Bucket | None:
    if not cfg.s3_url:
        return None
    from weight_sync.store.s3 import Bucket

    return Bucket(cfg.s3_url, cfg.s3_options)


def stored_announcement(cfg: PublishConfig, version: int) -> dict:
    """The weights-topic announcement of a version already in the store (a canary candidate if cfg.canary)."""
    store = Store(cfg.store)
    if version not in store.versions():
        raise ValueError(f"version {version} is not in the store (have {store.versions()})")
    body = (store.version_dir(version) / "manifest.json").read_bytes()
    record = announcement(Manifest.parse(body), location(cfg, store, version), codec.digest(body))
    if cfg.canary:
        record["canary"] = True
    return record


def unannounced(cfg: PublishConfig) -> list[dict]:
    """Announcements of the versions in the store that never reached the weights topic, oldest first: what
    a restarted publisher sends before anything new."""
    return [stored_announcement(cfg, v) for v in Store(cfg.store).unannounced()]


HEAD_VERSION = "VERSION"  # in head/: the version head's weights are


def _head_version(head: Path) -> int | None:
    """The version the publisher's head copy holds; None when there is no head or it predates the record
    (then the next version is a full snapshot)."""
    try:
        return int((head / HEAD_VERSION).read_text())
    except (OSError, ValueError):
        return None


def _replace_dir(src: Path, dst: Path) -> None:
    old = dst.with_name(dst.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)


def publish(
    checkpoint: Path,
    cfg: PublishConfig,
    version: int | None = None,
    force_full: bool = False,
    announce_now: bool = True,
) -> PublishResult:
    """Publish `checkpoint` as the next version. With announce_now=False the version is in the store but
    not yet on the weights topic: the caller sends `result.announcement` with announce() (and retries it
    on its own if the broker is away)."""
    t0 = time.monotonic()
    store = Store(cfg.store)
    key = load_private(cfg.private_key)
    checkpoint = Path(checkpoint)
    bucket = _bucket(cfg)
    latest = store.latest()
    if bucket is not None:
        # A publisher that died after an upload and before its local commit left that number in the bucket:
        # it is never reused (a visible version is never overwritten).
        remote = bucket.latest()
        latest = remote if latest is None else latest if remote is None else max(latest, remote)
    version = (0 if latest is None else latest + 1) if version is None else version
    if latest is not None and version <= latest:
        raise ValueError(f"version {version} is not newer than the latest published ({latest})")
    head = store.root / "head"
    head_version = _head_version(head)
    cdigest = config_digest(checkpoint / "config.json")
    new = CheckpointReader(checkpoint)
    base = None
    kind = "full"
    # The delta is coded against head, so it names head's own version as its base: after a crash between
    # committing a version and refreshing head, head is older than the latest, and that is still right.
    if (
        not force_full
        and head_version is not None
        and head_version in store.versions()
        and version % cfg.full_every != 0
    ):
        base = CheckpointReader(head)
        if base.specs() == new.specs() and config_digest(head / "config.json") == cdigest:
            kind = "delta"
        else:
            base.close()
            base = None
    staging = store.staging(version)
    entries, raw_bytes, changed, total = [], 0, 0, 0
    try:
        with ThreadPoolExecutor(cfg.threads) as pool:
            names = sorted(new.names())
            for t, name in enumerate(
                bar(names, desc=f"publish v{version} ({kind})", unit="tensor", enabled=cfg.progress)
            ):
                dtype, shape = new.spec(name)
                bits = new.bits(name)
                chunks = codec.encode_tensor(bits, base.bits(name) if base else None, cfg.chunk_elems, cfg.level, pool)
                for c, (_meta, frame) in enumerate(chunks):
                    (staging / "chunks" / chunk_name(t, c)).write_bytes(frame)
                entries.append(
                    TensorEntry(
                        name=name,
                        dtype=dtype,
                        shape=list(shape),
                        digest=codec.digest(bits),
                        chunks=[m for m, _ in chunks],
                    )
                )
                raw_bytes += bits.nbytes
                changed += sum(m.changed for m, _ in chunks)
                total += bits.size
        files = {}
        for name in SIDE_FILES:
            src = checkpoint / name
            if src.exists():
                shutil.copyfile(src, staging / "files" / name)
                files[name] = codec.digest(src.read_bytes())
        manifest = Manifest(
            version=version,
            base_version=head_version if kind == "delta" else None,
            kind=kind,
            config_digest=cdigest,
            tensors=entries,
            files=files,
        )
        body, signature = sign(manifest, key)
        (staging / "manifest.json").write_bytes(body)
        (staging / "manifest.sig").write_bytes(signature)
        if bucket is not None:  # chunks, files, signature, then the manifest: agents see it from here
            bucket.upload(staging, version)
        store.commit(staging, version)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        new.close()
        if base is not None:
            base.close()

    # The publisher's copy of the newest version: the base of the next delta.
    head_new = store.root / ".head-new"
    shutil.rmtree(head_new, ignore_errors=True)
    head_new.mkdir()
    for f in weight_files(checkpoint):
        shutil.copyfile(f, head_new / f.name)
    for name in SIDE_FILES:
        if (checkpoint / name).exists():
            shutil.copyfile(checkpoint / name, head_new / name)
    (head_new / HEAD_VERSION).write_text(str(version))
    _replace_dir(head_new, head)
    removed = store.retain(cfg.keep, protect=store.decided())
    if bucket is not None:
        from weight_sync.store.s3 import S3StoreError

        try:
            bucket.prune(set(store.versions()), set(removed))
        except (S3StoreError, OSError) as e:  # the version is out; the next publish prunes again
            log.warning("retention in %s failed (tried again next publish): %s", cfg.s3_url, e)

    result = PublishResult(
        version=version,
        base_version=manifest.base_version,
        kind=kind,
        raw_bytes=raw_bytes,
        published_bytes=manifest.nbytes_compressed + len(body),
        changed_share=changed / max(1, total),
        seconds=time.monotonic() - t0,
    )
    result.announcement = announcement(manifest, location(cfg, store, version), codec.digest(body))
    if cfg.canary:
        result.announcement["canary"] = True
    if announce_now:
        announce(cfg, result.announcement)
    log.info(
        "published v%d (%s, base %s): %.1f MB -> %.2f MB (%.1fx), %.1f%% changed, %.2fs",
        version,
        kind,
        manifest.base_version,
        raw_bytes / 2**20,
        result.published_bytes / 2**20,
        result.ratio,
        100 * result.changed_share,
        result.seconds,
    )
    return result


def activate(cfg: PublishConfig, version: int, reason: str, kind: str = "activate", **extra) -> dict:
    """Announce that the fleet serves `version` from now on (rollback), pin/unpin it, a canary trial's
    start and end (kind canary | promote | rollback; weight_sync.canary.controller), or the eval gate's verdict
    (kind gate; weight_sync.gate). Recorded in the store too, so `flywheel weights list` shows every decision."""
    store = Store(cfg.store)
    if kind in ("activate", "pin", "canary", "promote", "gate") and version not in store.versions():
        raise ValueError(f"version {version} is not in the store (have {store.versions()})")
    return _send_control(
        cfg, store, {"schema": control.SCHEMA, "type": kind, "version": version, "reason": reason, **extra}, keep=True
    )
