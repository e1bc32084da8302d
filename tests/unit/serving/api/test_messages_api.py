"""`/v1/messages` through the official `anthropic` client (plain and streamed), against a gateway in this
process over scripted stand-in replicas: system prompts, text and tool_use / tool_result blocks, the stream's
event sequence, `x-api-key` and `anthropic-version`, errors in Anthropic's shape, token counting, max_tokens
as a ceiling, and the turns logged as the same completion events a chat completion makes. With real clients
and a real replica: tests/integration/serving/api/test_agent_clients.py."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest
from anthropic import AsyncAnthropic
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from contracts import events as ev
from tests.fake_engine import gateway_over_fakes, run_with_sdk
from tests.helpers import sse
from tests.unit.serving.tenants.test_tenant_admin import spooled

pytestmark = pytest.mark.timeout(120)
READ = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
]
H = {"x-api-key": "key-u0", "anthropic-version": "2023-06-01"}


def run(test_model, tmp_path, scenario, **cfg):
    sdk = partial(AsyncAnthropic, api_key="key-u0", max_retries=0)
    return run_with_sdk(test_model, tmp_path, [2], lambda url: sdk(base_url=url), scenario, **cfg)


def test_a_tool_using_conversation_through_the_official_client(test_model, tmp_path):
    async def scenario(client, fakes, sdk):
        fakes[0].texts = [READ, "Done: the tests pass."]
        msgs = [{"role": "user", "content": "fix a.py"}]
        first = await sdk.messages.create(
            model="claude-x", max_tokens=8000, system="You are a coding agent.", messages=msgs, tools=TOOLS
        )
        use = first.content[0]
        msgs += [
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "def f(): pass"}]},
        ]
        async with sdk.messages.stream(model="claude-x", max_tokens=1024, messages=msgs, tools=TOOLS) as stream:
            kinds = [e.type async for e in stream]
            final = await stream.get_final_message()
        counted = await sdk.messages.count_tokens(model="claude-x", messages=msgs, tools=TOOLS)
        return first, use, kinds, final, counted

    first, use, kinds, final, counted = run(test_model, tmp_path, scenario)
    assert first.id.startswith("msg_cmpl-") and first.stop_reason == "tool_use"
    assert use.type == "tool_use" and use.id.startswith("toolu_") and use.input == {"path": "a.py"}
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert final.content[0].text == "Done: the tests pass." and final.stop_reason == "end_turn"
    assert counted.input_tokens == final.usage.input_tokens + final.usage.cache_read_input_tokens


def test_every_body_and_event_matches_the_sdk_models(test_model, tmp_path):
    async def scenario(client, fakes, sdk):
        fakes[0].texts = ["Let me look. " + READ, "plain", "x = 1"]
        streams = []
        for tools in (TOOLS, []):
            body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "go"}], "stream": True}
            r = await client.post("/v1/messages", json={**body, "tools": tools}, headers=H)
            assert r.status == 200, await r.text()
            streams.append(sse(await r.text()))
        body = {
            "model": "m",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
        }
        r = await client.post("/v1/messages", json=body, headers=H)
        return streams, await r.json()

    streams, body = run(test_model, tmp_path, scenario)
    adapter = TypeAdapter(RawMessageStreamEvent)
    for events in streams:
        for e in events:
            if e["type"] != "ping":
                adapter.validate_python(e)
    kinds = [[e["content_block"]["type"] for e in s if e["type"] == "content_block_start"] for s in streams]
    assert kinds == [["text", "tool_use"], ["text"]]
    assert [e["index"] for e in streams[0] if e["type"] == "content_block_stop"] == [0, 1]
    Message.model_validate(body)


def test_errors_come_in_anthropic_shape(test_model, tmp_path):
    msgs = [{"role": "user", "content": "x"}]
    cases = [
        ({"model": "m", "messages": msgs}, H),  # max_tokens missing
        ({"model": "m", "max_tokens": 8, "messages": msgs}, {"x-api-key": "key-u0"}),  # no anthropic-version
        ({"model": "m", "max_tokens": 8, "messages": msgs}, {**H, "anthropic-version": "latest"}),
        ({"model": "m", "max_tokens": 8, "messages": msgs}, {**H, "x-api-key": "wrong"}),
        ({"model": "m", "max_tokens": 8, "messages": []}, H),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, H),
        ({"model": "m", "max_tokens": 8, "messages": msgs, "tools": [{"type": "bash_20250124", "name": "bash"}]}, H),
        ({"model": "m", "max_tokens": 8, "messages": msgs, "temperature": 1.5}, H),
        (
            {
                "model": "m",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}],
            },
            H,
        ),
        ({"model": "m", "max_tokens": 8, "messages": msgs + [{"role": "assistant", "content": "Sure"}]}, H),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 300_000}]}, H),
        ({"model": "m", "max_tokens": 8, "messages": msgs + [{"role": "system", "content": ["hi"]}]}, H),
        ({"model": "m", "max_tokens": 8, "messages": msgs + [{"role": "system", "content": [{"type": "text"}]}]}, H),
    ]

    async def scenario(client, fakes, sdk):
        out = []
        for body, headers in cases:
            r = await client.post("/v1/messages", json=body, headers=headers)
            out.append((r.status, await r.json()))
        r = await client.post("/v1/messages", data=b"{nope", headers=H)
        out.append((r.status, await r.json()))
        r = await client.get("/v1/messages", headers=H)
        out.append((r.status, await r.json()))
        r = await client.post("/v1/messages/nope", json={}, headers=H)
        out.append((r.status, await r.json()))
        r = await client.post("/v1/messages", data=b"x" * (9 << 20), headers=H)
        out.append((r.status, await r.json()))
        return out

    out = run(test_model, tmp_path, scenario)
    assert [s for s, _ in out] == [400, 400, 400, 401, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400, 405, 404, 413]
    for _, body in out:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert out[3][1]["error"]["type"] == "authentication_error"
    kinds = [body["error"]["type"] for _, body in out[-3:]]
    assert kinds == ["invalid_request_error", "not_found_error", "request_too_large"]
    assert "anthropic-version" in out[1][1]["error"]["message"]


def test_max_tokens_is_a_ceiling_and_turns_are_logged_like_chat(test_model, tmp_path):
    async def scenario(client, fakes, sdk):
        fakes[0].texts = [READ, "Done."]
        msgs = [{"role": "user", "content": "fix a.py"}]
        # More than the server gives (the SDK itself refuses to wait that long unstreamed): lowered, not refused
        r = await client.post(
            "/v1/messages", json={"model": "m", "max_tokens": 10**6, "messages": msgs, "tools": TOOLS}, headers=H
        )
        first = Message.model_validate(await r.json())
        msgs += [
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[0].id, "content": "ok"}]},
        ]
        second = await sdk.messages.create(model="m", max_tokens=64, messages=msgs, tools=TOOLS)
        return first, second, client.gateway.cfg.limits.max_tokens

    first, second, limit = run(test_model, tmp_path, scenario, log_events=True)
    done = [e for _, _, e, _ in spooled(tmp_path / "gw") if isinstance(e, ev.CompletionEvent)]
    assert [e.api for e in done] == ["messages", "messages"]
    assert done[0].sampling["max_tokens"] == limit and done[1].sampling["max_tokens"] == 64
    assert done[1].parent_id == f"{done[0].completion_id}:0" and done[1].session_id == done[0].session_id
    assert second.id == "msg_" + done[1].completion_id


def test_a_tenant_that_denies_training_is_served_and_logged_without_content_on_both_apis(test_model, tmp_path):
    """The same tenant policy as the chat API's: served, counted, its events without token ids or experts."""
    from serving import auth

    keys = tmp_path / "keys.json"
    key = auth.add_key(keys, "private")
    auth.set_policy(keys, "private", train="deny")

    async def main():
        async with gateway_over_fakes(test_model, tmp_path / "gw", [3], tenants=0, keys_file=keys, log_events=True) as (
            client,
            fakes,
        ):
            fakes[0].texts = [READ]
            h = {"x-api-key": key, "anthropic-version": "2023-06-01"}
            body = {
                "model": "m",
                "max_tokens": 32,
                "messages": [{"role": "user", "content": "fix a.py"}],
                "tools": TOOLS,
            }
            r1 = await client.post("/v1/messages", json=body, headers=h)
            r2 = await client.post(
                "/v1/responses", json={"model": "m", "input": "fix a.py"}, headers={"x-api-key": key}
            )
            return r1.status, r2.status

    assert asyncio.run(main()) == (200, 200)
    done = [e for _, _, e, _ in spooled(tmp_path / "gw") if isinstance(e, ev.CompletionEvent)]
    assert [e.api for e in done] == ["messages", "responses"]
    assert all(e.withheld == "policy" and e.prompt_ids.size == 0 and e.output_ids.size == 0 for e in done)
