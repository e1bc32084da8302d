"""Agent sessions: a turn is linked to the completion that produced the previous one, by the tool call it
answers or by the conversation so far; the session id is the client's, else the first turn's."""
from serving.openai_api import Limits, parse_chat
from serving.sessions import Sessions

TOOLS = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object", "properties": {}}}}]


def msgs(*raw):
    return parse_chat({"model": "m", "messages": list(raw), "tools": TOOLS}, Limits()).messages


def test_turns_link_by_conversation_and_by_tool_call():
    s = Sessions()
    first = msgs({"role": "user", "content": "fix it"})
    link = s.link("t", first, None, "cmpl-1")
    assert (link.session_id, link.parent_id) == ("cmpl-1", "")
    s.record("t", first, {"role": "assistant", "content": "", "calls": [
        {"id": "call_a", "name": "run_tests", "arguments": "{}"}]}, "cmpl-1:0", link.session_id)
    # turn 2 answers the call: linked by its id (whatever the client does to the assistant message)
    second = msgs({"role": "user", "content": "fix it"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_a", "type": "function", "function": {"name": "run_tests", "arguments": "{ }"}}]},
                  {"role": "tool", "tool_call_id": "call_a", "content": "1 failed"})
    link2 = s.link("t", second, None, "cmpl-2")
    assert (link2.session_id, link2.parent_id) == ("cmpl-1", "cmpl-1:0")
    s.record("t", second, {"role": "assistant", "content": "Done.", "calls": []}, "cmpl-2:0", link2.session_id)
    # turn 3: plain text, linked by the conversation so far (arguments compared as JSON, not as text)
    third = msgs(*[{"role": "user", "content": "fix it"},
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"id": "call_a", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "call_a", "content": "1 failed"},
                   {"role": "assistant", "content": "Done."}, {"role": "user", "content": "thanks"}])
    assert s.link("t", third, None, "cmpl-3").parent_id == "cmpl-2:0"
    assert s.link("other-tenant", third, None, "cmpl-4").parent_id == ""  # never across tenants
    assert s.link("t", third, "client-session", "cmpl-5").session_id == "client-session"
    edited = msgs({"role": "user", "content": "fix it"}, {"role": "assistant", "content": "something else"},
                  {"role": "user", "content": "thanks"})
    assert s.link("t", edited, None, "cmpl-6").parent_id == ""


def test_memory_is_bounded():
    s = Sessions(max_entries=3)
    for i in range(10):
        s.record("t", msgs({"role": "user", "content": f"q{i}"}), {"role": "assistant", "content": "a", "calls": []},
                 f"c{i}:0", f"c{i}")
    assert len(s._turns) == 3
    late = msgs({"role": "user", "content": "q9"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "x"})
    assert s.link("t", late, None, "n").parent_id == "c9:0"
