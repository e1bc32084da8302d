"""The secret scan's first pass (serving.event_log.secret_prefilter, secret_patterns) loses nothing: with it the
scanner finds exactly what it finds scanning every line through every plugin (ScrubConfig(prefilter=False)), on
the labelled corpus (tests.secret_corpus) and on random lines; and the widened patterns match where their regexes
do, Hyperscan's way.
"""

from __future__ import annotations

import json
import string

import hyperscan
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from serving.event_log.secret_patterns import hyperscan_pattern, min_entropy_length
from serving.event_log.secret_prefilter import Prefilter
from serving.event_log.secret_scrub import FILENAME, Scrubber, ScrubConfig
from tests import secret_corpus


@pytest.fixture(scope="module")
def fast():
    return Scrubber(ScrubConfig(cache_lines=0))


@pytest.fixture(scope="module")
def slow():
    return Scrubber(ScrubConfig(cache_lines=0, prefilter=False))


def test_the_first_pass_finds_what_every_line_through_every_plugin_finds_on_the_labelled_corpus():
    fast, slow = Scrubber(ScrubConfig(cache_lines=0)), Scrubber(ScrubConfig(cache_lines=0, prefilter=False))
    cases = secret_corpus.labelled_corpus()
    parts = {p: sum(c.part == p for c in cases) for p in ("upstream", "shapes", "providers", "lockfile", "code")}
    assert parts["upstream"] >= 350 and parts["providers"] >= 400 and parts["code"] >= 10_000, parts
    differ = [(c.part, c.source, c.text[:120]) for c in cases if fast.find([c.text]) != slow.find([c.text])]
    assert not differ, differ[:10]
    # and so the same recall and false positives; both find most secrets, and flag few clean lines
    new, old = secret_corpus.score(fast, cases), secret_corpus.score(slow, cases)
    assert new == old
    assert new["recall"] > 0.8 and new["false_positive_share"] < 0.01, new
    assert fast.lines_scanned < slow.lines_scanned / 10  # most lines never reach the second pass


def test_every_plugin_has_its_patterns(fast):
    """With the pinned detect-secrets every plugin's regexes are derived: none sees every line."""
    prefilter = Prefilter(fast._plugins, FILENAME)
    assert prefilter.unfiltered == []
    assert len(prefilter.plugins) == len(fast.plugin_names) >= 25


def test_the_upstream_corpus_file_holds_nothing_a_scanner_flags():
    """Every line of the file as a line of a file of several types, through every plugin, no filter."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    plugins = [cls() for cls in get_mapping_from_secret_type_to_class().values()]
    flagged = [
        (type(p).__name__, line[:80])
        for line in secret_corpus.UPSTREAM.read_text().splitlines()
        for p in plugins
        for name in ("corpus.jsonl", "corpus.py", "corpus.yaml", "corpus.go")
        if p.analyze_line(filename=name, line=line)
    ]
    assert not flagged, flagged[:5]
    assert all(
        len(piece) <= 6
        for line in secret_corpus.UPSTREAM.read_text().splitlines()
        for piece in json.loads(line)["pieces"]
    )


def _matches(python_regex: str, data: str, flags: int = 0) -> bool:
    db = hyperscan.Database()
    db.compile(expressions=[hyperscan_pattern(python_regex, flags).encode()], ids=[0], flags=[0])
    hits: list[int] = []
    db.scan(data.encode("ascii"), match_event_handler=lambda *a: hits.append(a[2]))
    return bool(hits)


def test_the_patterns_are_widened_where_hyperscan_or_the_windows_differ():
    assert _matches(r"(?<=\W)key(?!\w)", "akeyb")  # lookarounds dropped: a window's edge may satisfy them
    assert _matches(r"^AKC[a-z]{10,}$", "xAKCabcdefghij")  # anchors too
    assert _matches(r"(['\"])x+(\1)", "'xx\"")  # a backreference: anything its group could match
    assert _matches(r"(?i)secret", "SeCrEt") and not _matches(r"secret", "SECRET")
    assert _matches(r"[^\s]{3}", "a\x0bb\x0cc") is False  # \s is Python's: vertical tab and form feed are spaces
    assert not _matches("contraseña", "contrasena")  # a non-ASCII letter never matches ASCII text
    assert _matches(r"(?i)contrase[ñn]a", "CONTRASENA")
    assert hyperscan_pattern(r"AKC[a-z]{10,}").endswith("{10}")  # the end shortened: one report, not one a char
    assert hyperscan_pattern(r"ab\w*") == "[\\x61][\\x62]"
    assert min_entropy_length(4.5) == 23 and min_entropy_length(3.0) == 8 and min_entropy_length(0.0) == 1


def test_a_line_that_is_not_ascii_goes_to_every_plugin(fast, slow):
    kelvin = "api_\u212aey = 'q8Zr3LmT0vXkP2sYwB'"  # Python's (?i)k matches the Kelvin sign: the keyword holds
    assert fast.find([kelvin]) == slow.find([kelvin]) == ["Secret Keyword"]
    mixed = f"# café\n{kelvin}\nx = 1\n"
    assert fast.find([mixed]) == slow.find([mixed]) == ["Secret Keyword"]


# Pieces of code and of secrets' shapes: random lines of them exercise every pattern's edges.
_TOKENS = [
    *("password", "PASSWD", "pwd", "Secret", "api_key", "ApiKey", "private_key", "db_pass", "contraseña"),
    *("aws", "AKIA", "ASIA", "ghp_", "glpat-", "xoxb-", "sk_live_", "SG.", "eyJ", "npm_", "sq0csp-", "AccountKey="),
    *("-----BEGIN RSA PRIVATE KEY-----", "PuTTY-User-Key-File-2", "https://", "://", "@", "T3BlbkFJ", "-us6"),
    *("=", "==", ":=", "=>", ":", "(", ")", "[", "]", ";", ",", ".", "/", "+", "-", "_", "$", "{", "}", "!="),
    *("'", '"', "`", " ", "  ", "\t", "\u212a", "\u017f", "é", "\x0b", "\r", "\x85", "\u2028"),
]
_RUNS = st.sampled_from([string.ascii_letters + string.digits, "0123456789abcdef", string.digits, "xX", "+/=-_"])


@st.composite
def _code_lines(draw) -> str:
    parts = []
    for _ in range(draw(st.integers(0, 24))):
        if draw(st.booleans()):
            parts.append(draw(st.sampled_from(_TOKENS)))
        else:
            parts.append(draw(st.text(draw(_RUNS), min_size=1, max_size=70)))
    return "".join(parts)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_code_lines(), min_size=1, max_size=4), st.sampled_from(["\n", "\r\n", "\n\n"]))
def test_random_lines_get_the_same_findings_either_way(fast, slow, lines, sep):
    text = sep.join(lines)
    assert fast.find([text]) == slow.find([text])
    assert fast.find([text, text[::-1]]) == slow.find([text, text[::-1]])


_KEY_SHAPES = {  # (prefix, alphabet, length): keys a plugin finds wherever they stand on a line
    "aws": ("AK" + "IA", string.ascii_uppercase + "234567", 16),
    "github": ("gh" + "p_", string.ascii_letters + string.digits, 36),
    "stripe": ("sk" + "_live_", string.ascii_letters + string.digits, 24),
    "gitlab": ("glp" + "at-", string.ascii_letters + string.digits, 20),
    "slack": ("xo" + "xb-1234567890-", string.ascii_lowercase + string.digits, 24),
    "twilio": ("S" + "K", "0123456789abcdef", 32),
}
_FILLER = st.lists(st.sampled_from(["print(x)", "return", "x = 1;", "# note", "foo(bar)", "{", "}", "//", "if a:"]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(_KEY_SHAPES)),
    st.data(),
    _FILLER,
    _FILLER,
    st.sampled_from(["{}", '"{}"', "'{}'", "key={}", "Bearer {}", "({})"]),
)
def test_a_key_embedded_in_a_random_line_is_found_either_way(fast, slow, shape, data, before, after, context):
    prefix, alphabet, n = _KEY_SHAPES[shape]
    key = prefix + data.draw(st.text(alphabet, min_size=n, max_size=n).filter(lambda s: len(set(s)) > 4))
    line = " ".join([*before, context.format(key), *after])
    found = slow.find(["import os", line])
    assert found and fast.find(["import os", line]) == found
