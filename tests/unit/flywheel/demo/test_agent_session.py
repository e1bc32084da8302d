"""The agent user's session logic on scripted answers (the gateway's JSON as it sends it); the sessions
against a real gateway run in tests/integration (load test, demo parts)."""

import json
import random

from flywheel.demo.agent_session import PATHS, Repository, run_session
from online_rl.tasks import synthetic as tasks
from tests.scripted_agent import answer, scripted

TASK = tasks.tasks("heldout")[0]


def judge(task, code):  # one test: the file is the reference implementation
    return int(code == task.prompt + task.reference), 1


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


def test_a_user_who_reacts_records_the_truth_of_every_turn():
    from flywheel.demo.agent_session import UserModel

    rng = random.Random(0)
    path = random.Random(0).choice(PATHS)
    wrong = TASK.prompt + "    return 0\n"
    chat, seen = scripted(
        [
            answer(0, [("read_file", {"path": path})]),
            answer(1, [("write_file", {"path": path, "content": wrong})]),
            answer(2, [("run_tests", {"path": path})]),
            answer(3, text="Done: the tests pass."),
            answer(4, text="Sorry."),
        ]
    )
    always = UserModel(correct_if_bad=1.0, abandon=0.0, abandon_after_failure=0.0, max_turns=5)
    res = run_session(chat, TASK, rng, judge, user=always)
    assert res.reactions == ["correct", "correct"] and res.turns == 5
    assert res.truth == {f"cmpl-{i}": False for i in range(5)} and res.writes == ["cmpl-1"]
    from flywheel.demo.agent_session import CORRECTIONS

    assert seen[4][-1]["role"] == "user" and seen[4][-1]["content"] in CORRECTIONS  # the correction was sent
    walks = UserModel(abandon=1.0)
    chat, seen = scripted([answer(0, [("read_file", {"path": path})])])
    res = run_session(chat, TASK, random.Random(0), judge, user=walks)
    assert res.abandoned and res.turns == 1 and len(seen) == 1  # the tool result never went back


def test_the_messages_transport_speaks_the_messages_api():
    from flywheel.demo.agent_session import from_anthropic, messages_transport, to_anthropic

    convo = [
        {"role": "user", "content": "Fix app.py."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "app.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "def f(): pass"},
    ]
    sent = to_anthropic(convo)
    assert sent[1]["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "app.py"}}
    ]
    assert sent[2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "def f(): pass"}],
    }
    reply = {
        "id": "msg_cmpl-1",
        "content": [{"type": "text", "text": "Done."}],
        "stop_reason": "end_turn",
        "model_version": 2,
    }
    got = {}
    chat = messages_transport(lambda **body: got.update(body) or reply, 0.5, 64)
    out = chat(convo)
    assert out == from_anthropic(reply) and out["choices"][0]["finish_reason"] == "stop"
    assert got["extra_body"] == {"temperature": 0.5} and got["tools"][0]["name"] == "read_file"


def test_signal_quality_scores_against_the_truth():
    from flywheel.demo.signal_quality import SessionTruth, score

    sessions = [
        SessionTruth(["msg_a", "msg_b", "msg_c"], {"msg_a": False, "msg_b": False, "msg_c": False}, ["msg_b"]),
        SessionTruth(["d", "e"], {"d": True, "e": True}, ["d"], abandoned=True),
    ]
    named = [("tests_fail", "b"), ("correction", "c"), ("correction", "e"), ("abandoned", "e"), ("tests_pass", "d")]
    s = score(sessions, named)["signals"]
    assert s["tests_fail"] == {"named": 1, "precision": 1.0, "recall": 1.0}
    assert s["correction"] == {"named": 2, "precision": 0.5, "recall": 0.5}  # a and c were bad answers; e was not bad
    assert s["abandoned"]["precision"] == 0.0 and s["abandoned"]["recall"] == 1.0
    assert s["tests_pass"] == {"named": 1, "precision": 1.0, "recall": 1.0}
