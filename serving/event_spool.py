"""The on-disk event spool: numbered segment files of CRC-framed msgpack records, and a delivery cursor.

Record: <u32 length><u32 crc32(payload)><payload = msgpack [topic, key, value]>. Positions are
(segment, byte offset). The writer appends and fsyncs; the shipper reads from the cursor, and moves it
(saved to cursor.json) only past records the broker acknowledged. Segments wholly behind the cursor are
deleted. A record torn by a crash fails its CRC and is cut off when the spool is opened again.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from pathlib import Path

import msgpack

log = logging.getLogger(__name__)

HEADER = struct.Struct("<II")
Position = tuple[int, int]


class Spool:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, seg: int) -> Path:
        return self.dir / f"{seg:012d}.log"

    def segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob("*.log"))

    # ------------------------------------------------------------------ cursor
    def load_cursor(self) -> Position:
        try:
            c = json.loads((self.dir / "cursor.json").read_text())
            return int(c["segment"]), int(c["offset"])
        except (OSError, ValueError, KeyError):
            segs = self.segments()
            return (segs[0] if segs else 1), 0

    def save_cursor(self, pos: Position) -> None:
        tmp = self.dir / "cursor.json.tmp"
        tmp.write_text(json.dumps({"segment": pos[0], "offset": pos[1]}))
        os.replace(tmp, self.dir / "cursor.json")

    def delete_before(self, seg: int) -> None:
        for s in self.segments():
            if s < seg:
                self.path(s).unlink(missing_ok=True)

    # ------------------------------------------------------------------ head
    def recover_head(self, cursor: Position) -> Position:
        """End of the last complete record; a torn tail from a crash is cut off."""
        segs = self.segments()
        if not segs:
            return cursor
        last = segs[-1]
        data = self.path(last).read_bytes()
        good = 0
        while good + HEADER.size <= len(data):
            n, crc = HEADER.unpack_from(data, good)
            end = good + HEADER.size + n
            if end > len(data) or zlib.crc32(data[good + HEADER.size : end]) != crc:
                break
            good = end
        if good != len(data):
            log.warning("spool %s: cutting a torn tail of %d bytes", self.path(last), len(data) - good)
            with open(self.path(last), "r+b") as f:
                f.truncate(good)
        return max(cursor, (last, good))

    def bytes_between(self, a: Position, b: Position) -> int:
        if a >= b:
            return 0
        if a[0] == b[0]:
            return b[1] - a[1]
        total = 0
        for seg in self.segments():
            if a[0] <= seg <= b[0]:
                size = self.path(seg).stat().st_size
                total += (b[1] if seg == b[0] else size) - (a[1] if seg == a[0] else 0)
        return total

    # ------------------------------------------------------------------ records
    @staticmethod
    def frame(topic: str, key: str, value: bytes) -> bytes:
        payload = msgpack.packb((topic, key, value), use_bin_type=True)
        return HEADER.pack(len(payload), zlib.crc32(payload)) + payload

    def read(self, start: Position, head: Position, limit: int) -> tuple[list[tuple[str, str, bytes]], Position, int]:
        """Up to `limit` records in [start, head): (records, position after them, their framed bytes)."""
        seg, off = start
        records, nbytes = [], 0
        while len(records) < limit and (seg, off) < head:
            path = self.path(seg)
            if path.exists():
                with open(path, "rb") as f:
                    f.seek(off)
                    end = head[1] if seg == head[0] else None
                    while len(records) < limit and (end is None or off < end):
                        hdr = f.read(HEADER.size)
                        if len(hdr) < HEADER.size:
                            break
                        n, crc = HEADER.unpack(hdr)
                        payload = f.read(n)
                        if len(payload) < n or zlib.crc32(payload) != crc:
                            break
                        topic, key, value = msgpack.unpackb(payload, raw=False)
                        records.append((topic, key, value))
                        off += HEADER.size + n
                        nbytes += HEADER.size + n
            if len(records) < limit and seg < head[0]:
                seg, off = seg + 1, 0  # this segment is exhausted; go on with the next
            else:
                break
        return records, (seg, off), nbytes
