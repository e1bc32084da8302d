"""API keys, the admin token, and completion ids that prove who they were issued to.

Keys are stored hashed (sha256); a tenant's id is a prefix of its key's hash, so events carry a stable
tenant id and never the key. Completion ids are signed: `cmpl-<issued>-<nonce>-<tenant>-<mac>`, with an
HMAC over the rest, so any gateway holding the id secret can tell an unknown or expired id (404) from
another tenant's (403) without shared state.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from admin_api.tokens import CAPABILITIES, AdminTokens, needed
from contracts import events as ev
from infra.config import env
from infra.files import write_durably
from serving.config import check_tenant_limits
from serving.protocol.schema import ApiError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tenant:
    id: str  # 16 hex chars of sha256(key)
    name: str
    train: str = "allow"  # the tenant's policy when the request came (serving.auth.Policy)


@dataclass(frozen=True)
class Policy:
    """What a tenant lets Flywheel do with its code. `train: deny`: requests are served and counted, but
    events carry no content and nothing is trained on. `retention_days`: the trainer does not train on its
    events older than that. `forgotten_before`: every event up to then is forgotten (flywheel tenants forget).
    `version`: set by each change (set_policy) above any before it in that file and at least its wall time in
    microseconds, so a change made through one gateway outranks what another gateway's stale keys file still
    says: every reader of the tenants topic keeps the highest version (online_rl.data.tenants). 0: never changed."""

    train: str = "allow"
    retention_days: float | None = None
    forgotten_before: float | None = None
    version: int = 0

    def view(self) -> dict:
        return {"train": self.train, "retention_days": self.retention_days, "forgotten_before": self.forgotten_before}

    def stored(self) -> dict:
        """As the keys file holds it."""
        return {**self.view(), "version": self.version}


def next_version(old: int) -> int:
    """A policy version after `old`: the wall clock in microseconds, or old + 1 where a clock behind says less."""
    return max(old + 1, time.time_ns() // 1000)


def check_policy(train=None, retention_days=None, forgotten_before=None, version=None) -> None:
    """A clear error for a policy nobody can mean (the admin API turns it into a 400; in the keys file, the
    gateway refuses to start on it, or keeps the policies it had)."""
    if forgotten_before is not None and (
        isinstance(forgotten_before, bool)
        or not isinstance(forgotten_before, (int, float))
        or not 0 <= forgotten_before < float("inf")
    ):
        raise ValueError("forgotten_before must be a Unix time")
    if train is not None and train not in ev.TRAIN_POLICIES:
        raise ValueError(f"train must be one of {', '.join(ev.TRAIN_POLICIES)}, not {train!r}")
    if retention_days is not None and (
        isinstance(retention_days, bool)
        or not isinstance(retention_days, (int, float))
        or not 0 < retention_days <= 36500
    ):
        raise ValueError("retention_days must be a number of days in (0, 36500]")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise ValueError("version must be a non-negative integer")


def _raw(text: str) -> bytes:
    """Header text back to its bytes: aiohttp keeps undecodable bytes as surrogates, which a plain
    encode() refuses (a key of non-ASCII bytes is simply a wrong key, never a 500)."""
    return text.encode("utf-8", "surrogateescape")


def hash_key(key: str) -> str:
    return hashlib.sha256(_raw(key)).hexdigest()


def new_key() -> str:
    return "fw-" + secrets.token_urlsafe(24)


class KeyStore:
    """Maps presented API keys to tenants, and tenants to their policies. Sources: a JSON keys file of
    hashes and policies, and/or the env. The file is read again when it changes (`flywheel keys`, the admin
    API of another gateway on this host), at most once a second."""

    def __init__(self, hashed: dict[str, str], policies: dict[str, Policy] | None = None):
        self.policies = dict(policies or {})  # name -> Policy (a name absent: the default)
        self.limits: dict[str, dict] = {}  # name -> its own request limits (serving.config.TenantLimitsConfig)
        self._by_hash = {h: Tenant(id=h[:16], name=name, train=self.policy(name).train) for h, name in hashed.items()}
        self._source: tuple[Path | None, str | None] = (None, None)
        self.load_error: str | None = None  # the keys file's last reload failed: why (its changes wait)
        self._stamp: bytes | None = None
        self._checked = 0.0

    @classmethod
    def load(cls, keys_file: Path | None = None, env_value: str | None = None) -> "KeyStore":
        """keys_file: {"keys": [{"name": ..., "sha256": ...}], "tenants": {name: policy}};
        env_value: "name:key,name:key"."""
        hashed: dict[str, str] = {}
        data = _read(keys_file)
        for entry in data.get("keys", []):
            hashed[entry["sha256"]] = entry["name"]
        for item in filter(None, (env_value or "").split(",")):
            name, _, key = item.strip().partition(":")
            if not key:
                raise ValueError("FLYWHEEL_API_KEYS entries are name:key")
            hashed[hash_key(key)] = name
        store = cls(hashed, {name: _policy(name, p) for name, p in data.get("tenants", {}).items()})
        store._source, store._stamp = (keys_file, env_value), _stamp(keys_file)
        limits = data.get("limits", {})
        if not isinstance(limits, dict):
            raise ValueError('"limits" is an object of tenant names and their limits')
        store.limits = {name: check_tenant_limits(name, fields) for name, fields in limits.items()}
        return store

    def reload_if_changed(self, min_interval_s: float = 1.0) -> dict[str, Policy] | None:
        """Read the keys file again if it changed; the policies that changed ({name: new}), else None."""
        now = time.monotonic()
        if self._source[0] is None or now - self._checked < min_interval_s:
            return None
        self._checked = now
        stamp = _stamp(self._source[0])
        if stamp == self._stamp:
            return None
        try:
            fresh = KeyStore.load(*self._source)
        except (ValueError, KeyError, TypeError) as e:  # a half-edited file: keep serving on what we have
            log.error("keys file %s unreadable (%s); keeping the keys loaded before", self._source[0], e)
            self._stamp = stamp
            self.load_error = f"keys file {self._source[0]} unreadable ({e}): its changes are not in effect"
            return None
        self.load_error = None
        # A policy that changed, or a tenant with a policy that gained a key (its new id needs its record).
        ids, fresh_ids = self.tenants(), fresh.tenants()
        changed = {
            n: fresh.policy(n)
            for n in set(self.policies) | set(fresh.policies)
            if self.policy(n) != fresh.policy(n) or (n in fresh.policies and ids.get(n) != fresh_ids.get(n))
        }
        self.policies, self._by_hash, self._stamp = fresh.policies, fresh._by_hash, fresh._stamp
        self.limits = fresh.limits
        return changed

    def lookup(self, key: str | None) -> Tenant | None:
        if not key:
            return None
        return self._by_hash.get(hash_key(key))

    def policy(self, name: str) -> Policy:
        return self.policies.get(name, Policy())

    def tenants(self) -> dict[str, list[str]]:
        """Each tenant name and the ids of its keys (one per key)."""
        out: dict[str, list[str]] = {}
        for t in self._by_hash.values():
            out.setdefault(t.name, []).append(t.id)
        return {n: sorted(ids) for n, ids in sorted(out.items())}

    def __len__(self) -> int:
        return len(self._by_hash)


def _policy(name: str, fields) -> Policy:
    """A policy from the keys file, checked: a hand edit that says "Deny" must not mean allow."""
    if not isinstance(fields, dict) or set(fields) - set(Policy.__dataclass_fields__):
        raise ValueError(f"tenant {name!r}: a policy is an object of {', '.join(Policy.__dataclass_fields__)}")
    try:
        optional = (fields.get(k) for k in ("retention_days", "forgotten_before", "version"))
        check_policy(fields.get("train", "allow"), *optional)
    except ValueError as e:
        raise ValueError(f"tenant {name!r}: {e}") from None
    return Policy(**fields)


def _read(keys_file: Path | None) -> dict:
    if keys_file is None or not Path(keys_file).exists():
        return {}
    return json.loads(Path(keys_file).read_text())


def _stamp(keys_file: Path | None) -> bytes | None:
    """What the file holds, hashed: mtime and inode can repeat across two quick writes, the content cannot."""
    try:
        return None if keys_file is None else hashlib.sha256(Path(keys_file).read_bytes()).digest()
    except OSError:
        return None


def _write(keys_file: Path, data: dict) -> None:
    keys_file.parent.mkdir(parents=True, exist_ok=True)
    write_durably(keys_file, (json.dumps(data, indent=2) + "\n").encode(), mode=0o600)  # it holds the forgets


def add_key(keys_file: Path, name: str) -> str:
    """Create a key for `name`, store only its hash in keys_file, return the key (shown once)."""
    keys_file = Path(keys_file)
    with _locked(keys_file):
        data = _read(keys_file) or {"keys": []}
        key = new_key()
        data.setdefault("keys", []).append({"name": name, "sha256": hash_key(key), "created": int(time.time())})
        _write(keys_file, data)
    return key


def set_policy(keys_file: Path, name: str, **changes) -> Policy:
    """Change `name`'s policy in keys_file (train, retention_days, forgotten_before; a forgotten_before only
    grows); returns the new policy. The gateways reading that file apply it within a second."""
    check_policy(changes.get("train"), changes.get("retention_days"), changes.get("forgotten_before"))
    keys_file = Path(keys_file)
    with _locked(keys_file):
        data = _read(keys_file) or {"keys": []}
        policies = data.setdefault("tenants", {})
        for other, fields in policies.items():  # a file no gateway can load must not take a change silently
            _policy(other, fields)
        old = Policy(**policies.get(name, {}))
        before = changes.get("forgotten_before")
        if before is not None and old.forgotten_before is not None:
            changes["forgotten_before"] = max(before, old.forgotten_before)
        new = Policy(**{**old.view(), **changes, "version": next_version(old.version)})
        policies[name] = new.stored()
        _write(keys_file, data)
    return new


@contextlib.contextmanager
def _locked(keys_file: Path):
    """One writer of the keys file at a time (the CLI and a gateway's admin API may both write it)."""
    keys_file.parent.mkdir(parents=True, exist_ok=True)
    with open(keys_file.with_suffix(".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


TENANT = web.RequestKey("tenant", Tenant)  # the request's tenant, set by tenant_middleware


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def tenant_middleware(keys: KeyStore):
    """Every request to the public API names its tenant by key (`request[TENANT]`), else 401. A path
    that matches no route passes through to its 404/405."""

    @web.middleware
    async def tenant(request: web.Request, handler):
        if request.match_info.http_exception is None:
            key = bearer(request.headers.get("Authorization")) or request.headers.get("X-Api-Key")
            found = keys.lookup(key)
            if found is None:
                raise ApiError(
                    401,
                    "Incorrect API key provided"
                    if key
                    else "Missing API key: send Authorization: Bearer <key> (or x-api-key: <key>)",
                    "authentication_error",
                    code="invalid_api_key",
                )
            request[TENANT] = found
        return await handler(request)

    return tenant


def admin_middleware(tokens: AdminTokens | str | None):
    """Every admin request carries a token that grants what it asks (admin_api.tokens: status, weights or
    tenants), else 401 (none of ours) or 403 (ours, without that capability). A path that matches no route
    passes through to its 404/405, as on the public API. A plain string is the operator's token (all)."""
    if not isinstance(tokens, AdminTokens):
        tokens = AdminTokens(all=tokens)

    @web.middleware
    async def admin(request: web.Request, handler):
        if request.match_info.http_exception is None:
            presented, need = bearer(request.headers.get("Authorization")), needed(request.method, request.path)
            if not tokens.grants(presented, need):
                if any(tokens.grants(presented, cap) for cap in CAPABILITIES):
                    raise ApiError(
                        403, f"this admin token does not grant {need!r}", "permission_error", code="missing_capability"
                    )
                raise ApiError(
                    401, "admin endpoints need the admin token", "authentication_error", code="invalid_admin_token"
                )
        return await handler(request)

    return admin


class CompletionIds:
    """Issue and check signed completion ids."""

    def __init__(self, secret: bytes, ttl_s: float = 7 * 24 * 3600):
        self.secret = secret
        self.ttl_s = ttl_s

    def _mac(self, body: str) -> str:
        return hmac.new(self.secret, body.encode(), hashlib.sha256).hexdigest()[:16]

    def issue(self, tenant: Tenant) -> str:
        body = f"{int(time.time()):x}-{secrets.token_hex(6)}-{tenant.id}"
        return f"cmpl-{body}-{self._mac(body)}"

    def check(self, tenant: Tenant, completion_id, param: str = "completion_id") -> str:
        """The id, if it is one we issued to this tenant: else 404 (unknown, expired) or 403 (another's). A
        Responses or Messages id (`resp_` / `msg_` + the completion id) is taken for its completion id."""
        if not isinstance(completion_id, str) or not completion_id:
            raise ApiError(400, f"'{param}' must be a non-empty string", param=param, code="invalid_type")
        completion_id = completion_id.removeprefix("resp_").removeprefix("msg_")
        owner = self.owner(completion_id)
        if owner is None:
            raise ApiError(
                404, f"unknown completion id {completion_id[:80]!r}", param=param, code="completion_not_found"
            )
        if owner != tenant.id:
            raise ApiError(
                403,
                "this completion was issued to another API key",
                "permission_error",
                param=param,
                code="not_your_completion",
            )
        return completion_id

    def owner(self, completion_id: str) -> str | None:
        """The tenant id the id was issued to, or None if it is not an id we issued (or it expired)."""
        if not isinstance(completion_id, str) or not completion_id.startswith("cmpl-") or len(completion_id) > 128:
            return None
        parts = completion_id[5:].split("-")
        if len(parts) != 4:
            return None
        issued, nonce, tenant_id, mac = parts
        if not hmac.compare_digest(self._mac(f"{issued}-{nonce}-{tenant_id}"), mac):
            return None
        try:
            if time.time() - int(issued, 16) > self.ttl_s:
                return None
        except ValueError:
            return None
        return tenant_id


def load_or_create_secret(path: Path) -> bytes:
    """The id-signing secret: FLYWHEEL_ID_SECRET, else a file kept beside the gateway's state."""
    given = env("FLYWHEEL_ID_SECRET")
    if given:
        return given.encode()
    path = Path(path)
    if path.exists():
        return path.read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_bytes(32)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(secret)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return secret
