"""`flywheel status`: reading its sources (flywheel.status.gather): HTTP GETs whose every failure becomes one line
(Unexpected, its message from explain()), the gateway's admin API, and Prometheus text pages."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

# ----------------------------------------------------------------------------- errors


def explain(e: BaseException, what: str, where: str, timeout_s: float) -> str:
    """One line saying why `what` at `where` could not be read: never a traceback."""
    if isinstance(e, urllib.error.HTTPError):
        detail = ""
        try:
            err = json.loads(e.read() or b"{}").get("error")  # OpenAI-shaped (ours) or Prometheus's string
            detail = err if isinstance(err, str) else (err or {}).get("message", "")
        except Exception:
            pass
        hint = " (check FLYWHEEL_ADMIN_TOKEN)" if e.code in (401, 403) and "admin" in what else ""
        hint = " (check FLYWHEEL_STORE_TOKEN)" if e.code == 401 and "store" in what else hint
        hint = " (is this the right URL?)" if e.code == 404 else hint
        return f"{what} at {where}: HTTP {e.code} {detail or e.reason}{hint}"
    if isinstance(e, urllib.error.URLError):
        e = e.reason if isinstance(e.reason, BaseException) else e
    if isinstance(e, ConnectionRefusedError):
        return f"cannot connect to {what} at {where}: connection refused"
    if isinstance(e, (TimeoutError, socket.timeout)):
        return f"{what} at {where}: no answer within {timeout_s:g} s"
    if isinstance(e, OSError):
        return f"cannot reach {what} at {where}: {e.strerror or e}"
    text = " ".join(str(e).split())[:200]
    return f"{what} at {where}: {type(e).__name__}: {text}" if text else f"{what} at {where}: {type(e).__name__}"


class Unexpected(ValueError):
    """A source answered, but not with what it should (another service on that port, a garbled page)."""


# ----------------------------------------------------------------------------- HTTP and metrics


def get(url: str, timeout_s: float, what: str, headers: dict[str, str] | None = None) -> bytes:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout_s) as r:
            return r.read()
    except Exception as e:
        raise Unexpected(explain(e, what, url, timeout_s)) from None


def get_json(url: str, timeout_s: float, what: str, headers: dict[str, str] | None = None) -> dict:
    body = get(url, timeout_s, what, headers)
    try:
        data = json.loads(body)
    except ValueError:
        raise Unexpected(f"{what} at {url}: the answer is not JSON ({body[:60]!r})") from None
    if not isinstance(data, dict):
        raise Unexpected(f"{what} at {url}: the answer is not a JSON object")
    return data


def admin_get(gateway: str, token: str, path: str, timeout_s: float) -> dict:
    """GET one of the admin API's routes (a path of admin_api.routes)."""
    from admin_api.client import AdminClient

    url = gateway.rstrip("/") + path
    try:
        data = AdminClient(gateway, token, timeout=timeout_s).call("GET", path)
    except Exception as e:
        raise Unexpected(explain(e, "the gateway admin API", url, timeout_s)) from None
    if not isinstance(data, dict):
        raise Unexpected(f"the gateway admin API at {url}: the answer is not a JSON object")
    return data


def samples(text: str, where: str) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text -> sample name -> [(labels, value)]. Unexpected when it does not parse."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict, float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except Exception as e:
        raise Unexpected(f"{where}: not a Prometheus metrics page ({type(e).__name__}: {str(e)[:80]})") from None
    return out


def scrape(url: str, timeout_s: float, what: str) -> dict[str, list[tuple[dict, float]]]:
    body = get(url, timeout_s, what)
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise Unexpected(f"{what} at {url}: not a Prometheus metrics page (not UTF-8)") from None
    return samples(text, f"{what} at {url}")


def total(m: dict, name: str, keep=lambda labels: True) -> float | None:
    rows = [v for labels, v in m.get(name, []) if keep(labels)]
    return sum(rows) if rows else None


def one(m: dict, name: str) -> float | None:
    rows = m.get(name, [])
    return rows[0][1] if rows else None


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """histogram_quantile over cumulative bucket counts {le: count} (Prometheus's interpolation; a quantile
    in the +Inf bucket is the highest finite bound)."""
    if not buckets:
        return None
    les = sorted(buckets)
    n = buckets[les[-1]]
    if n <= 0:
        return None
    rank, prev_le, prev_c = q * n, 0.0, 0.0
    for le in les:
        c = buckets[le]
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 1.0)
        prev_le, prev_c = le, c
    return prev_le


def user_route(labels: dict) -> bool:
    """A request counted under /v1/...: user traffic, not /metrics, /health or /admin (this command, tools)."""
    return labels.get("route", "").startswith("/v1/")
