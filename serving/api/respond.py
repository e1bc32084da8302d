"""JSON responses in the gateway's one shape (orjson; errors as OpenAI error bodies)."""

from __future__ import annotations

from collections.abc import Callable

import orjson
from aiohttp import web

from serving.protocol.schema import ApiError

VERSION_HEADER = "X-Flywheel-Model-Version"
SESSION_HEADER = "X-Session-Id"  # an agent session's id, from the client (else derived: serving.signals.sessions)


def json_response(body, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, headers=headers, content_type="application/json")


def error_response(e: ApiError) -> web.Response:
    return json_response(e.body(), status=e.status)


async def send_event(
    request: web.Request, resp: web.StreamResponse, kind: str, payload: dict, version: Callable[[], str], session
) -> None:
    """One server-sent event of a streamed turn (the Responses and Messages APIs name each event). The first
    sends the headers: the version the pool serves then, and the turn's agent session (if any)."""
    if not resp.prepared:
        resp.headers[VERSION_HEADER] = version()
        if session is not None:
            resp.headers[SESSION_HEADER] = session.session_id
        await resp.prepare(request)
    await resp.write(f"event: {kind}\n".encode() + b"data: " + orjson.dumps(payload) + b"\n\n")


def fingerprint(version: int | None) -> str | None:
    return None if version is None else f"flywheel-v{version}"
