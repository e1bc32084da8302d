"""Request validation: every malformed request is a 4xx with an OpenAI error body."""

import pytest

from serving.protocol.openai import Limits, parse_chat, parse_completion, render_chat
from serving.protocol.schema import ApiError, parse_json_body

L = Limits()


def test_valid_completion_and_defaults():
    s = parse_completion(
        {
            "model": "m",
            "prompt": "def f():",
            "max_tokens": 8,
            "stop": "\n\n",
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": 2,
        },
        L,
    )
    assert (s.prompt, s.max_tokens, s.stop, s.n, s.stream, s.include_usage, s.logprobs) == (
        "def f():",
        8,
        ["\n\n"],
        2,
        True,
        True,
        2,
    )
    d = parse_completion({"model": "m", "prompt": ["x"]}, L)
    assert d.max_tokens == 16 and d.temperature == 1.0 and d.n == 1 and d.logprobs is None and d.min_tokens == 0
    m = parse_completion({"model": "m", "prompt": "x", "max_tokens": 8, "min_tokens": 8}, L)
    assert m.min_tokens == 8 and m.sampling()["min_tokens"] == 8


def test_fim_suffix_allows_empty_prompt():
    s = parse_completion({"model": "m", "prompt": "", "suffix": "\nreturn y"}, L)
    assert s.suffix == "\nreturn y" and s.sampling()["fim"] is True


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "x"}, "model"),
        ({"model": "m"}, "prompt"),
        ({"model": "m", "prompt": ""}, "prompt"),
        ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
        ({"model": "m", "prompt": 5}, "prompt"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": 10**9}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": "5"}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"model": "m", "prompt": "x", "temperature": float("nan")}, "temperature"),
        ({"model": "m", "prompt": "x", "temperature": 3}, "temperature"),
        ({"model": "m", "prompt": "x", "top_p": 0}, "top_p"),
        ({"model": "m", "prompt": "x", "n": 100}, "n"),
        ({"model": "m", "prompt": "x", "stop": ["a"] * 9}, "stop"),
        ({"model": "m", "prompt": "x", "stop": [1]}, "stop"),
        ({"model": "m", "prompt": "x", "echo": True}, "echo"),
        ({"model": "m", "prompt": "x", "logit_bias": {"1": 5}}, "logit_bias"),
        ({"model": "m", "prompt": "x", "frobnicate": 1}, "frobnicate"),
        ({"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"model": "m", "prompt": "x", "logprobs": 9}, "logprobs"),
        ({"model": "m", "prompt": "x", "min_tokens": -1}, "min_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ],
)
def test_bad_completion_requests(body, param):
    with pytest.raises(ApiError) as e:
        parse_completion(body, L)
    assert e.value.status == 400 and e.value.param == param
    err = e.value.body()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]


def test_chat_rendering_and_validation():
    s = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "add 3"}]},
            ],
            "max_completion_tokens": 7,
            "logprobs": True,
            "top_logprobs": 2,
        },
        L,
    )
    assert s.prompt == "# system: be brief\n# user: add 3\n<|assistant|>\n" and s.max_tokens == 7 and s.logprobs == 2
    assert render_chat([{"role": "user", "content": ""}]) == "# user:\n<|assistant|>\n"
    for body in (
        {"model": "m"},
        {"model": "m", "messages": []},
        {"model": "m", "messages": ["hi"]},
        {"model": "m", "messages": [{"role": "wizard", "content": "x"}]},
        {"model": "m", "messages": [{"role": "user", "content": 7}]},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        {"model": "m", "messages": [{"role": "user", "content": "   "}]},
    ):
        with pytest.raises(ApiError) as e:
            parse_chat(body, L)
        assert e.value.status == 400


@pytest.mark.parametrize(
    "raw, code",
    [
        (b"\xff\xfe", "invalid_encoding"),
        (b"{", "invalid_json"),
        (b"[1]", "invalid_json"),
        (b"", "invalid_json"),
        (b"nul", "invalid_json"),
    ],
)
def test_body_parsing(raw, code):
    with pytest.raises(ApiError) as e:
        parse_json_body(raw)
    assert e.value.status == 400 and e.value.code == code


def test_usage_says_cached_tokens_only_when_the_replica_did():
    from serving.protocol.openai import usage

    assert usage(10, 3, None) == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    assert usage(10, 3, 8)["prompt_tokens_details"] == {"cached_tokens": 8}
