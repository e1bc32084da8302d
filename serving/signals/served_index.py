"""Which completion a client's own telemetry is about, when the client never saw our completion id.

Continue's development data (serving.signals.devdata) says what was shown and whether it was accepted by its text:
the exact prompt it sent and the completion it displayed (trimmed, sometimes cut at a line). Each user
completion served here is remembered by digests only, never its text:

    (tenant, prompt[, suffix])            -> completions of that prompt
    (tenant, text up to a line boundary)  -> completions whose answer starts with that text

An event joins the completion whose prompt digest and shown-text digest both match, else the one whose shown
text alone matches (only when exactly one does: two candidates are ambiguous and join nothing). Bounded (least
recently used out) and per gateway process, like the sessions: an event that reaches another gateway, or comes
after its completion fell out, is counted unmatched.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

MAX_PREFIX_LINES = 8  # a completion is also found by its first lines (a client that kept only some of them)


def _h(*parts: str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.digest()


def shown_digests(tenant: str, text: str) -> set[bytes]:
    """Digests of a completion's text as a client may show it: whole, or cut after one of its first lines
    (trailing whitespace never counts)."""
    lines = text.rstrip().split("\n")
    cuts = {"\n".join(lines[:k]).rstrip() for k in range(1, min(len(lines), MAX_PREFIX_LINES) + 1)}
    return {_h(tenant, "shown", c) for c in cuts | {text.rstrip()} if c.strip()}


class ServedIndex:
    def __init__(self, capacity: int = 200_000):
        self.capacity = capacity
        self._by: OrderedDict[bytes, list[tuple[str, int]]] = OrderedDict()

    def _put(self, key: bytes, ref: tuple[str, int]) -> None:
        refs = self._by.get(key)
        if refs is None:
            refs = self._by[key] = []
        elif ref in refs:
            return
        refs.append(ref)
        del refs[:-8]  # a prompt asked many times: its newest completions
        self._by.move_to_end(key)
        while len(self._by) > self.capacity:
            self._by.popitem(last=False)

    def record(self, tenant: str, prompt: str, suffix: str | None, text: str, cid: str, choice: int) -> None:
        ref = (cid, choice)
        self._put(_h(tenant, "prompt", prompt, suffix or ""), ref)
        for d in shown_digests(tenant, text):
            self._put(d, ref)

    def find(
        self, tenant: str, shown: str, prompt: str | None = None, suffix: str | None = None
    ) -> tuple[str, int] | None:
        """The completion a client showed as `shown` (after `prompt`, if it says), or None."""
        if not shown.strip():
            return None
        by_text = self._by.get(_h(tenant, "shown", shown.rstrip()), [])
        if prompt is not None:
            for key in (_h(tenant, "prompt", prompt, suffix or ""), _h(tenant, "prompt", prompt, "")):
                both = [r for r in self._by.get(key, []) if r in by_text]
                if both:
                    return both[-1]
        return by_text[0] if len(by_text) == 1 else None
