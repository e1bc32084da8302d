"""Continue's development data at `/v1/devdata`: events built as Continue sends them, checked against the zod
schemas of Continue's own npm package (@continuedev/config-yaml, pinned), fed to a gateway in this process
over scripted stand-in replicas; the ones that judge a completion of the caller's become its feedback events
(joined by the texts they carry: serving.signals.served_index), the rest are counted by the documented rule, never a
5xx."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid

import pytest

from contracts import events as ev
from tests.fake_engine import gateway_over_fakes
from tests.helpers import CLIENTS, node_modules
from tests.unit.serving.tenants.test_tenant_admin import spooled

pytestmark = pytest.mark.timeout(120)
A, B = {"Authorization": "Bearer key-u0"}, {"Authorization": "Bearer key-u1"}
FIM = "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n<|fim_middle|>"
BODY = "return x + 1\n    # done\n"
READ = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'


def common(name: str) -> dict:
    return {
        "timestamp": "2026-12-04T12:00:00.000Z",
        "userId": "",
        "userAgent": "Visual Studio Code/1.99.0 (Continue/1.2.0)",
        "selectedProfileId": "local",
        "eventName": name,
        "schema": "0.2.0",
    }


def autocomplete(prompt: str, shown: str, accepted: bool | None) -> dict:
    data = {
        **common("autocomplete"),
        "disable": False,
        "maxPromptTokens": 1024,
        "debounceDelay": 350,
        "maxSuffixPercentage": 0.2,
        "prefixPercentage": 0.3,
        "multilineCompletions": "auto",
        "slidingWindowPrefixPercentage": 0.75,
        "slidingWindowSize": 500,
        "useCache": True,
        "onlyMyCode": True,
        "useRecentlyEdited": True,
        "time": 412,
        "prefix": "def f(x):\n    ",
        "suffix": "\n",
        "prompt": prompt,
        "completion": shown,
        "modelProvider": "openai",
        "modelName": "flywheel-coder",
        "cacheHit": False,
        "filepath": "/repo/a.py",
        "completionId": str(uuid.uuid4()),
        "uniqueId": "machine-1",
    }
    if accepted is not None:
        data["accepted"] = accepted
    return {"name": "autocomplete", "data": data, "schema": "0.2.0", "level": "all", "profileId": "local"}


def chat_feedback(prompt: str, completion: str, good: bool) -> dict:
    data = {
        **common("chatFeedback"),
        "prompt": prompt,
        "completion": completion,
        "modelProvider": "openai",
        "modelName": "flywheel-coder",
        "modelTitle": "Flywheel",
        "feedback": good,
        "sessionId": str(uuid.uuid4()),
    }
    return {"name": "chatFeedback", "data": data, "schema": "0.2.0", "level": "all", "profileId": "local"}


def tool_usage(call_id: str, accepted: bool) -> dict:
    data = {
        **common("toolUsage"),
        "toolCallId": call_id,
        "functionName": "read_file",
        "toolCallArgs": '{"path": "a.py"}',
        "accepted": accepted,
        "succeeded": False,
    }
    return {"name": "toolUsage", "data": data, "schema": "0.2.0", "level": "all", "profileId": "local"}


def tokens_generated() -> dict:
    data = {**common("tokensGenerated"), "model": "flywheel-coder", "provider": "openai", "promptTokens": 11}
    data["generatedTokens"] = 5
    return {"name": "tokensGenerated", "data": data, "schema": "0.2.0", "level": "all", "profileId": "local"}


def continue_accepts(events: list[dict]) -> list[dict]:
    """What Continue's own schemas say of each event (node, the pinned @continuedev/config-yaml)."""
    out = subprocess.run(
        ["node", str(CLIENTS / "continue_devdata_check.mjs"), str(node_modules())],
        input="".join(json.dumps(e) + "\n" for e in events),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_continue_events_join_the_completions_they_judge(test_model, tmp_path):
    async def scenario(client, fakes):
        fakes[0].texts = [BODY, "Use a loop.", READ, BODY]
        r = await client.post("/v1/completions", json={"model": "m", "prompt": FIM, "max_tokens": 16}, headers=A)
        completion = await r.json()
        chat = {"model": "m", "messages": [{"role": "user", "content": "how?"}], "max_tokens": 16}
        answer = await (await client.post("/v1/chat/completions", json=chat, headers=A)).json()
        tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
        called = await (await client.post("/v1/chat/completions", json={**chat, "tools": tools}, headers=A)).json()
        call_id = called["choices"][0]["message"]["tool_calls"][0]["id"]
        await client.post("/v1/completions", json={"model": "m", "prompt": FIM, "max_tokens": 16}, headers=B)
        events = [
            autocomplete(FIM, "return x + 1", True),  # the first line of what was served: joined, accept
            chat_feedback("how?", "Use a loop.", False),  # joined, reject
            tool_usage(call_id, False),  # the user refused the call: reject
            tokens_generated(),  # judges nothing
            autocomplete(FIM, "return x - 1", False),  # never served: unmatched
            autocomplete(FIM, "return x + 1", None),  # shown, not yet decided
            {"name": "brandNewKind", "data": {"x": 1}, "schema": "0.3.0", "level": "all"},
        ]
        answers = []
        for e in events:
            r = await client.post("/v1/devdata", json=e, headers=A)
            answers.append((r.status, await r.json()))
        # bob's completion has the same prompt and text: an event on alice's key never judges it
        r = await client.post("/v1/devdata", json=autocomplete(FIM, "return x + 1", True), headers=A)
        answers.append((r.status, await r.json()))
        bad = dict(autocomplete(FIM, "return x + 1", True))
        bad["data"] = {**bad["data"], "accepted": "yes"}
        r = await client.post("/v1/devdata", json=bad, headers=A)
        answers.append((r.status, await r.json()))
        r = await client.post("/v1/devdata", data=b"{nope", headers=A)
        answers.append((r.status, await r.json()))
        odd = chat_feedback("how?", "Use a loop.", True)
        odd["data"] = {**odd["data"], "prompt": 5}  # a text the join reads, of the wrong type
        r = await client.post("/v1/devdata", json=odd, headers=A)
        answers.append((r.status, await r.json()))
        return events, answers, completion["id"], answer["id"], called["id"]

    events, answers, cmpl, chat, called = asyncio.run(_run(test_model, tmp_path, scenario))
    checked = continue_accepts(events[:6])
    assert all(c["ok"] for c in checked), checked  # what we send is what Continue sends
    outcomes = [body.get("outcome") for _, body in answers[:7]]
    assert outcomes == ["joined", "joined", "joined", "no_signal", "unmatched", "no_signal", "unknown"], answers
    assert answers[7][1]["completion_id"] == cmpl  # alice's own, again (bob's is never a candidate)
    assert [s for s, _ in answers] == [200] * 8 + [400, 400, 400]
    assert "data.prompt" in answers[10][1]["error"]["message"]
    assert "data.accepted" in answers[8][1]["error"]["message"]
    fb = [
        (e.completion_id, e.kind, e.origin)
        for _, _, e, _ in spooled(tmp_path / "gw")
        if isinstance(e, ev.FeedbackEvent)
    ]
    assert fb[:3] == [
        (cmpl, "accept", "continue:autocomplete"),
        (chat, "reject", "continue:chatFeedback"),
        (called, "reject", "continue:toolUsage"),
    ]


async def _run(test_model, tmp_path, scenario):
    async with gateway_over_fakes(test_model, tmp_path / "gw", [1], log_events=True) as (client, fakes):
        return await scenario(client, fakes)
