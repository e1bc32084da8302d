"""The store's append-only ledgers (activations.jsonl, announcements.jsonl): one JSON record a line.

A line is appended whole or not at all, as far as a reader can tell: an append that died half-way (disk
full, a kill, a machine crash before the fsync) leaves a tail without its newline, which the next append cuts
off first (its record never reached the broker: ledgers are written before the send). Every append is
fsynced with its directory. A reader skips and logs what it cannot read (such a tail; an older release
appended after one, gluing a whole record to it: that record is kept), never fails on it: a ledger is read at
the trainer's start and by every publish after its commit, and one bad line must stop neither. Appends are
made under the store's sequence lock (Store.sequence), which is also what makes cutting a tail safe.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from infra.files import fsync_path

log = logging.getLogger(__name__)

# A used sequence number wherever it appears, also in a line that is no longer JSON (torn, or glued to the
# next): the floor of the next number must count every number ever handed out.
_SEQ = re.compile(rb'"seq":\s*(\d{1,18})')


def _cut_torn_tail(path: Path) -> int:
    """Cut a last line that has no newline (an append that died); the bytes cut."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # Back to the last newline, in blocks: ledgers are small, but a tail may be long.
        end, keep = size, 0
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            at = f.read(end - start).rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    log.warning("%s: cut a torn last line (%d bytes) left by an append that died", path, size - keep)
    return size - keep


def append(path: Path, record: dict) -> None:
    """Append one record as a line, durably (the file and its directory fsynced). Call under the store's lock."""
    path = Path(path)
    line = (json.dumps(record) + "\n").encode()
    created = not path.exists()
    if not created:
        _cut_torn_tail(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError:
            # Disk full half-way: take the part back now if we can (else the next append cuts it).
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)
    if created:
        fsync_path(path.parent)


def read(path: Path) -> list[dict]:
    """Every record that reads as a JSON object, in order; what does not is logged and skipped."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    out, bad = [], 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        r = _parse(line)
        if r is None:
            # An older release appended after a torn tail, gluing its whole record to the torn one: keep
            # the whole record (a pin or a rollback retention must honour), drop the torn part.
            starts = [i for i in range(1, len(line)) if line.startswith(b'{"', i)]
            r = next((g for g in map(lambda i: _parse(line[i:]), starts) if g is not None), None)
            bad += 1
        if r is not None:
            out.append(r)
    if bad:
        log.warning("%s: %d unreadable line(s) skipped (a torn append?)", path, bad)
    return out


def _parse(line: bytes) -> dict | None:
    try:
        r = json.loads(line)
    except ValueError:
        return None
    return r if isinstance(r, dict) else None


def max_seq(path: Path) -> int:
    """The highest sequence number the ledger names, readable lines or not (0: none)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return 0
    return max((int(m) for m in _SEQ.findall(data)), default=0)
