"""Agent-mode requests through the gateway and a real SGLang replica, with the official `openai` client:
tools, forced and parallel calls, a tool-message round trip, streaming. The tiny model's calls may be
wrong; the protocol must hold either way: valid calls come back as tool_calls (finish "tool_calls"),
anything else as text (finish "stop"/"length"), counted, never a 4xx/5xx."""
from __future__ import annotations

import json

import openai
import pytest
from jsonschema import validate

from tests.helpers import get

pytestmark = pytest.mark.timeout(300)

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_tests", "description": "Run the test suite",
                                      "parameters": {"type": "object", "properties": {}}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "The tests fail in app.py; find out why."}]


def _client(gateway):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="key-alice", max_retries=0)


def _holds(choice) -> None:
    """What the OpenAI protocol promises a client about one answer."""
    m = choice.message
    if choice.finish_reason == "tool_calls":
        assert m.tool_calls, "finish_reason tool_calls without calls"
        for c in m.tool_calls:
            assert c.type == "function" and c.id.startswith("call_") and c.function.name in SCHEMAS
            validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    else:
        assert choice.finish_reason in ("stop", "length") and not m.tool_calls and isinstance(m.content, str)


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "run_tests"}}])
def test_tool_requests_answer_with_calls_or_text(gateway, choice):
    r = _client(gateway).chat.completions.create(model="flywheel-coder", messages=MESSAGES, tools=TOOLS,
                                                 tool_choice=choice, max_completion_tokens=48, temperature=0, n=2)
    assert len(r.choices) == 2
    for c in r.choices:
        _holds(c)


def test_a_tool_message_round_trip_and_parallel_calls_off(gateway):
    msgs = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "app.py"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "def add(a, b):\n    return a - b\n"},
        {"role": "tool", "tool_call_id": "call_b", "content": "FAILED test_add: assert add(1, 2) == 3"}]
    r = _client(gateway).chat.completions.create(model="flywheel-coder", messages=msgs, tools=TOOLS,
                                                 parallel_tool_calls=False, max_completion_tokens=32, temperature=0.7)
    _holds(r.choices[0])
    assert len(r.choices[0].message.tool_calls or []) <= 1


def test_streamed_tool_requests_assemble_like_whole_ones(gateway):
    client = _client(gateway)
    kw = dict(model="flywheel-coder", messages=MESSAGES, tools=TOOLS, max_completion_tokens=48, temperature=0,
              tool_choice={"type": "function", "function": {"name": "read_file"}})
    whole = client.chat.completions.create(**kw).choices[0]
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for tcall in d.tool_calls or []:
            c = calls.setdefault(tcall.index, {"id": None, "name": "", "arguments": ""})
            c["id"] = tcall.id or c["id"]
            c["name"] += (tcall.function.name or "") if tcall.function else ""
            c["arguments"] += (tcall.function.arguments or "") if tcall.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == whole.finish_reason
    if finish == "tool_calls":
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
            [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
    else:
        assert not calls and content == whole.message.content


def test_tool_outcomes_are_counted(gateway):
    _client(gateway).chat.completions.create(model="flywheel-coder", messages=MESSAGES, tools=TOOLS,
                                             tool_choice="required", max_completion_tokens=24, temperature=0)
    status, body = get(f"{gateway.url}/metrics")
    assert status == 200
    counted = [line for line in body.splitlines() if line.startswith("flywheel_gateway_tool_calls_total{")]
    assert counted and sum(float(line.rsplit(" ", 1)[1]) for line in counted) >= 1


def test_a_multi_turn_session_is_linked_in_the_completion_events(gateway, kafka_bootstrap):
    import uuid

    from kafka import KafkaConsumer

    from flywheel import events as ev

    client = _client(gateway)
    first = client.chat.completions.create(model="flywheel-coder", messages=MESSAGES, max_completion_tokens=8)
    assert first.model_extra["session_id"] == first.id  # a first turn names the session
    turn2 = MESSAGES + [{"role": "assistant", "content": first.choices[0].message.content},
                        {"role": "user", "content": "Now run the tests."}]
    second = client.chat.completions.create(model="flywheel-coder", messages=turn2, max_completion_tokens=8,
                                            stream=True)
    second_id = [c.id for c in second][0]
    given = f"ide-session-{uuid.uuid4().hex[:8]}"
    third = client.chat.completions.create(model="flywheel-coder", messages=turn2, max_completion_tokens=8,
                                           extra_headers={"X-Session-Id": given})
    assert third.model_extra["session_id"] == given
    want = {first.id, second_id, third.id}
    c = KafkaConsumer(ev.TOPIC_COMPLETIONS, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                      enable_auto_commit=False, group_id=None, consumer_timeout_ms=5000)
    events = {}
    for r in c:
        e = ev.decode(r.value)
        if e.completion_id in want:
            events[e.completion_id] = e
    c.close()
    assert set(events) == want
    assert (events[first.id].session_id, events[first.id].parent_id) == (first.id, "")
    assert (events[second_id].session_id, events[second_id].parent_id) == (first.id, f"{first.id}:0")
    assert (events[third.id].session_id, events[third.id].parent_id) == (given, f"{first.id}:0")


def test_the_bootstrapped_model_calls_the_tools_its_corpus_taught(gateway):
    """The bootstrap corpus's agent episodes (online_rl.agent_episodes) teach the base model a tool language:
    served, it answers turns of a held-out episode with well-formed calls (greedy)."""
    from online_rl import agent_episodes as A
    from online_rl.tasks import tasks

    task = tasks("heldout")[0]
    msgs = [{"role": "user", "content": A.ASKS[0].format(p="app.py")}]
    read = {"id": "call_r", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "app.py"}'}}
    for history in ([], [{"role": "assistant", "content": None, "tool_calls": [read]},
                         {"role": "tool", "tool_call_id": "call_r", "content": task.prompt}]):
        r = _client(gateway).chat.completions.create(model="flywheel-coder", messages=msgs + history,
                                                     tools=A.openai_tools(), max_completion_tokens=96, temperature=0)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c.message.content
        call = c.message.tool_calls[0].function
        validate(json.loads(call.arguments), next(t["parameters"] for t in A.TOOLS if t["name"] == call.name))
