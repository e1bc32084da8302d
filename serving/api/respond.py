"""JSON responses in the gateway's one shape (orjson; errors as OpenAI error bodies)."""

from __future__ import annotations

import orjson
from aiohttp import web

from serving.schema import ApiError

VERSION_HEADER = "X-Flywheel-Model-Version"
SESSION_HEADER = "X-Session-Id"  # an agent session's id, from the client (else derived: serving.sessions)


def json_response(body, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, headers=headers, content_type="application/json")


def error_response(e: ApiError) -> web.Response:
    return json_response(e.body(), status=e.status)


def fingerprint(version: int | None) -> str | None:
    return None if version is None else f"flywheel-v{version}"
