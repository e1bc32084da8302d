"""What `store: true` keeps of a Responses API answer: the response object, the conversation it ended (what
`previous_response_id` continues from) and its input items, per tenant, in SQLite beside the gateway's state.

    put / get / delete     by tenant and id: another tenant's id is not found (404), never a 403 that
                           would tell it exists
    expire                 older than its tenant's retention_days (keys file policy), else the default
                           (30 days, as OpenAI keeps them); a read checks the age too, so an expired answer is
                           gone before the sweep reaches it
    forget                 `flywheel tenants forget`: everything of the tenant's key ids up to a time

Gateways on one host share it when they share the state dir (SQLite's WAL: one writer at a time, readers
alongside); gateways on other hosts do not, and a previous_response_id one of them stored is not found on
another (clients that resend the whole input, as Codex does with store=false, are unaffected).

Calls run on one thread of their own (`run`): a write's fsync never holds the event loop.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import zstandard

DAY_S = 86400.0


class ResponseStore:
    def __init__(self, path: Path, default_retention_days: float = 30.0, max_record_bytes: int = 8 << 20):
        self.path, self.default_retention_days, self.max_record_bytes = (
            Path(path),
            default_retention_days,
            max_record_bytes,
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable at each checkpoint, never torn
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created REAL NOT NULL,"
            " body BLOB NOT NULL)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS responses_tenant ON responses (tenant, created)")
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="response-store")
        self._zc, self._zd = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
        self.retention: dict[str, float | None] = {}  # tenant id -> its retention_days (None: the default)

    async def run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._db.close()

    def _max_age_s(self, tenant: str) -> float:
        days = self.retention.get(tenant)
        return DAY_S * (self.default_retention_days if days is None else min(days, self.default_retention_days))

    # ------------------------------------------------------------------ records
    def put(self, tenant: str, rid: str, record: dict) -> bool:
        """record: {response, conversation, items}. False (nothing kept) when it is larger than the bound."""
        blob = self._zc.compress(json.dumps(record, ensure_ascii=False).encode())
        if len(blob) > self.max_record_bytes:
            return False
        self._db.execute(
            "INSERT OR REPLACE INTO responses (id, tenant, created, body) VALUES (?, ?, ?, ?)",
            (rid, tenant, time.time(), blob),
        )
        return True

    def get(self, tenant: str, rid: str) -> dict | None:
        row = self._db.execute(
            "SELECT created, body FROM responses WHERE id = ? AND tenant = ?", (rid, tenant)
        ).fetchone()
        if row is None or time.time() - row[0] > self._max_age_s(tenant):
            return None
        return json.loads(self._zd.decompress(row[1]))

    def delete(self, tenant: str, rid: str) -> bool:
        return self._db.execute("DELETE FROM responses WHERE id = ? AND tenant = ?", (rid, tenant)).rowcount > 0

    # ------------------------------------------------------------------ retention
    def forget(self, tenants: list[str], before: float) -> int:
        """Every stored response of these key ids created at or before `before`; how many went."""
        n = 0
        for t in tenants:
            n += self._db.execute("DELETE FROM responses WHERE tenant = ? AND created <= ?", (t, before)).rowcount
        return n

    def expire(self) -> int:
        """Drop what is past its tenant's retention (the default for tenants without one)."""
        now = time.time()
        n = self._db.execute(
            "DELETE FROM responses WHERE created < ?", (now - DAY_S * self.default_retention_days,)
        ).rowcount
        for tenant, days in self.retention.items():
            if days is not None:
                n += self._db.execute(
                    "DELETE FROM responses WHERE tenant = ? AND created < ?", (tenant, now - DAY_S * days)
                ).rowcount
        return n

    def count(self, tenant: str | None = None) -> int:
        if tenant is None:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
        return self._db.execute("SELECT COUNT(*) FROM responses WHERE tenant = ?", (tenant,)).fetchone()[0]
