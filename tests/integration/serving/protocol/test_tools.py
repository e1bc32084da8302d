"""Agent-mode requests through the gateway and a real SGLang replica, with the official `openai` client:
tools, forced and parallel calls, a tool-message round trip, streaming. The tiny model's calls may be
wrong; the protocol must hold either way: valid calls come back as tool_calls (finish "tool_calls"),
anything else as text (finish "stop"/"length"), counted, never a 4xx/5xx."""

from __future__ import annotations

import json

import openai
import pytest
from jsonschema import validate

from infra.kafka_admin import records_to_end
from tests.helpers import events_until, get

pytestmark = pytest.mark.timeout(300)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the test suite",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "The tests fail in app.py; find out why."},
]


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
    r = _client(gateway).chat.completions.create(
        model="flywheel-coder",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=choice,
        max_completion_tokens=48,
        temperature=0,
        n=2,
    )
    assert len(r.choices) == 2
    for c in r.choices:
        _holds(c)


def test_a_tool_message_round_trip_and_parallel_calls_off(gateway):
    msgs = MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "app.py"}'},
                },
                {"id": "call_b", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "def add(a, b):\n    return a - b\n"},
        {"role": "tool", "tool_call_id": "call_b", "content": "FAILED test_add: assert add(1, 2) == 3"},
    ]
    r = _client(gateway).chat.completions.create(
        model="flywheel-coder",
        messages=msgs,
        tools=TOOLS,
        parallel_tool_calls=False,
        max_completion_tokens=32,
        temperature=0.7,
    )
    _holds(r.choices[0])
    assert len(r.choices[0].message.tool_calls or []) <= 1


def test_streamed_tool_requests_assemble_like_whole_ones(gateway):
    client = _client(gateway)
    kw = dict(
        model="flywheel-coder",
        messages=MESSAGES,
        tools=TOOLS,
        max_completion_tokens=48,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "read_file"}},
    )
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
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
            (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls
        ]
    else:
        assert not calls and content == whole.message.content


def test_tool_outcomes_are_counted(gateway):
    _client(gateway).chat.completions.create(
        model="flywheel-coder",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        max_completion_tokens=24,
        temperature=0,
    )
    status, body = get(f"{gateway.url}/metrics")
    assert status == 200
    counted = [line for line in body.splitlines() if line.startswith("flywheel_gateway_tool_calls_total{")]
    assert counted and sum(float(line.rsplit(" ", 1)[1]) for line in counted) >= 1


def _tool_series(gateway) -> dict[tuple, float]:
    from prometheus_client.parser import text_string_to_metric_families

    status, body = get(f"{gateway.url}/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
        if s.name.startswith("flywheel_gateway_tool_calls")
    }


def test_a_malformed_call_is_counted_with_the_version_that_wrote_it(gateway):
    """A named function opens the call for the model; one token cannot close it: malformed, every time."""
    from tests.helpers import GATEWAY_ADMIN

    before = _tool_series(gateway)
    r = _client(gateway).chat.completions.create(
        model="flywheel-coder",
        messages=MESSAGES,
        tools=TOOLS,
        max_completion_tokens=1,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "read_file"}},
    )
    c = r.choices[0]
    assert c.finish_reason in ("length", "stop") and not c.message.tool_calls
    assert c.message.content.startswith('<tool_call>\n{"name": "read_file", "arguments": ')
    version = str(r.model_extra["model_version"])  # the replica says its version (0: the base model)
    key = ("flywheel_gateway_tool_calls_total", (("outcome", "malformed"), ("version", version)))
    after = _tool_series(gateway)
    assert after[key] == before.get(key, 0.0) + 1
    assert all(dict(labels).get("version") for _, labels in after)  # every tool series carries its version
    status, body = get(f"{gateway.url}/admin/weights", key=GATEWAY_ADMIN)
    figures = json.loads(body)["tool_calls"][version]
    assert status == 200 and figures["malformed"] >= 1 and 0 < figures["malformed_rate"] <= 1


def test_a_multi_turn_session_is_linked_in_the_completion_events(gateway, kafka_bootstrap):
    import uuid

    from contracts import events as ev

    client = _client(gateway)
    first = client.chat.completions.create(model="flywheel-coder", messages=MESSAGES, max_completion_tokens=8)
    assert first.model_extra["session_id"] == first.id  # a first turn names the session
    turn2 = MESSAGES + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Now run the tests."},
    ]
    second = client.chat.completions.create(
        model="flywheel-coder", messages=turn2, max_completion_tokens=8, stream=True
    )
    second_id = [c.id for c in second][0]
    given = f"ide-session-{uuid.uuid4().hex[:8]}"
    third = client.chat.completions.create(
        model="flywheel-coder", messages=turn2, max_completion_tokens=8, extra_headers={"X-Session-Id": given}
    )
    assert third.model_extra["session_id"] == given
    want = {first.id, second_id, third.id}
    logged = events_until(kafka_bootstrap, ev.TOPIC_COMPLETIONS, lambda es: want <= {e.completion_id for e in es})
    events = {e.completion_id: e for e in logged if e.completion_id in want}
    assert set(events) == want
    assert (events[first.id].session_id, events[first.id].parent_id) == (first.id, "")
    assert (events[second_id].session_id, events[second_id].parent_id) == (first.id, f"{first.id}:0")
    assert (events[third.id].session_id, events[third.id].parent_id) == (given, f"{first.id}:0")


def test_an_agent_session_is_joined_and_trained_with_tool_results_masked(gateway, kafka_bootstrap, test_model):
    """Three turns of one session (read a file, run the tests, answer), its outcome as session feedback:
    the Joiner makes one sample per turn carrying the outcome, each turn's prompt holds the tool results,
    and the loss mask leaves every tool-result token out; one update trains on them."""
    import uuid

    import numpy as np
    import torch
    from tokenizers import Tokenizer

    from contracts import events as ev
    from online_rl.config import LossConfig, OptimConfig
    from online_rl.data.join import Joiner
    from online_rl.model.transformer import load_pretrained
    from online_rl.trainer.loss import make_batch
    from online_rl.trainer.update import make_optimizer, update
    from tests.helpers import post

    client, sid = _client(gateway), f"agent-{uuid.uuid4().hex[:8]}"
    results = {"call_r1": "RESULT-ONE def add(a, b): return a - b", "call_t1": "RESULT-TWO FAILED test_add"}
    msgs, cids = list(MESSAGES), []
    for call_id, name, args in [
        ("call_r1", "read_file", '{"path": "app.py"}'),
        ("call_t1", "run_tests", "{}"),
        (None, None, None),
    ]:
        r = client.chat.completions.create(
            model="flywheel-coder",
            messages=msgs,
            tools=TOOLS,
            temperature=0,
            max_completion_tokens=24,
            extra_headers={"X-Session-Id": sid},
        )
        assert r.model_extra["session_id"] == sid
        cids.append(r.id)
        if name is None:
            break
        # The agent's next request carries a call and its result (written here: the tiny model's own call
        # may be malformed, and the protocol lets a client send any well-formed history).
        msgs += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}],
            },
            {"role": "tool", "tool_call_id": call_id, "content": results[call_id]},
        ]
    status, body, _ = post(f"{gateway.url}/v1/feedback", {"session_id": sid, "kind": "accept"}, key="key-alice")
    assert status == 200 and body["session_id"] == sid

    def read(topic, keep, count):  # once `count` are there, all there are (a surplus would show)
        events_until(kafka_bootstrap, topic, lambda es: sum(map(keep, es)) >= count)
        return [e for e in (ev.decode(r.value) for r in records_to_end(kafka_bootstrap, topic)) if keep(e)]

    turns = read(ev.TOPIC_COMPLETIONS, lambda e: e.completion_id in cids, len(cids))
    outcome = read(ev.TOPIC_FEEDBACK, lambda e: e.session_id == sid, 1)
    assert sorted(e.completion_id for e in turns) == sorted(cids) and len(outcome) == 1
    assert all(e.session_id == sid for e in turns)
    j = Joiner()
    for e in turns:
        assert j.add(e) == []
    samples = j.add(outcome[0])
    assert [s.key for s in samples] == [f"{c}:0" for c in cids] and all(s.reward == 0.75 for s in samples)

    tok = Tokenizer.from_file(str(test_model / "tokenizer.json"))
    batch = make_batch(samples, np.zeros(len(samples)))
    for b, s in enumerate(samples):
        p, n = s.prompt_ids.size, s.output_ids.size
        # Where each tool result's tokens sit in the prompt: decode token by token, match characters.
        ends = np.cumsum([len(tok.decode([int(t)], skip_special_tokens=False)) for t in s.prompt_ids])
        text = tok.decode([int(t) for t in s.prompt_ids], skip_special_tokens=False)
        spans = [(text.index(r), text.index(r) + len(r)) for r in list(results.values())[:b]]
        assert len(spans) == b  # turn b's prompt holds the b results before it
        for lo, hi in spans:
            first, last = int(np.searchsorted(ends, lo, side="right")), int(np.searchsorted(ends, hi - 1, side="right"))
            assert 0 < first < last < p
            # token i of the sequence is the target at position i - 1: none of a result's tokens is scored
            assert batch.mask[b, first - 1 : last].sum() == 0
        assert batch.mask[b].sum() == n and batch.mask[b, p - 1 : p - 1 + n].all()  # exactly the turn's output

    model = load_pretrained(test_model, torch.float32)
    before = [t.detach().clone() for t in model.parameters()]
    from online_rl.trainer.loss import advantages

    adv, _ = advantages(samples, LossConfig(), baseline=0.0)
    m = update(
        model,
        None,
        make_optimizer(model, OptimConfig(lr=1e-3)),
        samples,
        adv,
        LossConfig(kl_coef=0.0),
        OptimConfig(lr=1e-3),
    )
    assert m["tokens"] == sum(s.n_tokens for s in samples) and 0 < m["grad_norm"] < float("inf")
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_bootstrapped_model_calls_the_tools_its_corpus_taught(gateway):
    """The bootstrap corpus's agent episodes (online_rl.tasks.agent_episodes) teach the base model a tool language:
    served, it answers turns of a held-out episode with well-formed calls (greedy)."""
    from online_rl.tasks import agent_episodes as A
    from online_rl.tasks.synthetic import tasks

    task = tasks("heldout")[0]
    msgs = [{"role": "user", "content": A.ASKS[0].format(p="app.py")}]
    read = {"id": "call_r", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "app.py"}'}}
    for history in (
        [],
        [
            {"role": "assistant", "content": None, "tool_calls": [read]},
            {"role": "tool", "tool_call_id": "call_r", "content": task.prompt},
        ],
    ):
        r = _client(gateway).chat.completions.create(
            model="flywheel-coder",
            messages=msgs + history,
            tools=A.openai_tools(),
            max_completion_tokens=96,
            temperature=0,
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c.message.content
        call = c.message.tool_calls[0].function
        validate(json.loads(call.arguments), next(t["parameters"] for t in A.TOOLS if t["name"] == call.name))
