"""The detector's own regexes as Hyperscan patterns that match at least wherever they do, over ASCII lines (the
first pass of serving.event_log.secret_scrub: serving.event_log.secret_prefilter compiles these).

Each pattern is derived from a plugin's Python regex, not written by hand: the regex is parsed with Python's own
parser (`re._parser`, what `re.compile` uses) and written out again in the syntax Hyperscan takes, widened where
Hyperscan cannot follow it or where the scanner's windows could differ from the whole line:
- every single-character element (a literal, a class, `.`, `\\w`, `\\s`, ..., with the regex's flags: case
  folding included) becomes the exact set of ASCII characters that Python's `re` matches with it, found by asking
  `re` itself about each of the 128; a set with none becomes `\\xff`, a byte no ASCII text holds;
- anchors (`^`, `$`, `\\b`) and lookarounds are dropped: an assertion only narrows, and the scanner runs the
  regexes on windows of a long line, where `^` or `(?!\\w)` may hold at a window's edge and not in the line;
- a backreference becomes the pattern of the group it refers to (any text the group could match);
- repeats at the end that may match nothing are dropped, and `{m,n}` at the end becomes `{m}`: a match then ends
  earlier in the same match, so on the same line, and Hyperscan, which reports every end of every match, reports
  fewer ends.
What is left matches a superset of the substrings the Python regex matches, so every line the plugin could flag
holds a match (Hyperscan reports all of them). Over non-ASCII text the sets above would not be exact (Python's
`\\w` and case folding are Unicode's: `K`, the Kelvin sign, matches `(?i)k`), so the prefilter never uses these
patterns on a line that is not ASCII (it sends such a line to every plugin).

The plugins whose regexes these are (`plugin_regexes`): each regex plugin's `denylist` (its `analyze_string` the
library's, or JWT's, which only filters its matches), the keyword plugin's regexes for the file type the
scanner uses, and the entropy plugins' quoted-string regex with the length below which no string can exceed the
entropy limit (the Shannon entropy of n characters is at most log2 n). A plugin of another kind, or whose code
differs from what this derivation assumes, gets None: the prefilter then sends it every line.
"""

from __future__ import annotations

import math
import re
import re._constants as _c  # type: ignore[import-not-found]
import re._parser as _p  # type: ignore[import-not-found]
from functools import lru_cache
from typing import Any

_FLAGS = re.IGNORECASE | re.DOTALL | re.ASCII | re.UNICODE  # those that change what one character matches
_CATEGORIES = {
    _c.CATEGORY_DIGIT: r"\d",
    _c.CATEGORY_NOT_DIGIT: r"\D",
    _c.CATEGORY_SPACE: r"\s",
    _c.CATEGORY_NOT_SPACE: r"\S",
    _c.CATEGORY_WORD: r"\w",
    _c.CATEGORY_NOT_WORD: r"\W",
}
_ASSERTIONS = (_c.AT, _c.ASSERT, _c.ASSERT_NOT)
_REPEATS = (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT)


class Underivable(ValueError):
    """The regex uses something this derivation does not translate (the plugin is then run on every line)."""


def hyperscan_pattern(pattern: str, flags: int = 0) -> str:
    """A Hyperscan pattern (over ASCII bytes) that matches every substring the Python regex matches, and
    wherever it ends on a line a match of the regex could end (see the module's docstring)."""
    tree = _p.parse(pattern, flags)
    groups: dict[int, str] = {}
    _emit(list(tree), tree.state.flags, groups)  # every group's pattern, for the backreferences
    return _emit(_trim_tail(list(tree)), tree.state.flags, groups)


def _emit(items: list, flags: int, groups: dict[int, str]) -> str:
    out = []
    for op, av in items:
        one = _one_character(op, av)
        if one is not None:
            out.append(_ascii_class(one, flags))
        elif op in _ASSERTIONS:
            continue
        elif op in _REPEATS:
            lo, hi, sub = av
            bound = f"{lo}" if hi == lo else f"{lo},{'' if hi is _c.MAXREPEAT else hi}"
            out.append(f"(?:{_emit(list(sub), flags, groups)}){{{bound}}}")
        elif op is _c.SUBPATTERN:
            group, add, remove, sub = av
            text = _emit(list(sub), (flags | add) & ~remove, groups)
            if group is not None:
                groups[group] = text
            out.append(f"(?:{text})")
        elif op is _c.ATOMIC_GROUP:
            out.append(f"(?:{_emit(list(av), flags, groups)})")
        elif op is _c.GROUPREF:
            out.append(f"(?:{groups[av]})")
        elif op is _c.BRANCH or op is _c.GROUPREF_EXISTS:
            alternatives = av[1] if op is _c.BRANCH else [av[1], av[2] or []]
            texts = [_emit(list(a), flags, groups) for a in alternatives]
            some = [t for t in texts if t]
            out.append(f"(?:{'|'.join(some)})" + ("?" if len(some) < len(texts) else "") if some else "")
        else:
            raise Underivable(f"regex construct {op} in {items!r:.80}")
    return "".join(out)


def _one_character(op, av) -> str | None:
    """A Python regex for a single-character element (None: not one)."""
    if op is _c.LITERAL:
        return re.escape(chr(av))
    if op is _c.NOT_LITERAL:
        return f"[^{re.escape(chr(av))}]"
    if op is _c.ANY:
        return "."
    if op is _c.CATEGORY:
        return _CATEGORIES[av]
    if op is not _c.IN:
        return None
    parts: list[str] = []
    for o, a in av:
        if o is _c.NEGATE:
            parts.insert(0, "^")
        elif o is _c.LITERAL:
            parts.append(re.escape(chr(a)))
        elif o is _c.RANGE:
            parts.append(f"{re.escape(chr(a[0]))}-{re.escape(chr(a[1]))}")
        elif o is _c.CATEGORY:
            parts.append(_CATEGORIES[a])
        else:
            raise Underivable(f"character class item {o}")
    return f"[{''.join(parts)}]"


@lru_cache(maxsize=4096)
def _ascii_class(one: str, flags: int) -> str:
    """The ASCII characters Python's `re` matches with this one-character regex, as a Hyperscan class."""
    rx = re.compile(one, flags & _FLAGS)
    codes = [c for c in range(128) if rx.fullmatch(chr(c))]
    if not codes:
        return r"\xff"  # matches nothing in ASCII text
    runs: list[list[int]] = []
    for c in codes:
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return "[" + "".join(f"\\x{lo:02x}" + (f"-\\x{hi:02x}" if hi > lo else "") for lo, hi in runs) + "]"


def _trim_tail(items: list) -> list:
    """Without what may match nothing at the end, and a bounded repeat at the end down to its minimum."""
    while items:
        op, av = items[-1]
        if op in _ASSERTIONS or (op in _REPEATS and av[0] == 0):
            items.pop()
            continue
        if op in _REPEATS:
            items[-1] = (_c.MAX_REPEAT, (av[0], av[0], av[2]))
        break
    return items


def min_entropy_length(limit: float) -> int:
    """The fewest characters whose Shannon entropy can exceed `limit` bits (it is at most log2 of the length; a
    hair of slack for the library's floating point)."""
    return max(1, math.ceil(2 ** (limit - 1e-9)))


def plugin_regexes(plugin: Any, filename: str) -> list[tuple[str, int]] | None:
    """(pattern, flags) of the Python regexes whose matches are all that `plugin` can flag on a line of a file
    named `filename` (None: a plugin this does not know; it must see every line)."""
    from detect_secrets.plugins.base import BasePlugin, RegexBasedDetector
    from detect_secrets.plugins.high_entropy_strings import HighEntropyStringsPlugin
    from detect_secrets.plugins.jwt import JwtTokenDetector
    from detect_secrets.plugins.keyword import (
        QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP,
        REGEX_BY_FILETYPE,
        KeywordDetector,
    )
    from detect_secrets.util.filetype import determine_file_type

    cls = type(plugin)
    if cls is KeywordDetector:
        table = REGEX_BY_FILETYPE.get(determine_file_type(filename), QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP)
        return [(rx.pattern, rx.flags) for rx in table]
    if isinstance(plugin, HighEntropyStringsPlugin):
        quoted = r'([\'"])([{}]+)(\1)'.format(re.escape(plugin.charset))  # as the library builds it
        if plugin.regex.pattern != quoted or cls.analyze_line is not HighEntropyStringsPlugin.analyze_line:
            return None
        least = min_entropy_length(plugin.entropy_limit)
        return [(quoted.replace("]+)", f"]{{{least},}})"), 0)]
    if (
        isinstance(plugin, RegexBasedDetector)
        and cls.analyze_string in (RegexBasedDetector.analyze_string, JwtTokenDetector.analyze_string)
        and cls.analyze_line is BasePlugin.analyze_line
    ):
        return [(rx.pattern, rx.flags) for rx in plugin.denylist]
    return None
