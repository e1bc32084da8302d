"""The first pass of the secret scan (serving.event_log.secret_scrub): the lines of an event's texts that some
plugin could flag, each with the plugins that could, found by one Hyperscan scan of all the texts at once.

Library: Hyperscan (Intel's multi-pattern regex engine, BSD-3-Clause) through its Python binding (`hyperscan` on
PyPI, a manylinux wheel with the library inside; pinned). Chosen over a Rust regex-set binding or RE2's `Set`
because it runs every pattern in one pass over the bytes and reports where each match ends (a set only says
which patterns matched somewhere), which is what is needed to send one line to the second pass, not the whole
text (a set asked line by line would cost a Python call per line, ~50 for a 2 KB prompt); and because it
compiles the 52 patterns, several with bounded repeats of 40-70 characters, into one automaton that scans code
at gigabytes per second: the Python calls around it are the cost (~5 us a 2.5 KB event).

The patterns are the plugins' own regexes, widened to what Hyperscan takes (serving.event_log.secret_patterns):
every line a plugin could flag holds a match of one of its patterns, and Hyperscan reports every end of every
match, so the candidates are a superset of the lines the detector would flag, and each line goes to a superset
of the plugins that could flag it. A line that is not ASCII goes to every plugin (the patterns are exact over
ASCII only); so does every line, for a plugin without derived patterns (none, with the pinned detect-secrets).
One database per prefilter (its scratch space is not to be shared between threads: the shipper is one thread);
the compiled form is cached per process, so a second scanner costs a copy, not a compile (~0.3 s).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from functools import lru_cache
from itertools import accumulate
from typing import Any

import hyperscan

from serving.event_log.secret_patterns import Underivable, hyperscan_pattern, plugin_regexes


class Prefilter:
    def __init__(self, plugins: Sequence[Any], filename: str):
        self.plugins = tuple(plugins)
        patterns: list[str] = []
        owners: list[int] = []  # the plugin (its index) of each pattern
        always = 0  # plugins (a bit each) that see every line: their regexes were not derived
        for i, plugin in enumerate(self.plugins):
            regexes = plugin_regexes(plugin, filename)
            try:
                derived = None if regexes is None else [hyperscan_pattern(p, f) for p, f in regexes]
            except Underivable:
                derived = None
            if not derived:
                always |= 1 << i
                continue
            patterns += derived
            owners += [i] * len(derived)
        blob, refused = _compiled(tuple(patterns))
        for index in refused:  # Hyperscan took the pattern for no match at all (an empty one): every line
            always |= 1 << owners[index]
        self._bit = [1 << owner for owner in owners]
        self._always = always
        self._every = (1 << len(self.plugins)) - 1
        self._db = None
        if blob:
            self._db = hyperscan.loadb(blob, hyperscan.HS_MODE_BLOCK)
            self._db.scratch = hyperscan.Scratch(self._db)  # a loaded database comes without one
        self._by_mask: dict[int, tuple[Any, ...]] = {}

    @property
    def unfiltered(self) -> list[str]:
        """The plugins that see every line (their regexes could not be derived)."""
        return [type(p).__name__ for i, p in enumerate(self.plugins) if self._always >> i & 1]

    def candidates(self, texts: Sequence[str]) -> list[tuple[str, tuple[Any, ...]]]:
        """(line, the plugins that could flag it) for each line of the texts that some plugin could flag, the
        line right-stripped as the scanner sees it."""
        joined = "\n".join(t for t in texts if t)  # texts are scanned by line: joined at a line break, the same
        out: list[tuple[str, int]] = []
        if not joined.isascii():
            ascii_lines = []
            for line in joined.splitlines():
                if line.isascii():
                    ascii_lines.append(line)
                elif line := line.rstrip():
                    out.append((line, self._every))
            joined = "\n".join(ascii_lines)
        self._ascii_candidates(joined, out)
        return [(line, self._plugins(mask)) for line, mask in out]

    def _ascii_candidates(self, text: str, out: list[tuple[str, int]]) -> None:
        hits: list[tuple[int, int]] = []
        if self._db is not None and text:
            self._db.scan(text.encode("ascii"), match_event_handler=_on_match, context=hits)
        if not hits and not self._always:
            return
        lines = text.splitlines(keepends=True)
        masks = dict.fromkeys(range(len(lines)), self._always) if self._always else {}
        ends = list(accumulate(map(len, lines)))
        for pattern, end in hits:  # the match's last character is on the line it ends on
            at = bisect_right(ends, end - 1)
            masks[at] = masks.get(at, 0) | self._bit[pattern]
        for at, mask in masks.items():
            if line := lines[at].rstrip():
                out.append((line, mask))

    def _plugins(self, mask: int) -> tuple[Any, ...]:
        plugins = self._by_mask.get(mask)
        if plugins is None:
            plugins = self._by_mask[mask] = tuple(p for i, p in enumerate(self.plugins) if mask >> i & 1)
        return plugins


def _on_match(pattern: int, start: int, end: int, flags: int, hits: Any) -> None:
    hits.append((pattern, end))


@lru_cache(maxsize=8)
def _compiled(patterns: tuple[str, ...]) -> tuple[bytes, list[int]]:
    """The serialized database of the patterns Hyperscan takes, and the indexes of those it refuses."""
    refused: list[int] = []
    if not patterns:
        return b"", refused
    try:
        return _compile(patterns, range(len(patterns))), refused
    except hyperscan.error:
        pass
    for i, p in enumerate(patterns):
        try:
            _compile((p,), [0])
        except hyperscan.error:
            refused.append(i)
    kept = [i for i in range(len(patterns)) if i not in refused]
    return (_compile(tuple(patterns[i] for i in kept), kept) if kept else b""), refused


def _compile(patterns: Sequence[str], ids: Sequence[int]) -> bytes:
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=[p.encode("ascii") for p in patterns], ids=list(ids), flags=[0] * len(patterns))
    return hyperscan.dumpb(db)
