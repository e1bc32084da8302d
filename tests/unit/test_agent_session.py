"""The agent user's session logic on scripted answers (the gateway's JSON as it sends it); the sessions
against a real gateway run in tests/integration (load test, demo parts)."""

import json
import random

from flywheel.agent_session import PATHS, Repository, run_session
from online_rl import tasks

TASK = tasks.tasks("heldout")[0]


def judge(task, code):  # one test: the file is the reference implementation
    return int(code == task.prompt + task.reference), 1


def answer(i, calls=None, text=None):
    msg = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [
            {"id": f"call_{i}_{k}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for k, (n, a) in enumerate(calls)
        ]
    return {
        "id": f"cmpl-{i}",
        "session_id": "cmpl-0",
        "model_version": 3,
        "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop"}],
    }


def scripted(answers):
    seen = []

    def chat(messages):
        seen.append([dict(m) for m in messages])
        return answers[len(seen) - 1]

    return chat, seen


def test_a_session_that_writes_passing_code_is_kept():
    rng = random.Random(0)
    path = random.Random(0).choice(PATHS)  # the file the session will ask about (its first draw)
    good = TASK.prompt + TASK.reference
    chat, seen = scripted(
        [
            answer(0, [("read_file", {"path": path})]),
            answer(1, [("write_file", {"path": path, "content": good})]),
            answer(2, [("run_tests", {"path": path})]),
            answer(3, text="Done: the tests pass."),
        ]
    )
    res = run_session(chat, TASK, rng, judge)
    assert (res.outcome, res.turns, res.calls, res.text_answers) == ("accept", 4, 3, 1)
    assert res.session_id == "cmpl-0" and res.versions == [3, 3, 3, 3] and res.completion_ids[0] == "cmpl-0"
    tool_results = [m["content"] for m in seen[-1] if m["role"] == "tool"]
    assert tool_results == [TASK.prompt, "ok", "1 passed"]  # what the environment answered each call
    assert all(m["tool_call_id"].startswith("call_") for m in seen[-1] if m["role"] == "tool")


def test_a_session_ending_in_text_or_bad_code_is_rejected():
    chat, _ = scripted([answer(0, text="def f(): pass")])
    res = run_session(chat, TASK, random.Random(1), judge)
    assert (res.outcome, res.turns, res.calls) == ("reject", 1, 0)
    chat, seen = scripted([answer(i, [("write_file", {"path": "x.py", "content": "wrong"})]) for i in range(9)])
    res = run_session(chat, TASK, random.Random(2), judge, max_turns=3)
    assert (res.outcome, res.turns) == ("reject", 3)  # bounded; the file it was asked about never changed


def test_the_repository_answers_every_call():
    repo = Repository(TASK, "app.py", judge)
    assert repo.call("read_file", '{"path": "nope.py"}').startswith("error: no such file")
    assert repo.call("read_file", "not json").startswith("error")
    assert repo.call("write_file", '{"path": "app.py"}').startswith("error")
    assert repo.call("delete_file", '{"path": "app.py"}') == "error: unknown tool delete_file"
    assert repo.call("run_tests", '{"path": "app.py"}') == "1 failed, 0 passed" and not repo.kept()
    assert repo.call("write_file", json.dumps({"path": "app.py", "content": TASK.prompt + TASK.reference})) == "ok"
    assert repo.call("run_tests", '{"path": "app.py"}') == "1 passed" and repo.kept()
