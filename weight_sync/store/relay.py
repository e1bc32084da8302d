"""The store server's side of the peer relay: answer a piece request with its bytes or a redirect to a peer
(weight_sync.store.tracker decides), count every byte the store sends, and show both (/metrics, /stats).

Query parameters an agent with a relay adds to its requests for manifest.json, manifest.sig, chunks/T.C
and files/NAME (an agent without one adds none and is always served the bytes, as before relays existed):

    peer=URL      where the asking agent's relay listens: it holds the piece from now on
    direct=1      serve the bytes, no redirect (the agent's retry after a peer failed it)
    failed=URL    a peer the agent could not fetch from: dropped from every piece of that version

A request with a Range header resumes a transfer from the store and is always served directly. Every one
of these carries the fleet read credential (weight_sync.fleet_credential): without it the store neither
answers nor notes the peer, so an outsider cannot get agents sent to it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from weight_sync.store.tracker import Tracker, TrackerConfig

EGRESS_KIND = web.RequestKey("flywheel_egress_kind", str)  # what a response carries, for the byte count
KINDS = ("manifest", "chunk", "file", "index")
PEER_HEADER = "X-Flywheel-Peer"  # on a redirect to a peer's relay: which peer (other redirects are a proxy's)


def peer_url(raw: str) -> str:
    """A relay's base URL as agents give it (http[s]://host:port, no path, query or credentials); ValueError
    otherwise. The store only ever redirects to <this>/versions/N/<piece>."""
    if len(raw) > 256:
        raise ValueError("peer URL too long")
    u = urlsplit(raw)
    if u.scheme not in ("http", "https") or not u.hostname or u.username or u.password:
        raise ValueError(f"peer URL must be http(s)://host:port, got {raw!r}")
    if u.path.strip("/") or u.query or u.fragment:
        raise ValueError(f"peer URL must have no path, query or fragment, got {raw!r}")
    u.port  # noqa: B018 -- raises ValueError on a bad port
    return f"{u.scheme}://{u.netloc}"


class StoreRelay:
    def __init__(self, versions, cfg: TrackerConfig | None = None):
        self.versions = versions  # () -> the store's versions now (to forget the deleted ones)
        self.tracker = Tracker(cfg)
        self.registry = r = CollectorRegistry()
        self.sent = Counter(
            "flywheel_store_sent_bytes",
            "Body bytes the store sent (a transfer cut short counts whole)",
            ["kind"],
            registry=r,
        )
        self.redirects = Counter(
            "flywheel_store_relay_redirects", "Piece requests sent to a peer's relay instead", ["kind"], registry=r
        )
        self.failed_peers = Counter(
            "flywheel_store_relay_failed_peers", "Reports of a peer an agent could not fetch from", registry=r
        )
        self.refused = Counter(
            "flywheel_store_refused_requests",
            "Requests refused for want of the fleet read credential (missing, or wrong)",
            ["reason"],
            registry=r,
        )
        for reason in ("missing", "wrong"):
            self.refused.labels(reason)
        Gauge(
            "flywheel_store_relay_tracked_pieces", "(version, piece) entries the tracker holds", registry=r
        ).set_function(lambda: len(self.tracker.pieces))
        self.totals = {k: 0 for k in KINDS}
        self.redirect_totals = {k: 0 for k in KINDS}

    # ------------------------------------------------------------------ answering
    def answer(self, request: web.Request, kind: str, version: int, piece: str, path: Path) -> web.StreamResponse:
        """The piece's bytes (Range honoured), or a 307 to a peer that has it. 404 if the store lacks it."""
        if not path.is_file():
            raise web.HTTPNotFound()
        q = request.query
        try:
            peer = peer_url(q["peer"]) if "peer" in q else None
            failed = peer_url(q["failed"]) if "failed" in q else None
        except ValueError as e:
            raise web.HTTPBadRequest(reason=str(e)) from None
        if q.get("direct", "1") != "1":
            raise web.HTTPBadRequest(reason="direct must be 1")
        t = self.tracker
        if version not in t.known:  # a new version: forget those retention deleted meanwhile
            t.retain(set(self.versions()))
            t.known.add(version)
        if failed is not None:
            t.drop(version, failed)
            self.failed_peers.inc()
        if peer is not None:
            if "direct" in q or failed is not None or "Range" in request.headers:
                t.record(version, piece, peer)
            else:
                holder = t.choose(version, piece, peer)
                if holder is not None:
                    self.redirects.labels(kind).inc()
                    self.redirect_totals[kind] += 1
                    raise web.HTTPTemporaryRedirect(
                        f"{holder}/versions/{version}/{piece}", headers={PEER_HEADER: holder}
                    )
        request[EGRESS_KIND] = kind
        return web.FileResponse(path)

    async def _count(self, request: web.Request, response: web.StreamResponse) -> None:
        # on_response_prepare: headers are final, the body is about to go (sendfile bypasses any writer
        # hook, so the body is counted by its announced length).
        kind = request.get(EGRESS_KIND)
        if kind is None or request.method == "HEAD" or response.status not in (200, 206):
            return
        if not response.content_length:
            return
        self.sent.labels(kind).inc(response.content_length)
        self.totals[kind] += response.content_length

    def refuse(self, reason: str) -> None:
        self.refused.labels(reason).inc()

    def count_as(self, request: web.Request, kind: str) -> None:
        request[EGRESS_KIND] = kind

    # ------------------------------------------------------------------ views
    def stats(self) -> dict:
        return {
            "sent_bytes": dict(self.totals),
            "sent_bytes_total": sum(self.totals.values()),
            "redirects": dict(self.redirect_totals),
            "tracker": self.tracker.stats(),
        }

    def install(self, app: web.Application) -> None:
        async def metrics(request):
            return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def stats(request):
            return web.json_response(self.stats())

        app.on_response_prepare.append(self._count)
        app.add_routes([web.get("/metrics", metrics), web.get("/stats", stats)])
