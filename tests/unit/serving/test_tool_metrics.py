"""Reward hacking in tool use is watched: tool-call outcomes and repeated calls counted per weight version,
and per canary arm. A gateway in this process in front of scripted stand-in replicas (each says its
version and writes the text a test gives it), so what is counted is known exactly."""

from __future__ import annotations

import asyncio
import json

from prometheus_client.parser import text_string_to_metric_families

from serving.monitors import VersionMonitors
from tests.fake_engine import gateway_over_fakes

ADMIN = {"Authorization": "Bearer admin-secret"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object", "properties": {}}}},
]
USER = [{"role": "user", "content": "The tests fail; find out why."}]
READ_A = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
MALFORMED = '<tool_call>\n{"name": "read_file", "arguments": {"path": '  # cut off
UNKNOWN = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'


def run_with_gateway(test_model, tmp_path, versions: list[int], scenario):
    """Start len(versions) fake replicas and a gateway in front of them, run `scenario(client, fakes)`."""

    async def main():
        async with gateway_over_fakes(test_model, tmp_path / "gw", versions) as (client, fakes):
            return await scenario(client, fakes)

    return asyncio.run(main())


async def chat(client, key="key-u0", stream=False, **kw) -> dict:
    body = {"model": "flywheel-coder", "messages": USER, "tools": TOOLS, "max_tokens": 32, "stream": stream, **kw}
    r = await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status == 200, await r.text()
    if not stream:
        return await r.json()
    out = {"session_id": r.headers.get("X-Session-Id"), "finish": None}
    async for line in r.content:
        if line.startswith(b"data: {"):
            c = json.loads(line[6:])
            if c.get("choices") and c["choices"][0]["finish_reason"]:
                out["finish"] = c["choices"][0]["finish_reason"]
    return out


async def scrape(client) -> dict[tuple, float]:
    text = await (await client.get("/metrics")).text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("flywheel_gateway_tool_calls")
    }


def calls(values: dict, outcome: str, version: str) -> float:
    return values.get(("flywheel_gateway_tool_calls_total", (("outcome", outcome), ("version", version))), 0.0)


def repeated(values: dict, version: str) -> float:
    return values.get(("flywheel_gateway_tool_calls_repeated_total", (("version", version),)), 0.0)


def test_outcomes_and_repeated_calls_are_counted_per_version(test_model, tmp_path):
    async def scenario(client, fakes):
        fakes[0].texts = [READ_A, READ_A, MALFORMED, UNKNOWN, READ_A]
        first = await chat(client)
        assert first["choices"][0]["finish_reason"] == "tool_calls" and first["model_version"] == 7
        call = first["choices"][0]["message"]["tool_calls"][0]
        # the agent's next turn: the tool's result; the model makes the very same call again
        turn2 = USER + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "x = 1"},
        ]
        second = await chat(client, messages=turn2)
        assert second["session_id"] == first["session_id"]
        assert second["choices"][0]["finish_reason"] == "tool_calls"
        assert (await chat(client, messages=turn2))["choices"][0]["finish_reason"] == "stop"  # malformed
        assert (await chat(client, messages=turn2, stream=True))["finish"] == "stop"  # unknown tool, streamed
        # the same call in another session is not a repeat
        other = await chat(client, key="key-u1", stream=True)
        assert other["finish"] == "tool_calls"
        values = await scrape(client)
        weights = await (await client.get("/admin/weights", headers=ADMIN)).json()
        return values, weights

    values, weights = run_with_gateway(test_model, tmp_path, [7], scenario)
    assert [calls(values, o, "7") for o in ("valid", "malformed", "unknown_tool", "dropped_parallel")] == [3, 1, 1, 0]
    assert repeated(values, "7") == 1
    assert not [k for k in values if ("version", "7") not in k[1]]  # every series has its version
    v7 = weights["tool_calls"]["7"]
    assert (v7["answers"], v7["malformed_answers"], v7["repeated"]) == (5, 2, 1)
    assert v7["malformed_rate"] == 0.4 and v7["repeated_rate"] == round(1 / 3, 4)


def test_canary_arms_count_their_tool_answers(test_model, tmp_path):
    async def scenario(client, fakes):
        stable, canary = fakes  # r0 serves v1, r1 the canary v2 (which writes malformed calls)
        stable.texts, canary.texts = [READ_A], [MALFORMED]
        r = await client.put("/admin/canary", json={"version": 2, "replicas": ["r1"], "share": 0.5}, headers=ADMIN)
        assert r.status == 200, await r.text()
        for i in range(40):
            await chat(client, key=f"key-u{i}", stream=bool(i % 2))
        arms = (await (await client.get("/admin/canary", headers=ADMIN)).json())["canary"]["arms"]
        return arms, await scrape(client)

    arms, values = run_with_gateway(test_model, tmp_path, [1, 2], scenario)
    c, s = arms["canary"], arms["stable"]
    assert c["tool_answers"] > 0 and s["tool_answers"] > 0 and c["tool_answers"] + s["tool_answers"] == 40
    assert (c["tool_malformed"], c["malformed_rate"]) == (c["tool_answers"], 1.0)
    assert (s["tool_malformed"], s["malformed_rate"]) == (0, 0.0)
    assert calls(values, "malformed", "2") == c["tool_answers"] and calls(values, "valid", "1") == s["tool_answers"]
    assert calls(values, "valid", "2") == 0 and calls(values, "malformed", "1") == 0


def test_version_labels_are_bounded():
    stats = VersionMonitors(max_versions=3)
    for v in range(10):
        stats.count(v, "valid", 2, 1)
    stats.count(7, "malformed", 1, 0)  # seen again: kept over older ones
    stats.count(None, "unknown_tool", 1, 0)
    assert list(stats.view()) == ["9", "7", "unknown"]
    series = {tuple(s.labels.values()) for f in stats.collect() for s in f.samples}
    assert {lab[-1] for lab in series} == {"9", "7", "unknown"}
    assert stats.view()["7"] == {
        "valid": 2,
        "malformed": 1,
        "unknown_tool": 0,
        "dropped_parallel": 0,
        "repeated": 1,
        "answers": 2,
        "malformed_answers": 1,
        "malformed_rate": 0.5,
        "repeated_rate": 0.5,
        **dict.fromkeys(("failed_call", "clarifying", "test_edit", "early_stop", "truncated"), 0),
        **dict.fromkeys(("tool_results", "agent_answers", "all_answers", "answer_tokens"), 0),
        **dict.fromkeys(("failed_call_rate", "clarifying_rate", "test_edit_rate", "early_stop_rate"), None),
        "truncated_rate": None,
        "mean_answer_tokens": None,
    }
