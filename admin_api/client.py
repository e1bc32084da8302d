"""One call to a gateway's admin API (bearer token, JSON in and out), for every client of it: the
off-peak scheduler, the canary controller, the fleet CLI, the local fleet and the load-test scenarios."""

from __future__ import annotations

import json
import urllib.request


def admin_call(
    base_url: str, token: str, method: str, path: str, body: dict | None = None, timeout: float = 10.0
) -> dict:
    """Raises urllib.error.HTTPError on a 4xx/5xx (its body is the gateway's JSON error)."""
    data = json.dumps(body).encode() if body is not None else (b"{}" if method in ("POST", "PUT") else None)
    req = urllib.request.Request(
        f"{base_url.rstrip('/')}{path}",
        method=method,
        data=data,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())
