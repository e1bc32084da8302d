"""The spool's side of forgetting a tenant (`flywheel tenants forget`): which records are forgotten, the file that
says so, and the redaction of what is still on disk.

`<spool>/forgotten.json` maps tenant id -> forgotten_before (a Unix time; values only grow) with a generation
number, written atomically and fsynced by the gateway (EventLog.forget). A record is forgotten when its meta
names such a tenant and its event ts is at or before that time (a record of the tenant without a ts counts as
forgotten: fail closed). The shipper (the spool's one reader) loads the file before it sends anything, and again
whenever the gateway raises the generation (a shared slot) or the file changes (stat, at most every
`STAT_INTERVAL_S`), and then clears its secret scanner's memory of clean lines (users' code, `on_reload`); it
then redacts every forgotten record still on disk, behind and ahead of its cursor, and deletes dead-lettered
copies of them, before it acknowledges the generation (FORGET_GEN) and sends another batch.
`<spool>/forgotten.done` holds the last generation fully redacted, so a shipper started after a crash finishes a
redaction that was cut short.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable

import msgpack

from infra.files import fsync_path, write_durably
from serving.event_log.spool import Position, Spool

log = logging.getLogger(__name__)

FILE = "forgotten.json"
DONE = "forgotten.done"
STAT_INTERVAL_S = 0.2


def load(spool_dir: Path) -> tuple[int, dict[str, float]]:
    """(generation, tenant -> forgotten_before); (0, {}) when nothing was ever forgotten."""
    try:
        d = json.loads((Path(spool_dir) / FILE).read_text())
    except FileNotFoundError:
        return 0, {}
    return int(d["generation"]), {str(k): float(v) for k, v in d["tenants"].items()}


def merge(current: dict[str, float], new: dict[str, float]) -> tuple[dict[str, float], bool]:
    """current with new merged in, each value the larger of the two; and whether anything grew."""
    merged = dict(current)
    for tenant, before in new.items():
        if before is not None and before > merged.get(tenant, float("-inf")):
            merged[tenant] = float(before)
    return merged, merged != current


def _write_atomic(path: Path, text: str) -> None:
    write_durably(path, text.encode())


def save(spool_dir: Path, generation: int, tenants: dict[str, float]) -> None:
    _write_atomic(Path(spool_dir) / FILE, json.dumps({"generation": generation, "tenants": tenants}))


def load_done(spool_dir: Path) -> int:
    try:
        return int((Path(spool_dir) / DONE).read_text())
    except (FileNotFoundError, ValueError):
        return 0


def save_done(spool_dir: Path, generation: int) -> None:
    _write_atomic(Path(spool_dir) / DONE, str(generation))


def matcher(forgotten: dict[str, float]) -> Callable[[dict], bool] | None:
    """meta -> is the record forgotten; None when no tenant is."""
    if not forgotten:
        return None

    def match(meta: dict) -> bool:
        before = forgotten.get(meta.get("tenant", ""))
        if before is None:
            return False
        ts = meta.get("ts")
        return not isinstance(ts, (int, float)) or ts <= before

    return match


def redact(spool: Spool, forgotten: dict[str, float], head: Position, cursor: Position) -> int:
    """Redact every forgotten record on disk up to the head, and delete dead-lettered copies of forgotten events.
    Returns how many redacted records were ahead of the cursor (never sent, now never will be)."""
    match = matcher(forgotten)
    if match is None:
        return 0
    t = time.monotonic()
    ahead = spool.redact(match, head, start=cursor)
    behind = spool.redact(match, cursor)
    gone = _forget_deadletters(spool.dir, match)
    log.info(
        "forgotten tenants: %d record(s) redacted in %s (%d not yet sent), %d dead-letter file(s) deleted, %.2f s",
        ahead + behind,
        spool.dir,
        ahead,
        gone,
        time.monotonic() - t,
    )
    return ahead


def _forget_deadletters(spool_dir: Path, match) -> int:
    gone = 0
    for path in sorted((Path(spool_dir) / "deadletter").glob("*.bin")):
        try:
            d = msgpack.unpackb(path.read_bytes(), raw=False)
        except Exception:  # noqa: BLE001 - not an event: not ours to judge
            continue
        if (
            isinstance(d, dict)
            and isinstance(d.get("tenant"), str)
            and match({"tenant": d["tenant"], "ts": d.get("ts")})
        ):
            path.unlink(missing_ok=True)
            gone += 1
    if gone:
        fsync_path(Path(spool_dir) / "deadletter")  # gone for good before the generation is marked done
    return gone


class Watcher:
    """The shipper's view of forgotten.json: reloaded when the gateway raises the generation or the file changes."""

    def __init__(self, spool_dir: Path, on_reload: Callable[[], None] | None = None):
        self.dir = Path(spool_dir)
        self.on_reload = on_reload  # called after each reload (the shipper clears its scanner's clean lines)
        self.generation, self.tenants = load(self.dir)
        self.match = matcher(self.tenants)
        self._stat = self._stat_now()
        self._checked = time.monotonic()

    def _stat_now(self):
        try:
            st = (self.dir / FILE).stat()
            return st.st_ino, st.st_mtime_ns, st.st_size
        except FileNotFoundError:
            return None

    def changed(self, requested: int) -> bool:
        """Whether the file should be read again: the gateway asked (`requested`, its generation, is ahead of
        ours), or, checked at most every STAT_INTERVAL_S, the file is not the one we read."""
        if requested > self.generation:
            return True
        now = time.monotonic()
        if now - self._checked < STAT_INTERVAL_S:
            return False
        self._checked = now
        return self._stat_now() != self._stat

    def reload(self) -> None:
        self._stat = self._stat_now()
        self.generation, self.tenants = load(self.dir)
        self.match = matcher(self.tenants)
        if self.on_reload is not None:
            self.on_reload()
