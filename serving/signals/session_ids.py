"""What a session id becomes in the events: a client-named one is free text, scanned for secrets like the prompts
(serving.event_log.secret_scrub), and one that holds a secret never reaches the spool or Kafka.

A client names its sessions (X-Session-Id, metadata.session_id, /v1/feedback's session_id), and that name goes
into every completion event of the session and into session feedback, where it is also the Kafka key. The
shipper's scan withholds an event's content but keeps its ids and key, so the id is scanned here, before the
event is written: an id with a finding (or whose scan fails or runs over its budget: failing closed) is logged
as `withheld-<hmac>`, an HMAC of (tenant, id) under the gateway's id secret: the same session still links across
its turns, its feedback and the gateways of a fleet (which share that secret), and nothing of the id can be
read or guessed from it. The client keeps seeing its own id. Ids this gateway derived (a completion id) are ours,
never scanned.

Cost on the request path: one id of at most 128 characters (serving.signals.sessions.MAX_SESSION_ID), scanned once per
session (the verdict is remembered, bounded, by digest): ~0.1 ms, and at most the scanner's budget for a
hostile one.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections import OrderedDict

from prometheus_client import CollectorRegistry, Counter

from serving.event_log.secret_scrub import ScanLimit, Scrubber

log = logging.getLogger(__name__)

PREFIX = "withheld-"


class SessionIds:
    def __init__(
        self, secret: bytes, scan: bool = True, registry: CollectorRegistry | None = None, capacity: int = 100_000
    ):
        self.secret, self.capacity = secret, capacity
        self.scrubber: Scrubber | None = None
        self.scan = scan
        if scan:
            try:
                self.scrubber = Scrubber()
            except Exception as e:  # noqa: BLE001 - no scanner: every client-named id is withheld (fail closed)
                log.error("secret scanner unavailable (%s); client-named session ids are logged withheld", e)
        self._verdicts: OrderedDict[bytes, bool] = OrderedDict()  # digest of (tenant, id) -> withheld
        self.withheld = Counter(
            "flywheel_gateway_session_ids_withheld",
            "Client-named session ids logged as an HMAC because they hold a secret (or could not be scanned)",
            registry=registry,
        )

    def alias(self, tenant: str, session_id: str) -> str:
        mac = hmac.new(self.secret, f"session/{tenant}/{session_id}".encode(), hashlib.sha256).hexdigest()
        return PREFIX + mac[:32]

    def logged(self, tenant: str, session_id: str, ours: bool = False) -> str:
        """The id as events carry it. ours: an id this gateway derived (nothing of the client's in it)."""
        if not session_id or ours or not self.scan:
            return session_id
        digest = hashlib.blake2b(f"{tenant}/{session_id}".encode(), digest_size=16).digest()
        withheld = self._verdicts.get(digest)
        if withheld is None:
            withheld = self._holds_secret(session_id)
            self._verdicts[digest] = withheld
            while len(self._verdicts) > self.capacity:
                self._verdicts.popitem(last=False)
        else:
            self._verdicts.move_to_end(digest)
        if not withheld:
            return session_id
        self.withheld.inc()
        return self.alias(tenant, session_id)

    def _holds_secret(self, session_id: str) -> bool:
        if self.scrubber is None:
            return True
        try:
            return bool(self.scrubber.find([session_id]))
        except ScanLimit:
            return True
        except Exception as e:  # noqa: BLE001 - never let an unscanned id out
            log.error("secret scan of a session id failed (%s: %s); it is logged withheld", type(e).__name__, e)
            return True
