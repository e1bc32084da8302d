"""Download a version's pieces from a store server: parallel, resumable, checked against their digests, each
request with the fleet read credential (weight_sync.fleet_credential).

With a relay (PeerLink), every request tells the store where this agent's relay listens; the store may
answer with a redirect to a peer that has the piece (weight_sync.store.relay). The client follows it
itself, so it knows the bytes came from a peer: if the peer fails (refused, 404, bytes that fail their
digest or signature, slower than weight_sync.agent.peer_rate allows), nothing it sent is kept and the piece is
fetched again from the store with `direct=1&failed=<peer>`. A lying peer costs one extra store transfer,
never a wrong weight; a slow one seconds. Verified pieces go to the relay cache for the agents after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlencode, urljoin

import aiohttp

from weight_sync import codec, fleet_credential
from weight_sync.agent.fetch_errors import FetchError, NotInStore, PackUnsupported
from weight_sync.agent.peer_rate import PeerBound, PeerFailed as _PeerFailed, from_peer
from weight_sync.agent.relay import RelayCache
from weight_sync.codec import ChunkMeta
from weight_sync.store.relay import PEER_HEADER, peer_url
from weight_sync.store.server import chunk_name

_REDIRECTS = (301, 302, 303, 307, 308)
MAX_PIECE = 1 << 30  # a manifest, signature or side file from a peer: more than this is a lie


@dataclass
class PeerLink:
    """What an agent with a relay gives its client: its URL (told to the store), the cache verified pieces go
    to, the key a peer's manifest must be signed with, how slow a peer may be (weight_sync.agent.peer_rate)."""

    url: str
    cache: RelayCache
    public_key: object  # Ed25519PublicKey
    bound: PeerBound = field(default_factory=PeerBound)


class StoreClient:
    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        download_dir: Path,
        parallel: int = 4,
        retries: int = 3,
        timeout_s: float = 120.0,
        relay: PeerLink | None = None,
        on_bytes: Callable[[str, int], None] | None = None,
        on_fallback: Callable[[str], None] | None = None,
        token: str | None = None,
    ):
        self.base = base_url.rstrip("/")
        self.session = session
        self.dir = Path(download_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sem = asyncio.Semaphore(parallel)
        self.retries = retries
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.relay = relay
        self.auth = fleet_credential.headers(token)  # the fleet read credential, on every request
        self.on_bytes = on_bytes  # (source: "store" | "peer", bytes): the agent's counters
        self.on_fallback = on_fallback  # (reason): a peer failed and the store served instead
        self.bytes_downloaded = 0
        self.bytes_from_store = 0
        self.bytes_from_peers = 0
        self.fallbacks: dict[str, int] = {}
        self.resumed = 0

    # ------------------------------------------------------------------ accounting
    def _got(self, source: str, n: int) -> None:
        self.bytes_downloaded += n
        if source == "store":
            self.bytes_from_store += n
        else:
            self.bytes_from_peers += n
        if self.on_bytes is not None:
            self.on_bytes(source, n)

    def _fell_back(self, reason: str) -> None:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1
        if self.on_fallback is not None:
            self.on_fallback(reason)

    def _receiving(self, version: int, piece: str):
        return self.relay.cache.receiving(version, piece) if self.relay else contextlib.nullcontext()

    # ------------------------------------------------------------------ plain pieces
    async def _get(self, path: str) -> bytes:
        return await self._body(await self._follow(f"{self.base}{path}", {}, self.timeout), path)

    async def _follow(self, url: str, headers: dict, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        """GET url, following redirects here: aiohttp drops the credential on one to another host or port."""
        for _ in range(10):
            r = await self.session.get(url, headers={**self.auth, **headers}, timeout=timeout, allow_redirects=False)
            if r.status not in _REDIRECTS:
                return r
            r.release()
            url = urljoin(url, r.headers.get("Location", ""))
        raise FetchError(f"{url}: too many redirects")

    async def _body(self, r: aiohttp.ClientResponse, path: str) -> bytes:
        """A store response's whole body (counted as from the store), or FetchError."""
        async with r:
            if r.status == 404:
                raise NotInStore(f"{path}: not in the store")
            if r.status != 200:
                raise FetchError(f"{path}: HTTP {r.status}{fleet_credential.hint(r.status)}")
            data = await r.read()
        self._got("store", len(data))
        return data

    async def versions(self) -> dict:
        return json.loads(await self._get("/versions"))

    async def manifest(self, version: int) -> tuple[bytes, bytes]:
        if self.relay is not None:
            return await self._relayed_manifest(version)
        body = await self._get(f"/versions/{version}/manifest.json")
        try:
            sig = await self._get(f"/versions/{version}/manifest.sig")
        except NotInStore:  # refused as unsigned by the caller's verify; a store failing is not "unsigned"
            sig = b""
        return body, sig

    async def file(self, version: int, name: str, want_digest: str) -> bytes:
        piece = f"files/{name}"
        if self.relay is None:
            data = await self._get(f"/versions/{version}/{piece}")
        else:
            with self._receiving(version, piece):
                data = await self._small(version, piece, lambda d: codec.digest(d) == want_digest)
                if codec.digest(data) == want_digest:
                    self.relay.cache.put(version, piece, data)
        if codec.digest(data) != want_digest:
            raise FetchError(f"file {name} of v{version}: digest mismatch")
        return data

    # ------------------------------------------------------------------ through the relay
    def _url(self, version: int, piece: str, failed: str | None = None, direct: bool = False) -> str:
        url = f"{self.base}/versions/{version}/{piece}"
        if self.relay is None:
            return url
        q = {"peer": self.relay.url}
        if failed is not None or direct:
            q["direct"] = "1"
        if failed is not None:
            q["failed"] = failed
        return f"{url}?{urlencode(q)}"

    async def _store_get(
        self,
        version: int,
        piece: str,
        failed: str | None = None,
        headers: dict | None = None,
        direct: bool = False,
    ) -> tuple[aiohttp.ClientResponse | None, tuple[str, str] | None]:
        """GET a piece from the store: (its response, None), or (None, (peer, location)) when the store sends
        this agent to a peer. Other redirects (a proxy in front of the store) are followed, as before relays.
        `direct`: the store serves it (a retry: a peer waiting on this agent for the piece may be next in line)."""
        url = self._url(version, piece, failed, direct)
        for _ in range(10):
            r = await self.session.get(
                url, headers={**self.auth, **(headers or {})}, timeout=self.timeout, allow_redirects=False
            )
            if r.status not in _REDIRECTS:
                return r, None
            location, peer = r.headers.get("Location", ""), r.headers.get(PEER_HEADER)
            r.release()
            if peer is not None and self.relay is not None and failed is None:
                try:
                    peer = peer_url(peer)
                except ValueError:
                    raise FetchError(f"{piece} of v{version}: the store named a bad peer {peer!r}") from None
                if location != f"{peer}/versions/{version}/{piece}":
                    raise FetchError(f"{piece} of v{version}: the store sent us to {location!r} for {peer}")
                if peer == self.relay.url:  # sent to ourselves (an address that reaches this agent): go direct
                    url = self._url(version, piece, direct=True)
                    continue
                return None, (peer, location)
            url = urljoin(url, location)
        raise FetchError(f"{piece} of v{version}: too many redirects")

    async def _from_peer(self, location: str, peer: str, write: Callable[[bytes], object], limit: int) -> None:
        """Stream a piece from a peer into write(); anything wrong is _PeerFailed (the caller goes direct):
        a peer slower than the bound (weight_sync.agent.peer_rate) is "slow", within seconds."""
        async for block in from_peer(self.session, location, peer, self.relay.bound, self.auth, limit):  # type: ignore[union-attr]  # only with a relay
            write(block)
            self._got("peer", len(block))

    async def _fetch_small(self, version: int, piece: str, failed: str | None = None) -> tuple[bytes, str | None]:
        """A small piece and the peer it came from (None: the store)."""
        r, to_peer = await self._store_get(version, piece, failed)
        if r is not None:
            return await self._body(r, f"/versions/{version}/{piece}"), None
        assert to_peer is not None, "no answer from the store: sent to a peer"
        peer, location = to_peer
        buf = bytearray()
        await self._from_peer(location, peer, buf.extend, MAX_PIECE)
        return bytes(buf), peer

    async def _small(self, version: int, piece: str, ok: Callable[[bytes], bool]) -> bytes:
        """A side file through the relay: from the store when the peer fails or its bytes fail ok()."""
        try:
            data, peer = await self._fetch_small(version, piece)
            if peer is not None and not ok(data):
                raise _PeerFailed(peer, "corrupt")
        except _PeerFailed as e:
            self._fell_back(e.reason)
            data, _ = await self._fetch_small(version, piece, failed=e.peer)
        return data

    async def _relayed_manifest(self, version: int) -> tuple[bytes, bytes]:
        """Manifest and signature through the relay. A peer's copy is used only if it verifies (a wrong one
        from a peer must not get the version rejected); the store's is returned as it is (the agent judges)."""
        from weight_sync.manifest import ManifestError, verify

        def signed(body: bytes, sig: bytes) -> bool:
            # Signed, and for this version: another version's signed manifest, replayed by a peer as this
            # one's, would otherwise pass and get this version rejected for good.
            try:
                return verify(body, sig, self.relay.public_key).version == version  # type: ignore[union-attr, arg-type]  # only with a relay
            except ManifestError:
                return False

        async def both(failed: str | None = None) -> tuple[bytes, bytes, str | None]:
            bad = None
            try:
                body, p1 = await self._fetch_small(version, "manifest.json", failed)
                try:
                    sig, p2 = await self._fetch_small(version, "manifest.sig", failed)
                except NotInStore:
                    sig, p2 = b"", None
            except _PeerFailed as e:
                self._fell_back(e.reason)
                return await both(e.peer)
            if (p1 or p2) and not signed(body, sig):
                bad = p1 or p2
            return body, sig, bad

        with self._receiving(version, "manifest.json"), self._receiving(version, "manifest.sig"):
            body, sig, bad = await both()
            if bad is not None:
                self._fell_back("corrupt")
                body, sig, _ = await both(bad)
            if signed(body, sig):
                self.relay.cache.put(version, "manifest.json", body)  # type: ignore[union-attr]  # only with a relay
                self.relay.cache.put(version, "manifest.sig", sig)  # type: ignore[union-attr]
        return body, sig

    # ------------------------------------------------------------------ chunks
    async def _download(
        self, version: int, piece: str, part: Path, have: int, size: int, failed: str | None, direct: bool = False
    ) -> str | None:
        """Append the rest of a chunk to `part`, from the store or the peer it sends us to (returned)."""
        r, to_peer = await self._store_get(
            version, piece, failed, {"Range": f"bytes={have}-"} if have else None, direct
        )
        if r is not None:
            async with r:
                if r.status == 404:
                    raise NotInStore(f"chunk {piece} of v{version}: not in the store")
                if r.status not in (200, 206):
                    raise FetchError(f"chunk {piece} of v{version}: HTTP {r.status}{fleet_credential.hint(r.status)}")
                if have and r.status == 206:
                    self.resumed += 1
                with open(part, "ab" if r.status == 206 else "wb") as f:
                    async for block in r.content.iter_chunked(1 << 20):
                        f.write(block)
                        self._got("store", len(block))
            return None
        assert to_peer is not None, "no answer from the store: sent to a peer"
        peer, location = to_peer
        with open(part, "wb") as f:  # a peer sends the whole piece
            await self._from_peer(location, peer, f.write, size)
        return peer

    async def chunk(self, version: int, t: int, c: int, size: int, want_digest: str) -> bytes:
        """One chunk, resumed with a Range request if an earlier transfer from the store broke off."""
        name = chunk_name(t, c)
        piece = f"chunks/{name}"
        part = self.dir / f"v{version}-{name}.part"
        last: Exception | None = None
        failed = None  # a peer that failed us: from then on the store serves this chunk itself
        async with self.sem:
            with self._receiving(version, piece):
                attempts = 0
                while attempts < self.retries:
                    have = part.stat().st_size if part.exists() else 0
                    if have > size:
                        part.unlink()
                        have = 0
                    try:
                        peer = (
                            await self._download(version, piece, part, have, size, failed, direct=attempts > 0)
                            if have < size
                            else None
                        )
                        data = part.read_bytes()
                        if len(data) == size and codec.digest(data) == want_digest:
                            if self.relay is not None:
                                self.relay.cache.adopt(version, piece, part)
                            else:
                                part.unlink()
                            return data
                        part.unlink()  # complete but wrong: start over
                        if peer is not None:
                            raise _PeerFailed(peer, "corrupt")
                        last = FetchError(f"chunk {name} of v{version}: digest mismatch")
                        attempts += 1
                    except _PeerFailed as e:  # nothing a failing peer sent is kept; not one of the retries
                        part.unlink(missing_ok=True)
                        self._fell_back(e.reason)
                        failed = e.peer
                    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                        last = e  # broken transfer: the .part file keeps what arrived
                        attempts += 1
        raise FetchError(f"chunk {name} of v{version}: {last}")

    async def pack(
        self, version: int, pieces: list[tuple[int, int, ChunkMeta]], on_chunk: Callable[[int, int, bytes], None]
    ) -> None:
        """The chunks of Manifest.pack() from the store's /versions/N/changed, in one response: each goes to
        on_chunk(t, c, bytes) as soon as it has arrived and its digest checks. A transfer that breaks off resumes
        where it stopped (Range), up to `retries` times. The first chunk that fails its digest ends the pack
        (the store's framing is no longer trusted): it and every chunk not yet here are fetched on their own
        (chunk(), in parallel). Never through a peer: with a relay, chunk by chunk is what spares the store.
        Raises PackUnsupported (nothing delivered) or FetchError."""
        url, attempts, i, buf = f"{self.base}/versions/{version}/changed", 0, 0, bytearray()
        total = sum(meta.size for _, _, meta in pieces)
        done = 0  # bytes of the pack in the chunks handed on

        def take() -> bool:
            """Hand on every whole chunk in buf; False at one that fails its digest (it stays in buf)."""
            nonlocal i, done
            while i < len(pieces) and len(buf) >= pieces[i][2].size:
                t, c, meta = pieces[i]
                data = bytes(buf[: meta.size])
                if codec.digest(data) != meta.digest:
                    return False
                del buf[: meta.size]
                on_chunk(t, c, data)
                i, done = i + 1, done + meta.size
            return True

        # No limit on the whole transfer, which grows with what changed; one on every read.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout.total, sock_read=self.timeout.total)
        trusted = True
        while trusted and i < len(pieces):
            have = done + len(buf)
            try:
                headers = {"Range": f"bytes={have}-"} if have else {}
                async with await self._follow(url, headers, timeout) as r:
                    if r.status == 404 and not have:
                        raise PackUnsupported(f"{url}: not served by this store")
                    if r.status not in (200, 206) or (have and r.status != 206):
                        raise FetchError(f"{url}: HTTP {r.status}{fleet_credential.hint(r.status)}")
                    if have and not r.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
                        raise FetchError(f"{url}: resumed at {r.headers.get('Content-Range')!r}, asked for {have}")
                    if have:
                        self.resumed += 1
                    async for block in r.content.iter_chunked(1 << 20):
                        self._got("store", len(block))
                        buf += block
                        trusted = take()
                        if not trusted or done + len(buf) >= total:
                            break  # a chunk failed its digest, or the whole pack is here (nothing more is read)
                if trusted and i < len(pieces):
                    raise aiohttp.ClientPayloadError(f"the pack of v{version} ended early")
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                attempts += 1  # what arrived is kept: the next request resumes after it
                if attempts >= self.retries:
                    raise FetchError(f"{url}: {type(e).__name__}: {e}") from None

        # From the first chunk that failed its digest on: each alone, in parallel (a failure cancels the rest).
        async def alone(t: int, c: int, meta: ChunkMeta) -> None:
            on_chunk(t, c, await self.chunk(version, t, c, meta.size, meta.digest))

        try:
            async with asyncio.TaskGroup() as group:
                for t, c, meta in pieces[i:]:
                    group.create_task(alone(t, c, meta))
        except ExceptionGroup as e:
            raise e.exceptions[0] from None
