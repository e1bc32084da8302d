"""Looking at an event spool's files from the outside, for the spool and shipper tests."""

from __future__ import annotations

import time
from pathlib import Path

from serving.event_log.spool import HEADER, Spool


def wait_for(cond, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def raw_records(spool_dir: Path) -> dict[tuple[int, int], bytes]:
    """(segment, offset) -> the framed bytes of every record on disk."""
    out = {}
    for seg in Spool(spool_dir).segments():
        data = Spool(spool_dir).path(seg).read_bytes()
        off = 0
        while off + HEADER.size <= len(data):
            n, _ = HEADER.unpack_from(data, off)
            if n == 0:  # zeros: allocated ahead of the head (serving.event_log.spool_writer)
                break
            out[(seg, off)] = data[off : off + HEADER.size + n]
            off += HEADER.size + n
    return out


def segment_bytes(spool_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(Path(spool_dir).glob("*.log")))
