"""Secrets in event texts, found before an event leaves the gateway (the shipper calls this: serving.event_log.shipper).

Library: detect-secrets (Yelp, Apache-2.0, `pip install detect-secrets`). It is the detector that many
repositories run as a pre-commit hook, so its plugins (AWS, GitHub, GitLab, Slack, Stripe, OpenAI, npm, PyPI,
Twilio, SendGrid, Azure, IBM, ... keys; private keys; JWTs; credentials in URLs; `password = "..."`-style
keywords; high-entropy base64 and hex strings) and its false-positive filters (UUIDs, sequences, templates,
id-like names, indirect references) are tuned on source code, which is what prompts and completions are. It is
pure Python in-process (no subprocess per event, no network: its optional verification against the providers'
APIs is never enabled). The Go scanners (gitleaks, trufflehog) have more rules but run as a binary over files.

Used line by line, as the library's own file scanner does (detect_secrets.core.scan), with its plugin classes
and filter functions instantiated once here rather than through its process-wide settings. Deliberate
differences, each for a reason of this use:
- Its line filter `is_indirect_reference` (`secret = get_secret()`) skips the whole line in the library, so
  `boto3.client("s3", aws_access_key_id="AKIA...")` or `connect("postgres://u:pw@host")` pass clean; here it
  only filters what the keyword plugin found, the case it is written for.
- `IPPublicDetector` is off: an IP address in code is not a credential, and withholding every event that
  mentions 8.8.8.8 would throw away training data for nothing.
- The allowlist pragma (`# pragma: allowlist secret`) is not honoured: it is a note in the user's code for
  their own scanner, not a promise that the line is safe to log and train on.
- File-name filters are off (there is no file); lines are scanned as a file of unknown type, where the keyword
  plugin wants the value quoted (`password = "hunter2"`): unquoted `password = other_password` is code, and
  flagging it would withhold most code that handles passwords.
- One filter of ours, `is_placeholder`: values that are only a placeholder (`AKIAXXXXXXXXXXXXXXXX`,
  `your-api-key-here`, `<token>`-style already being the library's): a known prefix followed by one character
  repeated, or an "insert yours here" phrase. The library flags these; they are documentation, not secrets.

Two passes (`prefilter`, on by default), so that a line no plugin could flag costs nothing in Python: the first
(serving.event_log.secret_prefilter) runs every plugin's own regexes at once, widened to what Hyperscan compiles
(serving.event_log.secret_patterns), over all of an event's texts, and names the lines some plugin could flag,
each with the plugins that could; only those lines, through only those plugins, go through the detector as
described here (its filters, our differences, the windows, the budget). The patterns match wherever the regexes
do, so the findings are those of scanning every line through every plugin (`prefilter=False`, kept to compare):
tests/unit/serving/event_log/test_secret_prefilter.py checks it on a labelled corpus (tests.secret_corpus) and on
random lines. In this repository's code about one line in 135 goes to the second pass (quoted strings long
enough to be random, mostly), so a 2 KB slice of code takes ~8 us at the median where every line through every
plugin takes ~2 ms; IDE-shaped events of ~2.5 KB in three texts, none of their lines seen before, ~45,000 a
second on one core against ~420 (benchmarks.gateway `--scrub-only`: `scrub_distinct_events_per_s`, both paths
side by side). What is left is about half the library's entropy computation on the lines sent on, a fifth the
first pass (joining, encoding and scanning the texts, mapping matches to lines), the rest the calls around them.

Bounded work, since a prompt is whatever a client sent: the keyword plugin's regexes take quadratic time on a
line of repeated keywords (a 4 KB line of `pwd` costs ~4 s, 1000 characters 0.23 s, 200 characters 8 ms), so a
line longer than `max_line_chars` is scanned in windows of that size overlapping by half (a secret up to half a
window long is wholly inside one), and the keyword plugin within those in windows of `keyword_window_chars`
(200: a `password = "..."` up to 100 characters lies wholly inside one; the other plugins, linear, see the whole
window, and the entropy plugins find a long random value on their own). An event whose scan uses more CPU than
its budget (`budget_s` + `budget_s_per_kb` per KiB of text, checked before each line and each keyword window)
raises ScanLimit: the shipper withholds it, failing closed. The budget is small, since the shipper is one thread
for every tenant. Measured (thread CPU time, nothing cached, over slices of this repository's code), every line
through every plugin (what a text whose every line the first pass sends on costs: the budget is sized for it):
2 KB takes 2.3 ms at the median and 4.0 ms at most, 8 KB 7.6 / 14 ms, 32 KB 31 / 36 ms, about 1 ms per KiB; with
the first pass 8 us / 0.8 ms (2 KB), 25 us / 0.6 ms (8 KB), 0.18 / 1.0 ms (32 KB). The budget (20 ms + 2 ms per
KiB: 24 ms for 2 KB, 84 ms for 32 KB) is 6x (2 KB) to 2.3x (32 KB) the slowest, and a prompt built to be slow
costs the shipper its budget and one keyword window at most (the shipper also stops scanning
while its backlog is large: serving.event_log.shipper). Lines found clean are remembered (`cache_lines`, a bounded
FIFO of the lines themselves, never of a line with a finding; with the first pass only lines it sent on): IDE
prompts repeat most of the file around the cursor from one request to the next, so a line seen clean before
costs a lookup.
`clear_cache` forgets them (a tenant forgotten: none of its code stays in the shipper's memory).
"""

from __future__ import annotations

import inspect
import re
import time
from dataclasses import dataclass, field
from typing import Any

FILENAME = "event"  # no extension: a file of unknown type to the library (keyword values must be quoted)


class ScanLimit(Exception):
    """The texts took more CPU than the budget: treat the event as holding a secret (fail closed)."""


@dataclass
class ScrubConfig:
    enabled: bool = True
    prefilter: bool = True  # a Hyperscan first pass picks the lines (False: every line through every plugin)
    base64_limit: float = 4.5  # the library's default Shannon entropy limits
    hex_limit: float = 3.0
    disabled_plugins: tuple[str, ...] = ("IPPublicDetector",)
    max_line_chars: int = 1000  # longer lines are scanned in windows of this size, overlapping by half
    keyword_window_chars: int = 200  # the same for the keyword plugin alone (quadratic: ~8 ms at worst per window)
    budget_s: float = 0.02  # CPU seconds one event's texts may take, plus ...
    budget_s_per_kb: float = 0.002  # ... this per KiB (code scans at ~1 ms per KiB: measured, see above)
    cache_lines: int = 65536  # clean lines remembered (0: none)
    extra_filters: list = field(default_factory=list)  # callables(secret) -> bool (True: not a secret)


# A placeholder: a known key prefix (or none) and one character repeated, or an "insert yours here" phrase.
_REPEATED = re.compile(r"^(?:[A-Za-z]{2,6}[_-]?|[A-Za-z]+_(?:live|test)_|[a-z]{2,4}-|xox[abprs]-)?([Xx*.0#])\1{7,}$")
_PHRASE = re.compile(
    r"^(?:your|insert|enter|replace|paste|put)[-_ .](?:[a-z0-9]+[-_ .]){0,4}(?:here|key|token|secret|password|pwd|id)$",
    re.IGNORECASE,
)


def _has_quote(line: str) -> bool:
    return "'" in line or '"' in line or "`" in line


def is_placeholder(secret: str) -> bool:
    """`AKIAXXXXXXXXXXXXXXXX`, `sk_live_xxxxxxxxxxxxxxxx`, `**********`, `your-api-key-here`, `YOUR_TOKEN`."""
    return bool(_REPEATED.match(secret) or _PHRASE.match(secret))


class Scrubber:
    def __init__(self, cfg: ScrubConfig | None = None):
        self.cfg = cfg = cfg or ScrubConfig()
        if not cfg.enabled:
            return
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.filters import heuristic
        from detect_secrets.plugins.keyword import DENYLIST, KeywordDetector

        limits = {"Base64HighEntropyString": cfg.base64_limit, "HexHighEntropyString": cfg.hex_limit}
        # Any: detect_secrets types its plugin classes with a TypeVar bound to nothing (Never to a checker)
        classes: list[Any] = sorted(get_mapping_from_secret_type_to_class().values(), key=lambda c: c.__name__)
        self._plugins = [
            cls(limit=limits[cls.__name__]) if cls.__name__ in limits else cls()
            for cls in classes
            if cls.__name__ not in cfg.disabled_plugins
        ]
        # The library's default filters on a finding (detect_secrets.settings.Settings.clear), with the
        # arguments each one takes, resolved once (the library injects them by name on every call).
        secret_filters = [
            heuristic.is_sequential_string,
            heuristic.is_potential_uuid,
            heuristic.is_likely_id_string,
            heuristic.is_templated_secret,
            heuristic.is_prefixed_with_dollar_sign,
            heuristic.is_not_alphanumeric_string,
            is_placeholder,
            *cfg.extra_filters,
        ]
        self._filters = [(f, tuple(inspect.signature(f).parameters)) for f in secret_filters]
        self._keyword_line_filter = heuristic.is_indirect_reference
        self._keyword = KeywordDetector
        # Every one of the keyword plugin's regexes (for a file of unknown type) needs a quote and one of its
        # DENYLIST words: a line with neither is skipped by this plugin without running its five regexes.
        self._keyword_hint = re.compile("|".join(DENYLIST), re.IGNORECASE)
        self._clean: dict[str, None] = {}
        self.lines_scanned = self.cache_hits = 0
        self._prefilter = None
        if cfg.prefilter:
            from serving.event_log.secret_prefilter import Prefilter

            self._prefilter = Prefilter(self._plugins, FILENAME)

    @property
    def plugin_names(self) -> list[str]:
        return [type(p).__name__ for p in self._plugins] if self.cfg.enabled else []

    def clear_cache(self) -> None:
        """Forget the lines remembered clean (their text is users' code)."""
        if self.cfg.enabled:
            self._clean.clear()

    def find(self, texts: list[str]) -> list[str]:
        """The secret types found in any of the texts, sorted ([]: clean). Raises ScanLimit past the budget."""
        if not self.cfg.enabled:
            return []
        cfg = self.cfg
        size = sum(len(t) for t in texts if t)
        deadline = time.thread_time() + cfg.budget_s + cfg.budget_s_per_kb * size / 1024
        found: set[str] = set()
        if self._prefilter is not None:
            for line, plugins in self._prefilter.candidates(texts):
                for part in _windows(line, cfg.max_line_chars):
                    self._check(part, found, deadline, plugins)
            return sorted(found)
        for text in texts:
            if not text:
                continue
            for line in text.splitlines():
                line = line.rstrip()
                if not line:
                    continue
                for part in _windows(line, cfg.max_line_chars):
                    self._check(part, found, deadline)
        return sorted(found)

    def _check(self, line: str, found: set[str], deadline: float, plugins: tuple | None = None) -> None:
        if line in self._clean:
            self.cache_hits += 1
            return
        if time.thread_time() > deadline:
            raise ScanLimit(f"secret scan over its CPU budget after {self.lines_scanned} lines")
        self.lines_scanned += 1
        types = self._scan_line(line, deadline, self._plugins if plugins is None else plugins)
        if types:
            found |= types
        elif self.cfg.cache_lines:
            if len(self._clean) >= self.cfg.cache_lines:
                del self._clean[next(iter(self._clean))]
            self._clean[line] = None

    def _scan_line(self, line: str, deadline: float, plugins) -> set[str]:
        types: set[str] = set()
        for plugin in plugins:
            if not isinstance(plugin, self._keyword):
                self._analyze(plugin, line, types)
                continue
            # Quadratic on repeated keywords: in windows of its own, the budget checked before each.
            for part in _windows(line, self.cfg.keyword_window_chars):
                if plugin.secret_type in types:
                    break
                if not (_has_quote(part) and self._keyword_hint.search(part)):
                    continue
                if time.thread_time() > deadline:
                    raise ScanLimit("secret scan over its CPU budget in a line of keywords")
                self._analyze(plugin, part, types)
        return types

    def _analyze(self, plugin, line: str, types: set[str]) -> None:
        indirect = None
        for secret in plugin.analyze_line(filename=FILENAME, line=line, line_number=0, context=None):
            value = secret.secret_value
            if not value or plugin.secret_type in types:
                continue
            if isinstance(plugin, self._keyword):
                if indirect is None:
                    indirect = self._keyword_line_filter(line)
                if indirect:
                    continue
            args = {"secret": value, "line": line, "plugin": plugin, "filename": FILENAME}
            if any(f(**{p: args[p] for p in params}) for f, params in self._filters):
                continue
            types.add(plugin.secret_type)


def _windows(line: str, size: int) -> list[str]:
    """The line itself if it is at most `size` long, else windows of `size` overlapping by half (any part of at
    most half a window lies wholly inside one)."""
    if len(line) <= size:
        return [line]
    step = max(1, size // 2)
    return [line[start : start + size] for start in range(0, len(line) - step, step)]
