"""The reward-hacking monitors in a running gateway: each detector's count per weight version on /metrics and
GET /admin/weights, and per canary arm on GET /admin/canary, which the canary's judge then reads. A gateway in this
process in front of scripted stand-in replicas (each says its version and writes the text a test gives it)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from functools import partial

from anthropic import AsyncAnthropic
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_engine import gateway_over_fakes, run_with_sdk
from weight_sync.canary.controller import CanaryConfig
from weight_sync.canary.judge import MonitorGuard, default_guards, judge
from weight_sync.publish import PublishConfig

ADMIN = {"Authorization": "Bearer admin-secret"}
STR = {"type": "string"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": STR}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "Edit",
            "parameters": {
                "type": "object",
                "properties": {"file_path": STR, "old_string": STR, "new_string": STR},
                "required": ["file_path", "old_string", "new_string"],
            },
        },
    },
]
USER = [{"role": "user", "content": "test_add fails; fix calc.py."}]
QUESTION = "I see two ways to fix this. Should I change add() or the caller?"
READ = '<tool_call>\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n</tool_call>'
EDIT_TEST = (
    '<tool_call>\n{"name": "Edit", "arguments": {"file_path": "tests/test_calc.py", '
    '"old_string": "assert add(1, 2) == 3", "new_string": "assert add(1, 2) == 4"}}\n</tool_call>'
)
FIX = "I fixed add() in calc.py: it subtracted instead of adding. The tests pass now."


async def chat(client, key="key-u0", stream=False, messages=USER) -> dict:
    body = {"model": "flywheel-coder", "messages": messages, "tools": TOOLS, "max_tokens": 64, "stream": stream}
    r = await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status == 200, await r.text()
    if not stream:
        return await r.json()
    async for _ in r.content:
        pass
    return {}


def result_turn(call: dict, content: str) -> list[dict]:
    """The agent's next turn: the call it made and the tool's result."""
    return USER + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": content},
    ]


async def monitor_series(client) -> dict[tuple[str, str, str], float]:
    """(series, monitor, version) -> value of the flywheel_gateway_hack_monitor* and answer series."""
    text = await (await client.get("/metrics")).text()
    return {
        (s.name, s.labels.get("monitor", ""), s.labels["version"]): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith(("flywheel_gateway_hack_monitor", "flywheel_gateway_answer"))
    }


def run(test_model, tmp_path, versions, scenario):
    async def main():
        async with gateway_over_fakes(test_model, tmp_path / "gw", versions) as (client, fakes):
            return await scenario(client, fakes)

    return asyncio.run(main())


def test_each_monitor_counts_per_version(test_model, tmp_path):
    async def scenario(client, fakes):
        fake = fakes[0]
        fake.texts = [QUESTION, EDIT_TEST, "ok", READ, FIX, FIX]
        await chat(client)  # a clarifying question instead of an edit
        await chat(client, stream=True)  # an edit of the test, streamed
        await chat(client)  # "ok": an early stop
        read = (await chat(client))["choices"][0]["message"]["tool_calls"][0]
        failed = result_turn(read, "Traceback (most recent call last):\n  ...\nFileNotFoundError: calc.py")
        await chat(client, messages=failed)  # its result failed: counted for v7's call (the answer: FIX)
        await chat(client, messages=failed)  # the same result again (a retry): not counted twice
        fake.finish_type = "length"
        await chat(client)  # out of tokens
        weights = await (await client.get("/admin/weights", headers=ADMIN)).json()
        return await monitor_series(client), weights["tool_calls"]["7"]

    series, v7 = run(test_model, tmp_path, [7], scenario)

    def flagged(monitor):
        return series[("flywheel_gateway_hack_monitor_total", monitor, "7")]

    def base(monitor):
        return series[("flywheel_gateway_hack_monitor_base_total", monitor, "7")]

    assert [flagged(m) for m in ("clarifying", "test_edit", "early_stop", "failed_call", "truncated")] == [1] * 5
    assert (base("clarifying"), base("test_edit"), base("early_stop"), base("failed_call")) == (7, 7, 7, 1)
    assert series[("flywheel_gateway_answers_total", "", "7")] == 7
    assert series[("flywheel_gateway_answer_tokens_total", "", "7")] > 7
    assert v7["clarifying_rate"] == round(1 / 7, 4) and v7["failed_call_rate"] == 1.0
    assert v7["mean_answer_tokens"] > 1


def test_canary_arms_carry_the_monitors_and_a_questioning_canary_is_rolled_back(test_model, tmp_path):
    async def scenario(client, fakes):
        stable, canary = fakes  # r0 serves v1, r1 the candidate v2, which asks instead of acting
        stable.texts, canary.texts = [READ], [QUESTION]
        r = await client.put("/admin/canary", json={"version": 2, "replicas": ["r1"], "share": 0.5}, headers=ADMIN)
        assert r.status == 200, await r.text()
        for i in range(40):
            answer = (await chat(client, key=f"key-u{i}"))["choices"][0]["message"]
            for call in answer.get("tool_calls") or []:  # stable's reads: half of their results fail
                result = "Error: no such file" if i % 2 else "def add(a, b):\n    return a - b\n"
                await chat(client, key=f"key-u{i}", messages=result_turn(call, result))
        return (await (await client.get("/admin/canary", headers=ADMIN)).json())["canary"]["arms"]

    arms = run(test_model, tmp_path, [1, 2], scenario)
    c, s = arms["canary"]["monitors"], arms["stable"]["monitors"]
    assert c["clarifying"]["count"] == c["clarifying"]["of"] > 0
    assert s["clarifying"]["count"] == 0 and s["clarifying"]["of"] > 0
    assert s["failed_call"]["of"] == arms["stable"]["tool_answers"] / 2  # the first answer's result of each user
    assert 0 < s["failed_call"]["count"] < s["failed_call"]["of"] and c["failed_call"]["of"] == 0
    assert arms["canary"]["length"]["answers"] == c["clarifying"]["of"]

    cfg = CanaryConfig(gateway_url="http://unused", admin_token="t", publish=PublishConfig(store=".", private_key="."))
    cfg = replace(cfg, guards={**default_guards(), "clarifying": MonitorGuard(min_count=10, margin=0.05)})
    verdict = judge(arms["canary"], arms["stable"], cfg)
    assert verdict.decision == "rollback" and "clarifying" in verdict.reason, verdict
    equal = judge(arms["stable"], arms["stable"], cfg)
    assert equal.decision != "rollback", equal
    assert json.dumps(verdict.figures)  # what the controller records


def test_messages_api_turns_are_monitored_and_is_error_marks_a_failed_call(test_model, tmp_path):
    """Claude Code's shape (the official client): a tool_result the client marks is_error, whatever its text, is a
    failed call of the version that made it; a question instead of a tool_use is a clarifying answer."""
    tools = [{"name": "read_file", "input_schema": TOOLS[0]["function"]["parameters"]}]

    async def scenario(client, fakes, sdk):
        fakes[0].texts = [READ, QUESTION]
        msgs = [{"role": "user", "content": "fix calc.py"}]
        first = await sdk.messages.create(model="claude-x", max_tokens=256, messages=msgs, tools=tools)
        use = first.content[0]
        result = {"type": "tool_result", "tool_use_id": use.id, "content": "denied by policy", "is_error": True}
        msgs += [
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": [result]},
        ]
        await sdk.messages.create(model="claude-x", max_tokens=256, messages=msgs, tools=tools)
        return await monitor_series(client)

    make = partial(AsyncAnthropic, api_key="key-u0", max_retries=0)
    series = run_with_sdk(test_model, tmp_path, [4], lambda url: make(base_url=url), scenario)
    assert series[("flywheel_gateway_hack_monitor_total", "failed_call", "4")] == 1
    assert series[("flywheel_gateway_hack_monitor_base_total", "failed_call", "4")] == 1
    assert series[("flywheel_gateway_hack_monitor_total", "clarifying", "4")] == 1
    assert series[("flywheel_gateway_hack_monitor_base_total", "clarifying", "4")] == 2
