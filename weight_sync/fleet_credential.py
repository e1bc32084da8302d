"""The fleet read credential: what the weight store's server and every agent's relay ask of each caller.

A version is the model: whoever can read one has the weights. So the store server (`flywheel weights serve`)
and each agent's relay answer only a request that carries the fleet's read token (`Authorization: Bearer
TOKEN`), anything else is a 401 (the comparison takes the same time whatever the guess). The store notes
a relay peer (`?peer=URL`) only on such a request, so an outsider can neither download a version nor
register as a peer that agents would be sent to.

    holders   every weight agent (it fetches, and its relay checks its peers with it), the SRE's
              `flywheel status` (it lists versions); the publisher writes the store's directory and needs none

The token travels in $FLYWHEEL_STORE_TOKEN, never on a command line (DESIGN, Trust). /metrics stays open
for Prometheus, as SGLang's does: byte counts and version sizes, nothing of the weights.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from typing import Callable

from aiohttp import web

ENV = "FLYWHEEL_STORE_TOKEN"
MIN_LENGTH = 16  # a guessable token is no credential
OPEN_PATHS = frozenset({"/metrics"})


def new() -> str:
    return f"fw-fleet-{secrets.token_urlsafe(24)}"


def from_env() -> str | None:
    return os.environ.get(ENV) or None


def checked(token: str | None, who: str = "the weight store") -> str:
    """The token if it can serve as one; ValueError (saying where it comes from) otherwise."""
    if not token:
        raise ValueError(f"{who} needs the fleet read credential: set {ENV} (it never goes on a command line)")
    if len(token) < MIN_LENGTH or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError(f"{ENV} must be at least {MIN_LENGTH} printable ASCII characters without spaces")
    return token


def headers(token: str | None) -> dict[str, str]:
    """The header a request carries the token in (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def hint(status: int) -> str:
    """What to add to an error about an HTTP status from the store or a relay."""
    return f" (the fleet read credential: is {ENV} set, and the store's?)" if status == 401 else ""


def _digest(value: str) -> bytes:
    # Equal-length inputs for compare_digest: the time taken says nothing of the token's length either.
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def matches(authorization: str | None, token: str) -> bool:
    scheme, _, given = (authorization or "").partition(" ")
    ok = hmac.compare_digest(_digest(given.strip()), _digest(token))
    return ok and scheme.lower() == "bearer"


def middleware(token: str | None, who: str, refused: Callable[[str], None] | None = None):
    """An aiohttp middleware that answers 401 to a request without the token (ValueError now if there is
    none to check against: a server never runs open by mistake). refused(reason) counts each refusal:
    "missing" (no credential) or "wrong"."""
    token = checked(token, who)

    @web.middleware
    async def require(request: web.Request, handler):
        if request.path not in OPEN_PATHS and not matches(request.headers.get("Authorization"), token):
            if refused is not None:
                refused("missing" if "Authorization" not in request.headers else "wrong")
            raise web.HTTPUnauthorized(
                reason="the fleet read credential is needed", headers={"WWW-Authenticate": 'Bearer realm="flywheel"'}
            )
        return await handler(request)

    return require
