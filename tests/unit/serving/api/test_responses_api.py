"""`/v1/responses` through the official `openai` client (plain and streamed), against a gateway in this
process over scripted stand-in replicas: function calls and their outputs, multi-turn by previous_response_id
and by input items, instructions, what `store` keeps (per tenant, retention, forget), every body and stream
event checked against the SDK's own models, bad input refused in OpenAI's shape, and the turns logged as
the same completion events (session, parent, api) a chat completion makes. The same with real clients and a
real replica: tests/integration/serving/api/test_agent_clients.py."""

from __future__ import annotations

import json
import time
from functools import partial

import pytest
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from contracts import events as ev
from serving import auth
from tests.fake_engine import run_with_sdk
from tests.helpers import sse
from tests.unit.serving.tenants.test_tenant_admin import spooled

pytestmark = pytest.mark.timeout(120)
READ = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
PATCH = '<tool_call>\n{"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        "strict": False,
    }
]
H = {"Authorization": "Bearer key-u0"}


def run(test_model, tmp_path, scenario, **cfg):
    sdk = partial(AsyncOpenAI, api_key="key-u0", max_retries=0)
    return run_with_sdk(test_model, tmp_path, [4], lambda url: sdk(base_url=url + "/v1"), scenario, **cfg)


def test_a_tool_using_conversation_through_the_official_client(test_model, tmp_path):
    async def scenario(client, fakes, sdk):
        fakes[0].texts = [READ, "Done: the tests pass."]
        first = await sdk.responses.create(model="m", instructions="Be brief.", input="fix a.py", tools=TOOLS)
        call = first.output[0]
        events, final = [], None
        stream = await sdk.responses.create(
            model="m",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "def f(): pass"}],
            tools=TOOLS,
            stream=True,
        )
        async for e in stream:
            events.append(e.type)
            final = e.response if e.type == "response.completed" else final
        got = await sdk.responses.retrieve(final.id)
        items = await sdk.responses.input_items.list(final.id)
        return first, call, events, final, got, items

    first, call, events, final, got, items = run(test_model, tmp_path, scenario)
    assert first.status == "completed" and first.id.startswith("resp_cmpl-")
    assert call.type == "function_call" and call.name == "read_file" and json.loads(call.arguments) == {"path": "a.py"}
    assert events[:2] == ["response.created", "response.in_progress"] and events[-1] == "response.completed"
    assert "response.output_text.delta" in events and "response.output_item.done" in events
    assert final.output_text == "Done: the tests pass." and final.previous_response_id == first.id
    assert got.output_text == final.output_text and got.usage.output_tokens == final.usage.output_tokens
    assert [i.type for i in items.data] == ["function_call_output"]


def test_every_body_and_event_matches_the_sdk_models(test_model, tmp_path):
    async def scenario(client, fakes, sdk):
        fakes[0].texts = ["Some text " + READ, PATCH, "plain answer"]
        custom = {"type": "custom", "name": "apply_patch", "description": "Apply a patch"}
        bodies, streams = [], []
        for tools in (TOOLS, TOOLS + [custom], []):
            body = {"model": "m", "input": [{"role": "user", "content": "go"}], "tools": tools, "stream": True}
            r = await client.post("/v1/responses", json=body, headers=H)
            assert r.status == 200, await r.text()
            streams.append(sse(await r.text()))
        fakes[0].texts = ["x = 1"]
        r = await client.post("/v1/responses", json={"model": "m", "input": "go", "max_output_tokens": 3}, headers=H)
        bodies.append(await r.json())
        return bodies, streams

    bodies, streams = run(test_model, tmp_path, scenario)
    adapter = TypeAdapter(ResponseStreamEvent)
    for events in streams:
        for e in events:
            adapter.validate_python(e)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        Response.model_validate(events[-1]["response"])
    kinds = [[i["type"] for i in s[-1]["response"]["output"]] for s in streams]
    assert kinds == [["message", "function_call"], ["custom_tool_call"], ["message"]]
    assert streams[1][-1]["response"]["output"][0]["input"] == "*** Begin Patch"
    assert streams[0][-1]["response"]["output"][0]["content"][0]["text"] == "Some text "
    for b in bodies:
        Response.model_validate(b)


def test_bad_input_is_refused_in_openai_shape(test_model, tmp_path):
    bad = [
        {"model": "m"},  # no input
        {"model": "m", "input": 3},
        {"model": "m", "input": [{"type": "computer_call_output", "call_id": "x"}]},
        {"model": "m", "input": [{"type": "function_call_output", "call_id": "nobody", "output": "x"}]},
        {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        {"model": "m", "input": "x", "temperature": "hot"},
        {"model": "m", "input": "x", "temperature": 3},
        {"model": "m", "input": "x", "background": True},
        {"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}},
        {"model": "m", "input": "x", "truncation": "auto"},
        {"model": "m", "input": "x", "previous_response_id": "resp_nope"},
        {"model": "m", "input": "x" * 200_000},
    ]

    async def scenario(client, fakes, sdk):
        out = []
        for body in bad:
            r = await client.post("/v1/responses", json=body, headers=H)
            out.append((r.status, (await r.json())["error"]))
        # fields newer than the pinned types, and hosted tools nothing here runs: taken, left out, counted
        body = {"model": "m", "input": "x", "frobnicate": 1, "tools": [{"type": "web_search"}]}
        r = await client.post("/v1/responses", json=body, headers=H)
        out.append((r.status, None))
        metrics = await (await client.get("/metrics")).text()
        return out, metrics

    out, metrics = run(test_model, tmp_path, scenario)
    statuses = [s for s, _ in out]
    assert statuses == [400] * 10 + [404, 400, 200], out
    assert all(set(e) == {"message", "type", "param", "code"} for _, e in out[:-1])
    assert out[3][1]["code"] == "invalid_value" and "nobody" in out[3][1]["message"]
    assert out[-2][1]["code"] == "context_length_exceeded"
    assert 'flywheel_gateway_ignored_fields_total{api="responses",field="frobnicate"} 1.0' in metrics
    assert 'flywheel_gateway_ignored_fields_total{api="responses",field="tool_web_search"} 1.0' in metrics


def test_store_is_per_tenant_and_forget_and_retention_cover_it(test_model, tmp_path):
    keys = tmp_path / "keys.json"
    key_a, key_b = auth.add_key(keys, "alice"), auth.add_key(keys, "bob")

    async def scenario(client, fakes, sdk):
        a = {"Authorization": f"Bearer {key_a}"}
        b = {"Authorization": f"Bearer {key_b}"}
        ids = []
        for store in (True, False, True):
            r = await client.post("/v1/responses", json={"model": "m", "input": "x", "store": store}, headers=a)
            ids.append((await r.json())["id"])
        seen = [(await client.get(f"/v1/responses/{i}", headers=a)).status for i in ids]
        other = (await client.get(f"/v1/responses/{ids[0]}", headers=b)).status
        other_chain = await client.post(
            "/v1/responses", json={"model": "m", "input": "y", "previous_response_id": ids[0]}, headers=b
        )
        deleted = (await client.delete(f"/v1/responses/{ids[2]}", headers=a)).status
        after_delete = (await client.get(f"/v1/responses/{ids[2]}", headers=a)).status
        r = await client.post("/v1/responses", json={"model": "m", "input": "x"}, headers=b)
        bobs = (await r.json())["id"]
        r = await client.post("/admin/tenants/alice/forget", headers={"Authorization": "Bearer admin-secret"})
        assert r.status == 200, await r.text()
        forgotten = (await client.get(f"/v1/responses/{ids[0]}", headers=a)).status
        bob_kept = (await client.get(f"/v1/responses/{bobs}", headers=b)).status  # a forget is one tenant's
        r = await client.post("/v1/responses", json={"model": "m", "input": "x"}, headers=a)
        alices = (await r.json())["id"]  # after the forget: kept
        # A retention of its own: a response older than it is gone, even before the sweep reaches it.
        r = await client.post("/v1/responses", json={"model": "m", "input": "x"}, headers=b)
        old = (await r.json())["id"]
        r = await client.put(
            "/admin/tenants/bob", json={"retention_days": 1}, headers={"Authorization": "Bearer admin-secret"}
        )
        assert r.status == 200
        store = client.gateway.responses
        two_days_ago = time.time() - 2 * 86400  # past bob's retention, within alice's (the default: 30 days)
        store._db.execute("UPDATE responses SET created = ? WHERE id IN (?, ?)", (two_days_ago, old, alices))
        expired = (await client.get(f"/v1/responses/{old}", headers=b)).status
        swept = await store.run(store.expire)  # bob's two, now past his retention
        alice_kept = (await client.get(f"/v1/responses/{alices}", headers=a)).status
        return seen, other, other_chain.status, deleted, after_delete, forgotten, bob_kept, alice_kept, expired, swept

    seen, other, chain, deleted, after_delete, forgotten, bob_kept, alice_kept, expired, swept = run(
        test_model, tmp_path, scenario, tenants=0, keys_file=keys
    )
    assert seen == [200, 404, 200] and other == 404 and chain == 404
    assert deleted == 200 and after_delete == 404 and forgotten == 404 and bob_kept == 200
    assert expired == 404 and swept == 1 and alice_kept == 200


def test_turns_are_logged_as_one_session_with_their_api(test_model, tmp_path):
    async def scenario(client, fakes, sdk):
        fakes[0].texts = [READ, "Done: the tests pass."]
        first = await sdk.responses.create(model="m", input="fix a.py", tools=TOOLS, store=False)
        call = first.output[0]
        items = [
            {"role": "user", "content": "fix a.py"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "def f(): pass"},
        ]
        second = await sdk.responses.create(model="m", input=items, tools=TOOLS, store=False)
        r = await client.post("/v1/feedback", json={"completion_id": second.id, "kind": "accept"}, headers=H)
        assert r.status == 200, await r.text()
        return first, second

    first, second = run(test_model, tmp_path, scenario, log_events=True)
    events = [e for t, _, e, _ in spooled(tmp_path / "gw") if e is not None]
    done = [e for e in events if isinstance(e, ev.CompletionEvent)]
    assert [e.api for e in done] == ["responses", "responses"]
    assert done[0].completion_id == first.id.removeprefix("resp_")
    assert done[1].parent_id == f"{done[0].completion_id}:0" and done[1].session_id == done[0].session_id
    fb = [e for e in events if isinstance(e, ev.FeedbackEvent)]
    assert [(f.completion_id, f.kind) for f in fb] == [(done[1].completion_id, "accept")]
