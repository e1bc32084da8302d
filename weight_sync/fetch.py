"""Download a version's pieces from a store server: parallel, resumable, checked against their digests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from weight_sync import codec
from weight_sync.store import chunk_name


class FetchError(Exception):
    """A piece could not be downloaded intact (after retries)."""


class StoreClient:
    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        download_dir: Path,
        parallel: int = 4,
        retries: int = 3,
        timeout_s: float = 120.0,
    ):
        self.base = base_url.rstrip("/")
        self.session = session
        self.dir = Path(download_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sem = asyncio.Semaphore(parallel)
        self.retries = retries
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.bytes_downloaded = 0
        self.resumed = 0

    async def _get(self, path: str) -> bytes:
        async with self.session.get(f"{self.base}{path}", timeout=self.timeout) as r:
            if r.status == 404:
                raise FetchError(f"{path}: not in the store")
            if r.status != 200:
                raise FetchError(f"{path}: HTTP {r.status}")
            data = await r.read()
        self.bytes_downloaded += len(data)
        return data

    async def versions(self) -> dict:
        import json

        return json.loads(await self._get("/versions"))

    async def manifest(self, version: int) -> tuple[bytes, bytes]:
        body = await self._get(f"/versions/{version}/manifest.json")
        try:
            sig = await self._get(f"/versions/{version}/manifest.sig")
        except FetchError:
            sig = b""
        return body, sig

    async def file(self, version: int, name: str, want_digest: str) -> bytes:
        data = await self._get(f"/versions/{version}/files/{name}")
        if codec.digest(data) != want_digest:
            raise FetchError(f"file {name} of v{version}: digest mismatch")
        return data

    async def chunk(self, version: int, t: int, c: int, size: int, want_digest: str) -> bytes:
        """One chunk, resumed with a Range request if an earlier transfer broke off."""
        name = chunk_name(t, c)
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
                        headers = {"Range": f"bytes={have}-"} if have else {}
                        async with self.session.get(
                            f"{self.base}/versions/{version}/chunks/{name}", headers=headers, timeout=self.timeout
                        ) as r:
                            if r.status == 404:
                                raise FetchError(f"chunk {name} of v{version}: not in the store")
                            if r.status not in (200, 206):
                                raise FetchError(f"chunk {name} of v{version}: HTTP {r.status}")
                            if have and r.status == 206:
                                self.resumed += 1
                            with open(part, "ab" if r.status == 206 else "wb") as f:
                                async for block in r.content.iter_chunked(1 << 20):
                                    f.write(block)
                                    self.bytes_downloaded += len(block)
                    data = part.read_bytes()
                    if len(data) == size and codec.digest(data) == want_digest:
                        part.unlink()
                        return data
                    part.unlink()  # complete but wrong: start over
                    last = FetchError(f"chunk {name} of v{version}: digest mismatch")
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    last = e  # broken transfer: the .part file keeps what arrived
        raise FetchError(f"chunk {name} of v{version}: {last}")


from typing import TYPE_CHECKING  # noqa: E402 (kept beside the one function that needs it)

if TYPE_CHECKING:
    from weight_sync.s3_fetch import S3StoreClient


def open_store(
    url: str, session: aiohttp.ClientSession, download_dir: Path, parallel: int = 4
) -> StoreClient | S3StoreClient:
    """The client for a store URL: an S3 bucket (s3://BUCKET/PREFIX, weight_sync/s3_fetch.py; endpoint and
    credentials from the AWS_* variables) or a store server over HTTP."""
    if url.startswith("s3://"):
        from weight_sync.s3_fetch import S3StoreClient  # obstore only where a bucket is used

        return S3StoreClient(url, download_dir, parallel)
    return StoreClient(url, session, download_dir, parallel)
