"""Bounded work for every request: what a client sends (tool schemas, stop sequences, nesting, message and
item counts) and what the model writes from it (tool-call arguments) cost the gateway bounded CPU, and a
hostile request never holds the event loop that every tenant, /health and /admin share.

Each attack is what an outsider can send; over a bound it is a clear 400 naming the limit, or, for the
model's own calls, an invalid call returned as text. (Through a gateway, the event loop never held:
tests/unit/serving/protocol/test_bounded_work_gateway.py.)"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from serving.protocol import messages as ma, responses as ra, tool_calls as tc
from serving.protocol.openai import Limits, parse_chat
from serving.protocol.schema import ApiError, parse_json_body

L = Limits()
USER = [{"role": "user", "content": "fix the bug"}]


def tool(params: dict, name: str = "f") -> dict:
    return {"type": "function", "function": {"name": name, "parameters": params}}


def chat_with(params: dict, **kw):
    return parse_chat({"model": "m", "messages": USER, "tools": [tool(params)], **kw}, L)


def call(name: str, args) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def ref_fanout(levels: int) -> dict:
    """The issue's schema: an anyOf of two refs to the next level, `levels` deep: 2^levels steps to fail."""
    defs = {f"a{i}": {"anyOf": [{"$ref": f"#/$defs/a{i + 1}"}, {"$ref": f"#/$defs/a{i + 1}"}]} for i in range(levels)}
    defs[f"a{levels}"] = {"type": "string"}
    return {"$defs": defs, "type": "object", "properties": {"p": {"$ref": "#/$defs/a0"}}}


# A schema under every static bound that still costs a pattern's time limit (50 ms, more as the regex module
# checks it) per list item when the model writes the wrong strings: each item tries the pattern first, then
# passes the plain branch. Measured on the code before the deadline: 12 s on the event loop for this call.
SLOW = {
    "type": "object",
    "properties": {
        "xs": {"type": "array", "items": {"anyOf": [{"type": "string", "pattern": "^(a|aa)+$"}, {"type": "string"}]}}
    },
}
# Each item costs at least the pattern's own bound (PATTERN_TIMEOUT_S, 50 ms) on any machine, 200 of them at least
# 10 s: past every deadline the tests set, however fast the CPU (40 items took 2 s on an idle machine, under a 3 s one).
SLOW_CALL = call("f", {"xs": ["a" * 40 + "!"] * 200})


# ----------------------------------------------------------------------------- tool schemas


def test_ref_fanout_is_refused_when_the_request_is_read():
    t = time.monotonic()
    with pytest.raises(ApiError) as e:
        chat_with(ref_fanout(40))
    assert e.value.status == 400 and e.value.param == "tools[0].function.parameters"
    assert "max_schema_expansion" in e.value.message and time.monotonic() - t < 5
    # the same schema through the other APIs
    with pytest.raises(ApiError) as e:
        ma.read_request(
            {"model": "m", "max_tokens": 5, "messages": USER, "tools": [{"name": "f", "input_schema": ref_fanout(40)}]}
        )
    assert e.value.status == 400 and e.value.param == "tools[0].input_schema"
    with pytest.raises(ApiError) as e:
        ra.read_request(
            {
                "model": "m",
                "input": "hi",
                "tools": [{"type": "function", "name": "f", **tool(ref_fanout(40))["function"]}],
            }
        )
    assert e.value.status == 400 and "max_schema_expansion" in e.value.message


@pytest.mark.parametrize(
    "params",
    [
        # anyOf of two recursive refs applied to the same child at every level: 2^depth
        {
            "$defs": {"a": {"anyOf": [{"items": {"$ref": "#/$defs/a"}}, {"items": {"$ref": "#/$defs/a"}}]}},
            "$ref": "#/$defs/a",
        },
        # a ref back to itself without descending into the arguments: no value could ever pass
        {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
        # many small schemas together: their checks alone would walk them all on the event loop
        {"type": "object", "properties": {f"p{i}": {"type": "string", "minLength": 1} for i in range(6000)}},
    ],
)
def test_schemas_whose_checks_are_unbounded_are_400s(params):
    with pytest.raises(ApiError) as e:
        chat_with(params)
    assert e.value.status == 400 and e.value.param == "tools[0].function.parameters"


def test_legitimate_recursive_schemas_are_accepted_and_checked():
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["name"],
            },
            # two recursive properties: each child takes one, so the cost stays linear in the arguments
            "expr": {
                "anyOf": [
                    {"type": "number"},
                    {"type": "object", "properties": {"l": {"$ref": "#/$defs/expr"}, "r": {"$ref": "#/$defs/expr"}}},
                ]
            },
        },
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/node"}, "e": {"$ref": "#/$defs/expr"}},
    }
    spec = chat_with(tree).tools
    ok = {"root": {"name": "a", "children": [{"name": "b", "children": []}]}, "e": {"l": 1, "r": {"l": 2, "r": 3}}}
    assert tc.parse(call("f", ok), spec).outcome == "valid"
    assert tc.parse(call("f", {"root": {"children": []}}), spec).outcome == "malformed"


def test_a_slow_check_runs_off_the_loop_and_ends_at_its_deadline_as_an_invalid_call():
    spec = parse_chat({"model": "m", "messages": USER, "tools": [tool(SLOW)]}, Limits(tool_call_timeout_s=0.3)).tools

    async def main():
        ticks = 0

        async def ticker():  # the event loop keeps running while the check does
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.ensure_future(ticker())
        t0 = time.monotonic()
        parsed = await tc.parse_off_loop(SLOW_CALL, spec)
        took = time.monotonic() - t0
        t.cancel()
        return parsed, took, ticks

    parsed, took, ticks = asyncio.run(main())
    assert parsed.outcome == "malformed" and parsed.content == SLOW_CALL and not parsed.calls
    assert took < 5 and ticks >= 5  # 40 patterns run to their limit: seconds, all of them on the loop before


def test_a_large_schema_is_checked_off_the_loop_within_its_own_deadline():
    from serving.protocol import tool_schema as ts

    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "minLength": i} for i in range(3000)}}
    body = {"model": "m", "messages": USER, "tools": [tool(big)]}
    limits = Limits(tool_schema_timeout_s=0.1)

    ticks = 0

    async def main():
        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.ensure_future(ticker())
        try:
            await ts.read_off_loop(body, lambda: parse_chat(body, limits), limits.tool_schema_timeout_s)
        finally:
            t.cancel()

    with pytest.raises(ApiError) as e:
        asyncio.run(main())
    assert e.value.status == 400 and "tool_schema_timeout_s" in e.value.message
    assert ticks >= 3, ticks  # the loop ran while the schema was checked (on the loop it would not tick at all)


def test_a_session_keeps_what_the_model_wrote_by_digest():
    from serving.signals.implicit import ImplicitSignals, Signal

    sig = ImplicitSignals()
    path = "/" + "a" * 1_000_000
    write = {"id": "c1", "name": "write_file", "arguments": json.dumps({"path": path, "content": "x = 1"})}
    sig.answered("t", "s", "cmpl-1:0", [write])
    state = sig._sessions[("t", "s")]
    assert [len(k) for k in state.known] == [16] and len(state.calls["c1"][1]["path"]) == 16
    for i in range(200):  # a long session's signals stay bounded too
        assert sig._new(state, [Signal("repeat", f"cmpl-{i}", 0)])
    assert len(state.named) == 64 and not sig._new(state, [Signal("repeat", "cmpl-199", 0)])


def test_arguments_nested_past_the_bound_are_an_invalid_call_not_a_crash():
    spec = chat_with({"type": "object"}).tools
    deep = "[" * 5000 + "]" * 5000  # past Python's recursion limit
    text = '<tool_call>\n{"name": "f", "arguments": {"a": ' + deep + "}}\n</tool_call>"
    assert tc.parse(text, spec).outcome == "malformed"
    assert tc.parse(call("f", {"a": json.loads("[" * 40 + "]" * 40)}), spec).outcome == "malformed"  # > 32
    assert tc.parse(call("f", {"a": [[1]]}), spec).outcome == "valid"


# ----------------------------------------------------------------------------- request shapes


def test_json_nesting_is_bounded():
    with pytest.raises(ApiError) as e:
        parse_json_body(b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}")
    assert e.value.status == 400 and "max_json_depth" in e.value.message
    assert parse_json_body(
        b'{"a": [[{"b": [1]}]], "s": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}'
    )


def test_stop_sequences_are_bounded_in_length():
    with pytest.raises(ApiError) as e:
        parse_chat({"model": "m", "messages": USER, "stop": ["x" * 257]}, L)
    assert e.value.status == 400 and e.value.param == "stop" and "max_stop_chars" in e.value.message
    assert parse_chat({"model": "m", "messages": USER, "stop": ["x" * 256]}, L).stop == ["x" * 256]
    req = ma.read_request({"model": "m", "max_tokens": 5, "messages": USER, "stop_sequences": ["y" * 1000]})
    with pytest.raises(ApiError) as e:
        ma.to_spec(req, L, "m")
    assert e.value.param == "stop_sequences" and "max_stop_chars" in e.value.message


@pytest.mark.parametrize(
    "read, limit",
    [
        (lambda: parse_chat({"model": "m", "messages": USER * 4097}, L), "max_messages"),
        (
            lambda: parse_chat(
                {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 8193}]}, L
            ),
            "max_content_parts",
        ),
        (
            lambda: ra.read_request(
                {"model": "m", "input": [{"type": "message", "role": "user", "content": "a"}] * 4097}
            ),
            "max_messages",
        ),
        (
            lambda: ra.read_request(
                {
                    "model": "m",
                    "input": [
                        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}] * 8193}
                    ],
                }
            ),
            "max_content_parts",
        ),
        (lambda: ra.read_request({"model": "m", "input": "hi", "tools": [{"type": "web_search"}] * 65}), "MAX_TOOLS"),
        (lambda: ma.read_request({"model": "m", "max_tokens": 5, "messages": USER * 4097}), "max_messages"),
        (
            lambda: ma.read_request(
                {
                    "model": "m",
                    "max_tokens": 5,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 8193}],
                }
            ),
            "max_content_parts",
        ),
        (
            lambda: ma.read_request(
                {"model": "m", "max_tokens": 5, "messages": USER, "tools": [{"name": "f", "input_schema": {}}] * 65}
            ),
            "MAX_TOOLS",
        ),
        (lambda: ra.to_spec(ra.read_request({"model": "m", "input": "hi"}), USER * 4096, L, "m"), "max_messages"),
    ],
)
def test_counts_are_bounded_before_each_item_is_checked(read, limit):
    t = time.monotonic()
    with pytest.raises(ApiError) as e:
        read()
    assert e.value.status == 400 and limit in e.value.message and time.monotonic() - t < 2
