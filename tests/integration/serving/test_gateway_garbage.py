"""Garbage at every endpoint of a live gateway: always a 2xx or a 4xx with an OpenAI error body, never a 5xx."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.helpers import GATEWAY_ADMIN, get, post

pytestmark = pytest.mark.timeout(900)

POST_ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/feedback", "/v1/events", "/admin/replicas/r0/drain"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)

# Bodies shaped like real requests, with fields of the wrong type or out of range mixed in.
FIELDS = [
    "model",
    "prompt",
    "suffix",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "seed",
    "completion_id",
    "kind",
    "choice_index",
    "accepted_chars",
    "elapsed_ms",
    "type",
    "elapsed",
    "echo",
    "tools",
    "session_id",
    "score",
]
small_values = (
    st.none()
    | st.booleans()
    | st.integers(-3, 300)
    | st.floats(-3, 3, allow_nan=False)
    | st.text(max_size=20)
    | st.lists(st.text(max_size=5), max_size=5)
    | st.just([{"role": "user", "content": "hi"}])
    | st.just({"include_usage": True})
    | st.sampled_from(["accept", "reject", "partial", "view", "select", "dismiss"])
)
near_valid = st.fixed_dictionaries(
    {"model": st.just("m")}, optional={f: small_values for f in FIELDS if f != "model"}
).map(
    lambda d: (
        {**d, "max_tokens": min(d["max_tokens"], 4)}
        if isinstance(d.get("max_tokens"), int) and not isinstance(d.get("max_tokens"), bool)
        else d
    )
)


def _check(status, body):
    assert status < 500, (status, body)
    if status >= 400:
        assert isinstance(body, dict) and set(body["error"]) == {"message", "type", "param", "code"}, body


@pytest.mark.parametrize("route", POST_ROUTES)
@SETTINGS
@given(raw=st.binary(max_size=300))
def test_random_bytes(gateway, route, raw):
    _check(*post(gateway.url + route, raw=raw, key=GATEWAY_ADMIN if "admin" in route else "key-alice")[:2])


@pytest.mark.parametrize("route", POST_ROUTES)
@SETTINGS
@given(body=json_values)
def test_random_json(gateway, route, body):
    _check(*post(gateway.url + route, body=body, key="key-alice")[:2])


@pytest.mark.parametrize("route", POST_ROUTES[:4])
@SETTINGS
@given(body=near_valid)
def test_near_valid_requests(gateway, route, body):
    _check(*post(gateway.url + route, body=body, key="key-alice")[:2])


@SETTINGS
@given(query=st.text(max_size=40), key=st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20))
def test_random_query_and_keys(gateway, query, key):
    status, body, _ = post(
        f"{gateway.url}/v1/events?{quote(query, safe='=&')}",
        body={"type": "view", "completion_id": "x"},
        headers={"Authorization": f"Bearer {key}"},
    )
    _check(status, body)
    assert status == 401 or key in ("key-alice", "key-bob")


def test_malformed_http_is_refused_by_the_server_layer(gateway):
    # Control characters in a header never reach our handlers: aiohttp's parser answers 400 itself.
    status, _, _ = post(f"{gateway.url}/v1/completions", body={}, headers={"Authorization": "Bearer \x1f"})
    assert status == 400


def test_non_ascii_keys_are_wrong_keys(gateway):
    """Bytes that are not ASCII after `Bearer` (or in X-Api-Key, or as the admin token): 401, never a 500."""
    for headers in ({"Authorization": "Bearer caf\xe9\xff"}, {"X-Api-Key": "\xe9t\xe9"}):
        status, body, _ = post(f"{gateway.url}/v1/completions", body={"model": "m", "prompt": "x"}, headers=headers)
        assert status == 401, (status, body)
        _check(status, body)
    status, body, _ = post(f"{gateway.url}/admin/replicas/r0/drain", body={}, headers={"Authorization": "Bearer \xe9"})
    assert status == 401


def test_huge_prompts_are_refused_before_tokenizing(gateway):
    """A prompt no tokenization could fit is refused from its length alone; a long one that might fit is
    tokenized off the event loop and refused by its token count."""
    status, body, _ = post(
        gateway.url + "/v1/completions", body={"model": "m", "prompt": "x" * 4_000_000}, key="key-alice"
    )
    assert (
        status == 400
        and body["error"]["code"] == "context_length_exceeded"
        and "characters" in body["error"]["message"]
    )
    status, body, _ = post(
        gateway.url + "/v1/completions", body={"model": "m", "prompt": "def f(x):\n" * 12_000}, key="key-alice"
    )
    assert (
        status == 400 and body["error"]["code"] == "context_length_exceeded" and "tokens;" in body["error"]["message"]
    )


def test_limits(gateway):
    big = {"model": "m", "prompt": "x" * (9 << 20)}  # past the 8 MiB body limit
    status, body, _ = post(gateway.url + "/v1/completions", body=big, key="key-alice")
    assert status == 413 and body["error"]["code"] == "request_too_large"
    long_prompt = {"model": "m", "prompt": "def f(x):\n" * 12_000, "max_tokens": 4}  # past the 40,960 positions
    status, body, _ = post(gateway.url + "/v1/completions", body=long_prompt, key="key-alice")
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    status, body, _ = post(
        gateway.url + "/v1/completions", raw=b'{"model": "m", "prompt": "\xff\xfe"}', key="key-alice"
    )
    assert status == 400 and body["error"]["code"] == "invalid_encoding"
    for path in ("/nope", "/v1/completions/extra"):
        status, text = get(gateway.url + path)
        assert status == 404 and json.loads(text)["error"]["code"] == "not_found"
    status, text = get(gateway.url + "/v1/completions")
    assert status == 405 and json.loads(text)["error"]["type"] == "invalid_request_error"
