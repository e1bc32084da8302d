"""The agent's client of a weight store on S3: the StoreClient interface (weight_sync/agent/fetch.py) over obstore.

Same behaviour as the HTTP client: pieces are checked against the manifest's digests, chunks download in
parallel (bounded) into <download_dir>/v<N>-<t>.<c>.part, and a broken transfer resumes with a range get
from the bytes already in the .part file. A missing object is NotInStore, a FetchError (the version is not in the
store); an unreachable or refusing endpoint is an S3StoreError, a ConnectionError, which the agent
retries with backoff rather than rejecting the version.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import obstore
from obstore.exceptions import BaseError as ObstoreError

from weight_sync import codec
from weight_sync.agent.fetch_errors import FetchError, NotInStore
from weight_sync.store.s3 import MANIFEST, SIGNATURE, S3Options, endpoint_of, explain, numbered_prefixes, open_bucket
from weight_sync.store.server import chunk_name

_MISSING = (FileNotFoundError, obstore.exceptions.NotFoundError)


class S3StoreClient:
    def __init__(
        self,
        url: str,
        download_dir: Path,
        parallel: int = 4,
        retries: int = 3,
        timeout_s: float = 120.0,
        options: S3Options | None = None,
    ):
        self.url = url.rstrip("/")
        self.options = options or S3Options(timeout_s=timeout_s)
        self.endpoint = endpoint_of(self.options)
        self.store = open_bucket(url, self.options)  # a malformed URL or endpoint fails here, with ValueError
        self.dir = Path(download_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sem = asyncio.Semaphore(parallel)
        self.retries = retries
        self.bytes_downloaded = 0
        self.resumed = 0

    def _key(self, version: int, name: str) -> str:
        return f"versions/{int(version)}/{name}"

    async def _get(self, key: str) -> bytes:
        try:
            r = await obstore.get_async(self.store, key)
            data = bytes(await r.bytes_async())
        except _MISSING:
            raise NotInStore(f"{key}: not in the store") from None
        except ObstoreError as e:
            raise explain(e, self.url, self.endpoint) from None
        self.bytes_downloaded += len(data)
        return data

    async def _has(self, key: str) -> bool:
        try:
            await obstore.head_async(self.store, key)
            return True
        except _MISSING:
            return False
        except ObstoreError as e:
            raise explain(e, self.url, self.endpoint) from None

    async def versions(self) -> dict:
        """The versions whose manifest.json is in the bucket (a version being uploaded is not yet one).
        Activations live in the publisher's directory store and on the weights topic, not here."""
        try:
            listing = await obstore.list_with_delimiter_async(self.store, "versions/")
        except ObstoreError as e:
            raise explain(e, self.url, self.endpoint) from None
        numbers = sorted(numbered_prefixes(listing))
        found = await asyncio.gather(*(self._has(self._key(v, MANIFEST)) for v in numbers))
        return {"versions": [v for v, ok in zip(numbers, found) if ok], "activations": []}

    async def manifest(self, version: int) -> tuple[bytes, bytes]:
        body = await self._get(self._key(version, MANIFEST))
        try:
            sig = await self._get(self._key(version, SIGNATURE))
        except NotInStore:
            sig = b""  # refused as unsigned by the caller's verify
        return body, sig

    async def file(self, version: int, name: str, want_digest: str) -> bytes:
        data = await self._get(self._key(version, f"files/{name}"))
        if codec.digest(data) != want_digest:
            raise FetchError(f"file {name} of v{version}: digest mismatch")
        return data

    async def chunk(self, version: int, t: int, c: int, size: int, want_digest: str) -> bytes:
        """One chunk, resumed with a range get if an earlier transfer broke off."""
        name = chunk_name(t, c)
        key = self._key(version, f"chunks/{name}")
        part = self.dir / f"v{version}-{name}.part"
        last: Exception | None = None
        async with self.sem:
            for _ in range(self.retries):
                have = part.stat().st_size if part.exists() else 0
                if have > size:
                    part.unlink()
                    have = 0
                try:
                    if have < size:
                        r = await obstore.get_async(
                            self.store, key, options={"range": {"offset": have}} if have else None
                        )
                        resumed = have > 0 and r.range[0] == have
                        self.resumed += resumed
                        with open(part, "ab" if resumed else "wb") as f:
                            async for block in r.stream(min_chunk_size=1 << 20):
                                f.write(block)
                                self.bytes_downloaded += len(block)
                    data = part.read_bytes()
                    if len(data) == size and codec.digest(data) == want_digest:
                        part.unlink()
                        return data
                    part.unlink()  # complete but wrong: start over
                    last = FetchError(f"chunk {name} of v{version}: digest mismatch")
                except _MISSING:
                    part.unlink(missing_ok=True)
                    raise NotInStore(f"chunk {name} of v{version}: not in the store") from None
                except ObstoreError as e:
                    if have and "416" in str(e):  # the object is shorter than what we hold: that is not its head
                        part.unlink(missing_ok=True)
                    last = explain(e, self.url, self.endpoint)  # broken transfer: the .part file keeps what arrived
        raise FetchError(f"chunk {name} of v{version}: {last}")
