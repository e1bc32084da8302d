"""Who holds which piece of which version: the store's answer to "where should this agent fetch from?".

Agents ask the store for every piece (manifest, signature, chunk, side file) and say where their own relay
is (`?peer=URL`). The first agent to ask for a piece is served by the store; each later one is sent to an
agent that already has the piece or is still receiving it, as long as that holder has fewer than `fanout`
children for the piece. Holders are taken in the order they arrived, so each piece spreads as a tree of
degree `fanout` (heap order: the store -> A; A -> B, C; B -> D, E; ...) and the store sends it once. Pieces
are spread independently, so different agents are the roots of different pieces' trees.

A holder some agent could not fetch from (down, timed out, 404, bytes that failed their digest) is
dropped from every piece of that version: one bad answer costs one extra transfer from the store, and the
store stops sending anyone there. Everything is in memory and bounded (max_pieces, max_holders): after a
restart, or for a piece evicted, the store just serves directly until holders are known again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from infra.config import option


@dataclass
class TrackerConfig:
    fanout: int = option(
        2,
        flag="relay-fanout",
        help="peers each agent's relay is sent per piece (a tree of this degree); 0: serve everything here",
    )
    max_pieces: int = 100_000  # (version, piece) entries remembered; the oldest are forgotten first
    max_holders: int = 64  # holders remembered per piece; later ones are still served, just not offered

    def __post_init__(self):
        if self.fanout < 0 or self.max_pieces < 1 or self.max_holders < 1:
            raise ValueError("tracker: fanout >= 0, max_pieces >= 1, max_holders >= 1")


class Tracker:
    def __init__(self, cfg: TrackerConfig | None = None):
        self.cfg = cfg or TrackerConfig()
        # (version, piece) -> {holder URL: children sent to it}, holders in arrival order
        self.pieces: OrderedDict[tuple[int, str], dict[str, int]] = OrderedDict()
        self.known: set[int] = set()  # versions asked about since the last retain()
        self.redirects = 0
        self.dropped = 0

    def choose(self, version: int, piece: str, requester: str) -> str | None:
        """The holder `requester` (a relay's base URL) should fetch `piece` from, or None: the store serves
        it. The requester becomes a holder either way."""
        self.known.add(version)
        key = (version, piece)
        holders = self.pieces.get(key)
        if holders is None:
            holders = self.pieces[key] = {}
            while len(self.pieces) > self.cfg.max_pieces:
                self.pieces.popitem(last=False)
        # Asking again means it does not have the piece (a restart, a retry): it goes to the end of the line.
        holders.pop(requester, None)
        chosen = None
        for holder, children in holders.items():
            if children < self.cfg.fanout:
                chosen = holder
                holders[holder] = children + 1
                break
        if len(holders) < self.cfg.max_holders:
            holders[requester] = 0
        if chosen is not None:
            self.redirects += 1
        return chosen

    def record(self, version: int, piece: str, requester: str) -> None:
        """`requester` is being served the piece by the store (a direct fetch): it holds it from now on."""
        self.known.add(version)
        holders = self.pieces.setdefault((version, piece), {})
        while len(self.pieces) > self.cfg.max_pieces:
            self.pieces.popitem(last=False)
        if requester not in holders and len(holders) < self.cfg.max_holders:
            holders[requester] = 0

    def drop(self, version: int, holder: str) -> int:
        """Forget `holder` for every piece of `version` (someone could not fetch from it); how many."""
        n = 0
        for (v, _), holders in self.pieces.items():
            if v == version and holders.pop(holder, None) is not None:
                n += 1
        self.dropped += n
        return n

    def retain(self, versions: set[int]) -> None:
        """Forget versions no longer in the store."""
        for key in [k for k in self.pieces if k[0] not in versions]:
            del self.pieces[key]
        self.known &= set(versions)

    def stats(self) -> dict:
        return {
            "versions": sorted({v for v, _ in self.pieces}),
            "pieces": len(self.pieces),
            "holders": sum(len(h) for h in self.pieces.values()),
            "redirects": self.redirects,
            "holders_dropped": self.dropped,
        }
