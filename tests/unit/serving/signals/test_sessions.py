"""Agent sessions: a turn is linked to the completion that produced the previous one, by the tool call it
answers or by the conversation so far; the session id is the client's, else the first turn's."""

from serving.protocol.openai import Limits, parse_chat
from serving.signals.sessions import Sessions

TOOLS = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object", "properties": {}}}}]


def msgs(*raw):
    return parse_chat({"model": "m", "messages": list(raw), "tools": TOOLS}, Limits()).messages


def test_turns_link_by_conversation_and_by_tool_call():
    s = Sessions()
    first = msgs({"role": "user", "content": "fix it"})
    link = s.link("t", first, None, "cmpl-1")
    assert (link.session_id, link.parent_id) == ("cmpl-1", "")
    s.record(
        "t",
        first,
        {"role": "assistant", "content": "", "calls": [{"id": "call_a", "name": "run_tests", "arguments": "{}"}]},
        "cmpl-1:0",
        link.session_id,
    )
    # turn 2 answers the call: linked by its id (whatever the client does to the assistant message)
    second = msgs(
        {"role": "user", "content": "fix it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "run_tests", "arguments": "{ }"}}],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "1 failed"},
    )
    link2 = s.link("t", second, None, "cmpl-2")
    assert (link2.session_id, link2.parent_id) == ("cmpl-1", "cmpl-1:0")
    s.record("t", second, {"role": "assistant", "content": "Done.", "calls": []}, "cmpl-2:0", link2.session_id)
    # turn 3: plain text, linked by the conversation so far (arguments compared as JSON, not as text)
    third = msgs(
        *[
            {"role": "user", "content": "fix it"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "1 failed"},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "thanks"},
        ]
    )
    assert s.link("t", third, None, "cmpl-3").parent_id == "cmpl-2:0"
    assert s.link("other-tenant", third, None, "cmpl-4").parent_id == ""  # never across tenants
    assert s.link("t", third, "client-session", "cmpl-5").session_id == "client-session"
    edited = msgs(
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "something else"},
        {"role": "user", "content": "thanks"},
    )
    assert s.link("t", edited, None, "cmpl-6").parent_id == ""


def test_memory_is_bounded():
    s = Sessions(max_entries=3)
    for i in range(10):
        s.record(
            "t",
            msgs({"role": "user", "content": f"q{i}"}),
            {"role": "assistant", "content": "a", "calls": []},
            f"c{i}:0",
            f"c{i}",
        )
    assert len(s._turns) == 3
    late = msgs(
        {"role": "user", "content": "q9"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "x"}
    )
    assert s.link("t", late, None, "n").parent_id == "c9:0"


def calls(*pairs):
    return [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(pairs)
    ]


def test_a_call_identical_to_an_earlier_one_of_the_session_is_repeated():
    s = Sessions()
    read = ("read_file", '{"path": "a.py", "lines": [1, 2]}')
    assert s.repeated_calls("t", "sess", calls(read, ("run_tests", "{}")), "cmpl-1", 0) == 0
    # the other choices of the same request are alternatives, not earlier calls
    assert s.repeated_calls("t", "sess", calls(read), "cmpl-1", 1) == 0
    # a later turn: same name and arguments as JSON (key order, spacing) is a repeat; other arguments are not
    same = ("read_file", '{"lines":[1,2],  "path":"a.py"}')
    assert s.repeated_calls("t", "sess", calls(same, ("read_file", '{"path": "b.py"}')), "cmpl-2", 0) == 1
    assert s.repeated_calls("t", "sess", calls(("run_tests", "{}"), ("run_tests", "{}")), "cmpl-3", 0) == 2
    # twice within one answer: the second is a repeat
    assert s.repeated_calls("t", "new", calls(("run_tests", "{}"), ("run_tests", "{}")), "cmpl-4", 0) == 1
    # never across sessions or tenants
    assert s.repeated_calls("t", "other", calls(read), "cmpl-5", 0) == 0
    assert s.repeated_calls("u", "sess", calls(read), "cmpl-6", 0) == 0


def test_the_call_memory_is_bounded():
    s = Sessions(max_calls=3)
    for i in range(10):
        s.repeated_calls("t", "sess", calls(("read_file", f'{{"path": "{i}.py"}}')), f"c{i}", 0)
    assert len(s._calls) == 3
    assert s.repeated_calls("t", "sess", calls(("read_file", '{"path": "9.py"}')), "late", 0) == 1
    assert s.repeated_calls("t", "sess", calls(("read_file", '{"path": "0.py"}')), "late", 0) == 0  # forgotten
