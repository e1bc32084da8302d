"""The on-disk event spool: numbered segment files of CRC-framed msgpack records, and a delivery cursor.

Record: <u32 length><u32 crc32(payload)><payload = msgpack [topic, key, value] or [topic, key, value, meta]>.
`meta` (a dict: tenant, ts, texts to scan for secrets) stays on this machine: the shipper reads it and never
sends it. Positions are (segment, byte offset). The writer appends and fsyncs; the shipper reads from the
cursor, and moves it (saved to cursor.json) only past records the broker acknowledged. Segments wholly behind
the cursor are deleted. A record torn by a crash fails its CRC and is cut off when the spool is opened again.

A forgotten tenant's records are redacted in place (`redact`, by the shipper, the one reader), and so are the
records the shipper delivered withheld (`redact_at`, once the broker acknowledged them): each is overwritten by a
record of the same framed length whose value is None (no content; `read` skips it), so no offset moves. A crash
in the middle of that overwrite leaves a record whose length is whole (old and new record have the same one) and
whose CRC fails: it is skipped as damaged (never sent), the records after it are read as before, and the next
redaction that covers it overwrites it whole (what was left of the old bytes goes too).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from pathlib import Path
from typing import Callable

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
        good = off = 0
        while off + HEADER.size <= len(data):
            n, crc = HEADER.unpack_from(data, off)
            end = off + HEADER.size + n
            if n == 0 or end > len(data):
                break
            if zlib.crc32(data[off + HEADER.size : end]) == crc:
                good = end
            # else damaged: a torn redaction if valid records follow (kept, skipped when read), else the torn tail
            off = end
        if good != len(data):
            torn = len(data[good:].rstrip(b"\0"))  # not the zeros allocated ahead (serving.event_log.spool_writer)
            if torn:
                log.warning("spool %s: cutting a torn tail of %d bytes", self.path(last), torn)
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
    def frame(topic: str, key: str, value: bytes | None, meta: dict | None = None) -> bytes:
        record = (topic, key, value) if meta is None else (topic, key, value, meta)
        payload = msgpack.packb(record, use_bin_type=True)
        return HEADER.pack(len(payload), zlib.crc32(payload)) + payload

    def read(
        self, start: Position, head: Position, limit: int
    ) -> tuple[list[tuple[str, str, bytes, dict | None]], Position, int]:
        """Up to `limit` records (topic, key, value, meta) in [start, head): (records, position after them,
        their framed bytes, the redacted and damaged ones passed over included). meta is None for a record
        written without it (3 elements, as before meta existed)."""
        found, end, nbytes, _ = self.read_at(start, head, limit)
        return [record for _, record in found], end, nbytes

    def read_at(
        self, start: Position, head: Position, limit: int
    ) -> tuple[list[tuple[Position, tuple[str, str, bytes, dict | None]]], Position, int, list[Position]]:
        """`read`, each record with its position: ([(position, record)], position after them, framed bytes,
        the positions of the damaged records passed over)."""
        seg, off = start
        records: list = []
        damaged: list = []
        nbytes = 0
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
                        if n == 0 and end is None:  # no record is empty: zeros allocated ahead end a sealed segment
                            break
                        payload = f.read(n)
                        if len(payload) < n:
                            break
                        at = (seg, off)
                        off += HEADER.size + n
                        nbytes += HEADER.size + n
                        record = _decode(payload) if zlib.crc32(payload) == crc else None
                        if record is None:
                            log.warning("spool %s: a damaged record of %d bytes before offset %d skipped", path, n, off)
                            damaged.append(at)
                        elif record[2] is not None:  # None: redacted
                            records.append((at, record))
            if len(records) < limit and seg < head[0]:
                seg, off = seg + 1, 0  # this segment is exhausted; go on with the next
            else:
                break
        return records, (seg, off), nbytes, damaged

    def redact(self, match: Callable[[dict], bool], upto: Position, start: Position | None = None) -> int:
        """Overwrite in place every record in [start, upto) (start: the first segment) whose meta `match`es by
        a record of the same framed length without content; fsynced. Returns how many matched. A damaged record in that
        range (its CRC fails) is overwritten too: by construction its length is whole (the writer's torn tail is
        cut off when the spool is opened; a redaction keeps the length), so it is a redaction a crash cut short,
        still holding part of the old bytes. Only the reader may call this (the writer only writes at or after
        the head, never before `upto`)."""
        first = start or (0, 0)
        count = 0
        for seg in self.segments():
            if seg < first[0] or seg > upto[0]:
                continue
            path = self.path(seg)
            try:
                f = open(path, "r+b")
            except FileNotFoundError:  # freed behind the cursor meanwhile
                continue
            with f:
                data = f.read() if seg < upto[0] else f.read(upto[1])
                off, changed, torn = (first[1] if seg == first[0] else 0), 0, 0
                while off + HEADER.size <= len(data):
                    n, crc = HEADER.unpack_from(data, off)
                    body = off + HEADER.size
                    if n == 0 or body + n > len(data):  # n == 0: zeros allocated ahead, no record
                        break
                    payload = data[body : body + n]
                    record = _decode(payload) if zlib.crc32(payload) == crc else None
                    if record is None:  # torn by a crash while it was overwritten: what is left of it goes too
                        f.seek(off)
                        f.write(_blank(n))
                        torn += 1
                    elif record[2] is not None and record[3] is not None and match(record[3]):
                        f.seek(off)
                        f.write(_redacted(record[0], record[1], n))
                        changed += 1
                    off = body + n
                if changed or torn:
                    f.flush()
                    os.fsync(f.fileno())
                count += changed
        return count

    def redact_at(self, positions: list[Position]) -> int:
        """Overwrite in place the records at these positions (each the start of a record, as `read_at` gave it) by
        records of the same framed length without content, damaged ones included; fsynced. Returns how many were
        overwritten (one already redacted is left as it is). Only the reader may call this, and only behind the
        head."""
        count = 0
        by_seg: dict[int, list[int]] = {}
        for seg, off in positions:
            by_seg.setdefault(seg, []).append(off)
        for seg, offs in sorted(by_seg.items()):
            try:
                f = open(self.path(seg), "r+b")
            except FileNotFoundError:  # freed behind the cursor meanwhile
                continue
            with f:
                changed = 0
                for off in sorted(set(offs)):
                    f.seek(off)
                    hdr = f.read(HEADER.size)
                    if len(hdr) < HEADER.size:
                        continue
                    n, crc = HEADER.unpack(hdr)
                    payload = f.read(n)
                    if len(payload) < n:
                        continue
                    record = _decode(payload) if zlib.crc32(payload) == crc else None
                    if record is not None and record[2] is None:
                        continue  # redacted already
                    f.seek(off)
                    f.write(_blank(n) if record is None else _redacted(record[0], record[1], n))
                    changed += 1
                if changed:
                    f.flush()
                    os.fsync(f.fileno())
                count += changed
        return count


def _decode(payload: bytes) -> tuple | None:
    try:
        r = msgpack.unpackb(payload, raw=False)
    except Exception:  # noqa: BLE001 - a record that cannot be decoded is a damaged one
        return None
    if not isinstance(r, list) or len(r) not in (3, 4):
        return None
    meta = r[3] if len(r) == 4 and isinstance(r[3], dict) else None
    return r[0], r[1], r[2], meta


def _blank(n: int) -> bytes:
    """A framed record of HEADER.size + n bytes without content, for a damaged one (its topic and key unknown)."""
    try:
        return _redacted("", "", n)
    except ValueError:  # n < 4: no record is that short; zeros, still damaged (skipped when read)
        return HEADER.pack(n, 0) + bytes(n)


def _redacted(topic: str, key: str, n: int) -> bytes:
    """A framed record of exactly HEADER.size + n bytes (n >= 4): [topic, key, None, {"redacted": True, "pad":
    zeros}]; topic, key and the flag left out too when the record is too short to hold them, and below 11 bytes
    ["", spaces, None] (a record without meta, value None: redacted all the same)."""
    for t, k, flag in ((topic, key, True), (topic, "", True), ("", "", True), ("", "", False)):
        for extra in ({}, {"f": None}, {"f": None, "g": None}):  # steps over msgpack's bin8/bin16/bin32 seams
            meta = {"redacted": True, **extra} if flag else dict(extra)
            base = len(msgpack.packb((t, k, None, {**meta, "pad": b""}), use_bin_type=True))
            for pad in range(max(0, n - base - 3), n - base + 1):
                payload = msgpack.packb((t, k, None, {**meta, "pad": bytes(pad)}), use_bin_type=True)
                if len(payload) == n:
                    return HEADER.pack(n, zlib.crc32(payload)) + payload
    if n < 36:  # too short for a meta map
        for m in range(32):  # fixstr: one byte of header per string up to 31 characters
            payload = msgpack.packb(("", " " * m, None), use_bin_type=True)
            if len(payload) == n:
                return HEADER.pack(n, zlib.crc32(payload)) + payload
    raise ValueError(f"no redacted record of {n} bytes")
