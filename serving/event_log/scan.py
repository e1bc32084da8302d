"""What the shipper (serving.event_log.shipper) does to an event's content before it leaves the gateway: the secret
scan of the texts its meta carries (serving.event_log.secret_scrub), the withheld value that replaces an event with a
finding, a failed scan or none at all (failing closed), and the backlog past which it withholds without scanning.
"""

from __future__ import annotations

import logging

import msgpack

from serving.event_log.secret_scrub import ScanLimit, Scrubber
from serving.event_log.spool import Spool

log = logging.getLogger(__name__)


def scan_texts(scan) -> list[str]:
    """The texts of meta["scan"]: a text, or a list of texts and lists of texts (stop strings); None skipped.
    Anything else raises (the event is withheld: failing closed)."""
    if scan is None:
        return []
    if isinstance(scan, str):
        return [scan]
    if isinstance(scan, (list, tuple)):
        return [t for part in scan for t in scan_texts(part)]
    raise TypeError(f"a {type(scan).__name__} among the texts to scan")


class Scrub:
    """The secret scan of a record's texts, and the withheld value it yields; never raises."""

    def __init__(self, enabled: bool):
        self.enabled, self.scrubber, self._logged = enabled, None, set[str]()
        if enabled:
            try:
                self.scrubber = Scrubber()
            except Exception as e:  # noqa: BLE001 - no scanner: every event with texts is withheld (fail closed)
                log.error(
                    "secret scanner unavailable (%s: %s); events with texts to scan go out withheld",
                    type(e).__name__,
                    e,
                )

    def _once(self, what: str, msg: str, *args) -> None:
        if what not in self._logged:
            self._logged.add(what)
            log.error(msg + " (logged once)", *args)

    def clear_cache(self) -> None:
        """Forget the lines the scanner remembers clean (users' code): called when a tenant may have been forgotten."""
        if self.scrubber is not None:
            self.scrubber.clear_cache()

    def apply(self, value: bytes, scan) -> tuple[bytes, bool]:
        """(the value to send, whether it was withheld)."""
        try:
            if self.scrubber is None:
                raise RuntimeError("no secret scanner")
            types = self.scrubber.find(scan_texts(scan))
        except ScanLimit as e:
            types = ["scan_limit"]
            self._once("limit", "an event's texts took too long to scan (%s); withheld", e)
        except Exception as e:  # noqa: BLE001 - never lose the event, never let a secret out
            types = ["scan_error"]
            self._once("error", "secret scan failed (%s: %s); the event is withheld", type(e).__name__, e)
        if not types:
            return value, False
        return self.withhold(value, types), True

    @staticmethod
    def withhold(value: bytes, types: list[str]) -> bytes:
        """The value without content, `types` saying why. A value that is not a completion or a feedback (nothing
        of it can be kept): a stub with those types, flagged not_an_event."""
        from contracts import events as ev

        try:
            out = ev.withhold(value, "secret", types)
        except Exception:  # noqa: BLE001 - not an event we can take apart: send nothing of it
            out = value
        if out is value:
            out = msgpack.packb(
                {"withheld": "secret", "secret_types": sorted(types), "not_an_event": True}, use_bin_type=True
            )
        return out

    def unscanned(self, value: bytes) -> tuple[bytes, bool]:
        """A record without meta (spooled before meta existed, so never scanned): a completion or a feedback is
        withheld ("unscanned"), unless it is already (its tenant's policy: the reason stays); anything else goes as
        it is. (the value to send, whether it was withheld)."""
        from contracts import events as ev

        try:
            d = msgpack.unpackb(value, raw=False)
            if not isinstance(d, dict) or d.get("withheld"):
                return value, False
            out = ev.withhold(value, "secret", ["unscanned"])
        except Exception:  # noqa: BLE001 - not msgpack: not an event, sent as before
            return value, False
        return out, out is not value


class Backlog:
    """The undelivered bytes from a record to the head, and whether they are over the limit past which events are
    withheld unscanned (logged when that starts and ends). Sizes of sealed segments (fixed) are remembered."""

    def __init__(self, spool: Spool, limit: int):
        self.spool, self.limit, self.over = spool, limit, False
        self._sizes: dict[int, int] = {}

    def bytes(self, pos, head) -> int:
        if pos >= head:
            return 0
        total = head[1] - pos[1]
        for seg in range(pos[0], head[0]):  # segments before the head's are sealed
            size = self._sizes.get(seg)
            if size is None:
                try:
                    size = self.spool.path(seg).stat().st_size
                except FileNotFoundError:
                    size = 0
                self._sizes[seg] = size
            total += size
        if len(self._sizes) > 256:
            self._sizes = {k: v for k, v in self._sizes.items() if k >= pos[0]}
        return total

    def too_far(self, pos, head) -> bool:
        n = self.bytes(pos, head)
        over = n > self.limit
        if over != self.over:
            self.over = over
            if over:
                log.warning(
                    "%d bytes undelivered in %s, over %d: events are withheld without a secret scan until the "
                    "backlog is under it",
                    n,
                    self.spool.dir,
                    self.limit,
                )
            else:
                log.info("backlog under %d bytes in %s: scanning events for secrets again", self.limit, self.spool.dir)
        return over
