"""The weight store on S3: the publisher's side (upload a version, list, retention) and the connection both
sides share. The agent's side is weight_sync/agent/s3_fetch.py.

A bucket prefix holds the same layout as the directory store (weight_sync/store/server.py), so nothing else
changes between the two:

    s3://<bucket>/<prefix>/versions/<N>/manifest.json     written LAST: a version exists when this does
                                        manifest.sig
                                        chunks/<t>.<c>
                                        files/<name>

S3 has no rename, so atomic publish is an order of writes: every chunk and side file, then the signature,
then manifest.json. Readers (S3StoreClient.versions, an agent asking for a manifest) see a version only
once its manifest.json is there; a publish that dies earlier leaves objects nobody lists, which the next
upload of that number clears. Deletion runs the other way: manifest.json first. Each PUT is atomic on S3
(a reader never sees half an object); large ones go up in parts, which obstore does for us.

The publisher keeps its directory store as well (head/ is the next delta's base, control_seq, activations,
announced live there, and versions/ is retained as before): the bucket is where agents fetch from.

Client: obstore (Rust's object_store): maintained, asyncio-native for the agent, range gets and multipart
uploads built in, one small wheel. boto3 is synchronous and several times the size.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import obstore
from obstore.exceptions import BaseError as ObstoreError
from obstore.store import S3Store

if TYPE_CHECKING:  # obstore's option types live in its stubs only
    from obstore.store import ClientConfig, RetryConfig, S3Config

from weight_sync.store.server import version_number

log = logging.getLogger(__name__)

MANIFEST, SIGNATURE = "manifest.json", "manifest.sig"
# Objects up to this size go up in one PUT, larger ones in parts of it. Chunks are at most ~16 MB (4M f32
# elements), so they always take one request: in parts of obstore's default 5 MB, uploads to S3Proxy took
# 1.5-3x longer (three requests instead of one, each signed and written).
MULTIPART_ABOVE = 32 << 20
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")  # S3's rule for bucket names
_SEGMENT = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")


class S3StoreError(ConnectionError):
    """The bucket is unreachable, missing, or refuses our credentials. A ConnectionError: for an agent that
    is a transient failure (retried with backoff), never a reason to reject the version itself."""


@dataclass
class S3Options:
    """How to reach the bucket. Each None falls back to the standard AWS_* variable, then to the AWS default
    (credentials from the environment, instance metadata and so on, as obstore resolves them)."""

    endpoint: str | None = None  # $AWS_ENDPOINT_URL (or $AWS_ENDPOINT); None: AWS S3 itself
    access_key_id: str | None = None  # $AWS_ACCESS_KEY_ID
    secret_access_key: str | None = field(default=None, repr=False)  # $AWS_SECRET_ACCESS_KEY (never printed)
    region: str | None = None  # $AWS_REGION / $AWS_DEFAULT_REGION, else us-east-1
    parallel: int = 8  # objects in flight at once while uploading or deleting
    connect_timeout_s: float = 5.0
    timeout_s: float = 120.0  # one request, body included
    retries: int = 3  # obstore's own retries of a failed request (with backoff), before we see an error


def parse_url(url: str) -> tuple[str, str]:
    """s3://bucket[/prefix] -> (bucket, prefix without slashes at either end)."""
    m = re.match(r"^s3://([^/]*)(/.*)?$", url or "")
    if not m:
        raise ValueError(f"bad S3 URL {url!r}: expected s3://BUCKET[/PREFIX]")
    bucket, prefix = m.group(1), (m.group(2) or "").strip("/")
    if not _BUCKET.match(bucket):
        raise ValueError(f"bad S3 URL {url!r}: {bucket!r} is not a bucket name (3-63 of a-z 0-9 . -)")
    for seg in prefix.split("/") if prefix else []:
        if not _SEGMENT.match(seg) or seg in (".", ".."):
            raise ValueError(f"bad S3 URL {url!r}: prefix segment {seg!r} (letters, digits, _ . - only)")
    return bucket, prefix


def endpoint_of(options: S3Options) -> str | None:
    return options.endpoint or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")


def open_bucket(url: str, options: S3Options | None = None) -> S3Store:
    """An obstore S3Store rooted at the URL's prefix. Nothing is contacted yet."""
    options = options or S3Options()
    bucket, prefix = parse_url(url)
    endpoint = endpoint_of(options)
    if endpoint is not None and not re.match(r"^https?://[^/\s]+/?$", endpoint):
        raise ValueError(f"bad S3 endpoint {endpoint!r}: expected http(s)://HOST[:PORT]")
    config: S3Config = {
        # Single-object DELETEs: S3Proxy (and some other S3-compatible stores) refuse the bulk DeleteObjects
        # call with the checksum header obstore sends; retention deletes a few hundred objects per version.
        "disable_bulk_delete": True,
        "region": options.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
    }
    if endpoint:
        config["endpoint"] = endpoint.rstrip("/")
    if options.access_key_id:
        config["access_key_id"] = options.access_key_id
    if options.secret_access_key:
        config["secret_access_key"] = options.secret_access_key
    client: ClientConfig = {
        "allow_http": bool(endpoint and endpoint.startswith("http://")),  # a private S3 on a trusted network
        "connect_timeout": timedelta(seconds=options.connect_timeout_s),
        "timeout": timedelta(seconds=options.timeout_s),
    }
    # obstore's default retries a request for up to 3 minutes: an unreachable endpoint must fail sooner.
    retry: RetryConfig = {
        "max_retries": options.retries,
        "retry_timeout": timedelta(seconds=options.timeout_s),
        "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5), "base": 2},
    }
    try:
        return S3Store(bucket, prefix=prefix or None, config=config, client_options=client, retry_config=retry)
    except ObstoreError as e:
        raise ValueError(f"cannot configure S3 store {url!r}: {_first_line(e)}") from None


def version_key(version: int, name: str) -> str:
    return f"versions/{int(version)}/{name}"


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:400]


def explain(e: BaseException, url: str, endpoint: str | None) -> S3StoreError:
    """An obstore error (not a missing object) as one line that says what to fix."""
    text = str(e)
    where = f"{url} at {endpoint or 'AWS S3'}"
    if "169.254.169.254" in text or "169.254.170.2" in text:  # obstore's last resort: instance credentials
        return S3StoreError(
            f"{where}: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
            f"the instance-metadata fallback did not answer either)"
        )
    if "NoSuchBucket" in text:
        return S3StoreError(f"{where}: no such bucket")
    if isinstance(e, obstore.exceptions.PermissionDeniedError | obstore.exceptions.UnauthenticatedError):
        return S3StoreError(
            f"{where}: credentials refused (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY?): {_first_line(e)}"
        )
    if any(s in text.lower() for s in ("error sending request", "connection refused", "dns error", "tcp connect")):
        return S3StoreError(f"{where}: endpoint unreachable: {_first_line(e)}")
    return S3StoreError(f"{where}: {_first_line(e)}")


def numbered_prefixes(listing: Mapping[str, Any]) -> set[int]:
    """Version numbers under versions/ in a list_with_delimiter answer (some S3 servers list a directory
    as an object too, so both halves are read)."""
    out = set()
    for p in list(listing.get("common_prefixes", [])) + [o["path"] for o in listing.get("objects", [])]:
        name = p.rstrip("/").rsplit("/", 1)[-1]
        if (v := version_number(name)) is not None:
            out.add(v)
    return out


class Bucket:
    """The publisher's view of the bucket: synchronous (publish() is), parallel inside."""

    def __init__(self, url: str, options: S3Options | None = None):
        self.url = url.rstrip("/")
        self.options = options or S3Options()
        self.endpoint = endpoint_of(self.options)
        self.store = open_bucket(url, self.options)

    def _call(self, fn, *args, **kw):
        try:
            return fn(self.store, *args, **kw)
        except (FileNotFoundError, obstore.exceptions.NotFoundError):
            raise
        except ObstoreError as e:
            raise explain(e, self.url, self.endpoint) from None

    def _exists(self, key: str) -> bool:
        try:
            self._call(obstore.head, key)
            return True
        except (FileNotFoundError, obstore.exceptions.NotFoundError):
            return False

    def _all_numbers(self) -> set[int]:
        return numbered_prefixes(self._call(obstore.list_with_delimiter, "versions/"))

    def versions(self) -> list[int]:
        """Versions readers can see: those whose manifest.json is in the bucket."""
        numbers = sorted(self._all_numbers())
        with ThreadPoolExecutor(max(1, min(self.options.parallel, len(numbers)))) as pool:
            seen = list(pool.map(lambda v: self._exists(version_key(v, MANIFEST)), numbers))
        return [v for v, ok in zip(numbers, seen) if ok]

    def latest(self) -> int | None:
        v = self.versions()
        return v[-1] if v else None

    def _keys_of(self, version: int) -> list[str]:
        keys: list[str] = []
        for batch in self._call(obstore.list, f"versions/{int(version)}/"):
            keys.extend(o["path"] for o in batch)
        return keys

    def _delete(self, keys: list[str]) -> None:
        if not keys:
            return
        with ThreadPoolExecutor(max(1, min(self.options.parallel, len(keys)))) as pool:
            list(pool.map(lambda k: self._call(obstore.delete, k), keys))

    def upload(self, src: Path, version: int, before_manifest: Callable[[], None] | None = None) -> int:
        """Put a complete version directory (chunks/, files/, manifest.sig, manifest.json) in the bucket,
        manifest.json last. Returns the bytes sent. `before_manifest` runs just before that last PUT (tests
        use it to fail a publish there)."""
        src = Path(src)
        if self._exists(version_key(version, MANIFEST)):
            raise FileExistsError(f"version {version} is already published in {self.url}")
        # Objects of an upload of this number that died before its manifest: nobody can see them; start clean.
        self._delete(self._keys_of(version))
        pieces = [(version_key(version, f"{d}/{p.name}"), p) for d in ("chunks", "files") for p in (src / d).iterdir()]
        pieces.sort(key=lambda kp: kp[1].stat().st_size, reverse=True)  # the big ones first: less tail

        def put(kp: tuple[str, Path]) -> int:
            self._call(obstore.put, kp[0], kp[1], chunk_size=MULTIPART_ABOVE, max_concurrency=4)
            return kp[1].stat().st_size

        with ThreadPoolExecutor(max(1, min(self.options.parallel, len(pieces)))) as pool:
            sent = sum(pool.map(put, pieces))
        sent += len(signature := (src / SIGNATURE).read_bytes())
        self._call(obstore.put, version_key(version, SIGNATURE), signature)
        if before_manifest is not None:
            before_manifest()
        body = (src / MANIFEST).read_bytes()
        self._call(obstore.put, version_key(version, MANIFEST), body)  # from here on readers see the version
        return sent + len(body)

    def delete(self, versions: list[int]) -> None:
        """Remove versions, each manifest.json first: a half-deleted version is never visible."""
        for v in versions:
            self._call(obstore.delete, version_key(v, MANIFEST))
            self._delete(self._keys_of(v))

    def prune(self, kept: set[int], removed: set[int]) -> list[int]:
        """Retention in the bucket, after the directory store's (`kept`: what it keeps, `removed`: what it
        just deleted). Also goes: versions the bucket has and the directory store lacks that are newer than
        its oldest (a publisher that died between upload and local commit: never announced), and objects
        of uploads that died before their manifest. Older versions only the bucket has are left alone (a
        publisher that lost its directory must not empty the bucket of pinned versions)."""
        visible = set(self.versions())
        floor = min(kept) if kept else None
        doomed = sorted(v for v in visible - kept if v in removed or (floor is not None and v > floor))
        newest = max(visible, default=-1)
        dead = sorted(v for v in self._all_numbers() - visible if v < newest)  # no manifest, a newer version exists
        self.delete(doomed)
        for v in dead:
            self._delete(self._keys_of(v))
        if doomed or dead:
            log.info("bucket %s: removed versions %s, leftovers of %s", self.url, doomed, dead)
        return doomed
