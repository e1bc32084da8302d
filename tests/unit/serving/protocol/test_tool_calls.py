"""Function tools: request validation, the prompt format, and calls read back from answers (whole and
streamed). Any call the model gets wrong becomes text, counted, never an error."""

import json

import pytest

from serving.protocol import tool_calls as tc
from serving.protocol.openai import Limits, parse_chat
from serving.protocol.schema import ApiError

L = Limits()
READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file\nmore",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": False,
        },
    },
}
TESTS = {"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object", "properties": {}}}}
USER = [{"role": "user", "content": "fix the bug"}]


def chat(**kw):
    return parse_chat({"model": "m", "messages": USER, "tools": [READ, TESTS], **kw}, L)


def call(name, args):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def test_tools_render_as_signatures_and_choices_prefill_the_answer():
    s = chat()
    assert (
        s.prompt
        == "# tools: read_file(path: string)  # Read a file\n# tools: run_tests()\n# user: fix the bug\n<|assistant|>\n"
    )
    assert s.tools.choice == "auto" and s.prefill == ""
    assert chat(tool_choice="required").prompt.endswith("# user: fix the bug\n<|assistant|>\n<tool_call>\n")
    named = chat(tool_choice={"type": "function", "function": {"name": "run_tests"}})
    assert named.prefill == '<tool_call>\n{"name": "run_tests", "arguments": ' and named.prompt.endswith(named.prefill)
    none = chat(tool_choice="none")
    assert not none.tools.active and "# tools" not in none.prompt and none.prefill == ""


def test_a_tool_round_trip_renders_calls_and_results_in_the_qwen_format():
    msgs = USER + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "x = 1"}]},
    ]
    s = parse_chat({"model": "m", "messages": msgs, "tools": [READ]}, L)
    assert s.prompt.endswith(
        '# user: fix the bug\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n'
        "</tool_call>\n# tools: read_file(path: string)  # Read a file\n<tool_response>\nx = 1\n</tool_response>\n"
        "<|assistant|>\n"
    )


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        ({"tools": [READ, READ]}, "tools[1].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [READ], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [READ], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [READ], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"functions": [READ["function"]]}, "functions"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"metadata": {"k": 5}}, "metadata"),
        ({"frobnicate": True}, "frobnicate"),
        ({"messages": USER + [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]}, "messages[1].tool_call_id"),
        ({"messages": USER + [{"role": "tool", "content": "x"}]}, "messages[1].tool_call_id"),
        ({"messages": USER + [{"role": "assistant", "tool_calls": [{"id": "c"}]}]}, "messages[1].tool_calls[0]"),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}, "messages[0].tool_call_id"),
    ],
)
def test_bad_tool_requests_are_clear_400s(extra, param):
    with pytest.raises(ApiError) as e:
        parse_chat({"model": "m", "messages": USER, **extra}, L)
    assert e.value.status == 400 and e.value.param == param, e.value.message


def test_fields_real_clients_send_are_accepted():
    s = parse_chat(
        {
            "model": "m",
            "messages": USER,
            "store": False,
            "metadata": {"session": "abc"},
            "reasoning_effort": "low",
            "service_tier": "auto",
            "prompt_cache_key": "k",
            "safety_identifier": "u1",
            "verbosity": "low",
            "prompt_cache_retention": "in-memory",
            "modalities": ["text"],
            "audio": None,
            "max_completion_tokens": 9,
            "user": "u1",
            "presence_penalty": 0.5,
            "frequency_penalty": 0.25,
            "response_format": {"type": "text"},
            "parallel_tool_calls": True,
            "stream": True,
            "stream_options": {"include_usage": True, "include_obfuscation": False},
        },
        L,
    )
    assert (s.max_tokens, s.user, s.presence_penalty, s.frequency_penalty, s.include_usage) == (
        9,
        "u1",
        0.5,
        0.25,
        True,
    )


def test_a_well_formed_answer_becomes_tool_calls():
    spec = chat().tools
    p = tc.parse("Let me look.\n" + call("read_file", {"path": "a.py"}) + "\n" + call("run_tests", {}) + "\n", spec)
    assert p.outcome == "valid" and p.content == "Let me look.\n" and p.finish_reason == "tool_calls"
    assert [c["function"]["name"] for c in p.calls] == ["read_file", "run_tests"]
    assert json.loads(p.calls[0]["function"]["arguments"]) == {"path": "a.py"}
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in p.calls)
    assert len({c["id"] for c in p.calls}) == 2
    assert tc.parse(call("read_file", {"path": "a.py"}), spec).content is None
    one = tc.parse(call("read_file", {"path": "a.py"}) + call("run_tests", {}), chat(parallel_tool_calls=False).tools)
    assert one.outcome == "dropped_parallel" and len(one.calls) == 1
    # arguments written as a JSON string are read too
    s = tc.parse('<tool_call>\n{"name": "read_file", "arguments": "{\\"path\\": \\"b.py\\"}"}\n</tool_call>', spec)
    assert s.outcome == "valid" and json.loads(s.calls[0]["function"]["arguments"]) == {"path": "b.py"}


@pytest.mark.parametrize(
    "text, outcome",
    [
        ("<tool_call>\n{not json}\n</tool_call>", "malformed"),
        (call("read_file", {"path": 3}), "malformed"),  # fails the schema
        (call("read_file", {"path": "a", "mode": "w"}), "malformed"),  # additionalProperties: false
        (call("read_file", {}), "malformed"),  # required
        (call("delete_everything", {}), "unknown_tool"),
        ('<tool_call>\n{"name": "read_file", "arguments": {"path": "a', "malformed"),  # cut off
        (call("run_tests", {}) + "\nand then some prose", "malformed"),
        ('<tool_call>\n["read_file"]\n</tool_call>', "malformed"),
    ],
)
def test_a_call_the_model_gets_wrong_is_returned_as_text(text, outcome):
    p = tc.parse(text, chat().tools)
    assert p.outcome == outcome and p.calls == [] and p.content == text and p.finish_reason is None


def test_no_tools_or_tool_choice_none_reads_no_calls():
    text = call("read_file", {"path": "a.py"})
    assert tc.parse(text, chat(tool_choice="none").tools) == tc.Parsed(content=text)
    assert tc.parse("plain code", chat().tools) == tc.Parsed(content="plain code")


def test_a_forced_function_must_be_the_one_called():
    spec = chat(tool_choice={"type": "function", "function": {"name": "run_tests"}}).tools
    assert tc.parse(spec.opening() + "{}}\n</tool_call>", spec).outcome == "valid"
    assert tc.parse(call("read_file", {"path": "a"}), spec).outcome == "unknown_tool"


def test_streaming_lets_text_through_and_holds_what_may_be_a_call():
    split = tc.StreamSplitter(chat().tools)
    pieces = ["Let me ", "look.\n<to", 'ol_call>\n{"name": "run_tests", ', '"arguments": {}}\n</tool_call>']
    streamed = "".join(split.feed(p) for p in pieces)
    rest, parsed = split.finish()
    assert streamed == "Let me look.\n" and rest == "" and parsed.outcome == "valid"
    # text that only looks like the start of a tag is let through once it is not one
    split = tc.StreamSplitter(chat().tools)
    assert split.feed("a <to") == "a " and split.feed("p") == "<top" and split.finish() == ("", tc.Parsed("a <top"))
    # a malformed call comes out as text at the end
    split = tc.StreamSplitter(chat().tools)
    assert split.feed("x<tool_call>\n{oops") == "x"
    rest, parsed = split.finish()
    assert rest == "<tool_call>\n{oops" and parsed.outcome == "malformed"
    # a prefilled (forced) call holds everything
    spec = chat(tool_choice="required").tools
    split = tc.StreamSplitter(spec, spec.opening())
    assert split.feed('{"name": "run_tests", "arguments": {}}\n</tool_call>') == ""
    assert split.finish()[1].outcome == "valid"


DEEP: dict = {}
for _ in range(40):
    DEEP = {"not": DEEP}


@pytest.mark.parametrize(
    "params",
    [
        {"type": "object", "properties": {"p": {"$ref": "http://10.255.255.1/schema.json"}}},
        {"type": "object", "properties": {"p": {"$ref": "file:///dev/zero"}}},
        {"type": "object", "properties": {"p": {"$ref": "#/nowhere"}}},
        {"type": "object", "patternProperties": {"(a+)+$": {"type": "string"}}},
        {"type": "object", "properties": {"p": DEEP}},
    ],
)
def test_client_schemas_never_fetch_and_never_run_away(params):
    with pytest.raises(ApiError) as e:
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": params}}])
    assert e.value.status == 400 and e.value.param == "tools[0].function.parameters"


def test_a_pathological_pattern_fails_the_arguments_in_bounded_time():
    import time

    spec = chat(
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"p": {"type": "string", "pattern": "^(a+)+$"}}},
                },
            }
        ]
    ).tools
    t = time.monotonic()
    p = tc.parse(call("f", {"p": "a" * 40 + "!"}), spec)
    assert p.outcome == "malformed" and time.monotonic() - t < 2
    local = chat(
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "g",
                    "parameters": {
                        "$defs": {"path": {"type": "string"}},
                        "type": "object",
                        "properties": {"p": {"$ref": "#/$defs/path"}},
                    },
                },
            }
        ]
    ).tools
    assert tc.parse(call("g", {"p": "a.py"}), local).outcome == "valid"
    assert tc.parse(call("g", {"p": 3}), local).outcome == "malformed"


def test_a_named_function_is_one_call():
    spec = chat(tool_choice={"type": "function", "function": {"name": "run_tests"}}).tools
    p = tc.parse(call("run_tests", {}) + call("run_tests", {}), spec)
    assert spec.single and p.outcome == "dropped_parallel" and len(p.calls) == 1
