"""Verdicts read from agent sessions whose clients send no feedback (serving.signals.implicit): the detector
on conversations as clients send them, the gateway logging them as feedback events on the turns they judge
(a Messages API session over scripted stand-in replicas: Claude Code's Bash), and the trainer's join giving
each its own reward."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from contracts import events as ev
from online_rl.config import RewardTable
from online_rl.data.join import Joiner
from serving.signals.implicit import ImplicitSignals
from tests.fake_engine import gateway_over_fakes
from tests.unit.serving.tenants.test_tenant_admin import spooled

pytestmark = pytest.mark.timeout(120)


def call(cid: str, name: str, **args) -> dict:
    return {"id": cid, "name": name, "arguments": json.dumps(args)}


def msgs(*items) -> list[dict]:
    out = []
    for role, text, *rest in items:
        m = {"role": role, "content": text}
        if role == "assistant":
            m["calls"] = rest[0] if rest else []
        if role == "tool":
            m["tool_call_id"] = rest[0]
        out.append(m)
    return out


def test_tests_after_an_edit_judge_the_edit_and_the_user_judges_the_answer():
    d = ImplicitSignals()
    ask = ("user", "Fix app.py so that python3 test_app.py passes.")
    write = call("c2", "Bash", command="cat > app.py << 'EOF'\ndef f(x):\n    return x\nEOF")
    run = call("c3", "Bash", command="python3 test_app.py")
    assert d.answered("t", "s", "cmpl-1:0", [call("c1", "Bash", command="cat app.py")]) == []
    conv = msgs(ask, ("assistant", "", [write]), ("tool", "def f(x):\n", "c1"))
    assert d.observe("t", "s", "cmpl-1:0", conv) == []
    d.answered("t", "s", "cmpl-2:0", [write])
    d.observe("t", "s", "cmpl-2:0", conv + msgs(("tool", "(No output)", "c2")))
    d.answered("t", "s", "cmpl-3:0", [run])
    seen = d.observe("t", "s", "cmpl-3:0", conv + msgs(("tool", "4 failed, 6 passed\n", "c3")))
    assert [(x.name, x.completion_id) for x in seen] == [("tests_fail", "cmpl-2")]
    d.answered("t", "s", "cmpl-4:0", [])  # "Done: the tests pass." (they do not)
    seen = d.observe("t", "s", "cmpl-4:0", msgs(ask, ("assistant", "Done."), ("user", "No, the tests still fail.")))
    assert [(x.name, x.completion_id) for x in seen] == [("correction", "cmpl-4")]
    d.answered("t", "s", "cmpl-5:0", [])
    seen = d.observe(
        "t", "s", "cmpl-5:0", msgs(ask, ("assistant", "Done."), ("user", "fix app.py so python3 test_app.py passes"))
    )
    assert [x.name for x in seen] == ["repeat"]
    d.answered("t", "s", "cmpl-6:0", [])
    seen = d.observe("t", "s", "cmpl-6:0", msgs(ask, ("assistant", "Done."), ("user", "Thanks! Now add a docstring.")))
    assert seen == []  # a new request: no verdict


def test_passes_reverts_codex_output_and_abandonment():
    d = ImplicitSignals(abandon_after_s=60)
    edit = call("w", "exec_command", cmd="sed -i 's/x/y/' app.py")
    d.answered("t", "s", "a:0", [edit])
    d.answered("t", "s", "b:0", [call("r", "exec_command", cmd="python3 -m pytest -q")])
    out = "Chunk ID: 1a2b3c\nWall time: 0.2 seconds\nProcess exited with code 0\nOutput:\n10 passed in 0.01s\n"
    assert [
        x.name for x in d.observe("t", "s", "b:0", msgs(("user", "go"), ("assistant", ""), ("tool", out, "r")))
    ] == ["tests_pass"]
    undo = d.answered("t", "s", "c:0", [call("g", "exec_command", cmd="git checkout -- app.py")])
    assert [(x.name, x.completion_id) for x in undo] == [("revert", "a")]
    # a read, then the same content written back: a revert too (files tools)
    d.answered("t", "s2", "r:0", [call("1", "read_file", path="a.py")])
    d.observe("t", "s2", "r:0", msgs(("user", "go"), ("assistant", ""), ("tool", "old = 1\n", "1")))
    d.answered("t", "s2", "w:0", [call("2", "write_file", path="a.py", content="new = 2\n")])
    back = d.answered("t", "s2", "u:0", [call("3", "write_file", path="a.py", content="old = 1\n")])
    assert [(x.name, x.completion_id) for x in back] == [("revert", "w")]
    # s asked for tool results (c:0's git checkout) that never came: abandoned; s2 too; a finished session is not
    d.answered("t", "done", "z:0", [])
    gone = d.sweep_keyed(now=10**12)
    assert sorted((k[1], x.name, x.completion_id) for k, x in gone) == [
        ("s", "abandoned", "c"),
        ("s2", "abandoned", "u"),
    ]


def test_the_gateway_logs_verdicts_as_feedback_on_the_turns_they_judge(test_model, tmp_path):
    bash = {"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
    H = {"x-api-key": "key-u0", "anthropic-version": "2023-06-01"}

    def use(command: str) -> str:
        return '<tool_call>\n{"name": "Bash", "arguments": {"command": ' + json.dumps(command) + "}}\n</tool_call>"

    async def scenario(client, fakes):
        fakes[0].texts = [use("cat > app.py << 'EOF'\nx = 1\nEOF"), use("python3 test_app.py"), "Done.", "ok"]
        conv = [{"role": "user", "content": "Fix app.py"}]
        ids = []
        for result in ("", "2 failed, 8 passed", None, None):
            r = await client.post(
                "/v1/messages", json={"model": "m", "max_tokens": 64, "messages": conv, "tools": [bash]}, headers=H
            )
            body = await r.json()
            assert r.status == 200, body
            ids.append(body["id"].removeprefix("msg_"))
            conv.append({"role": "assistant", "content": body["content"]})
            if result is not None:
                use_id = body["content"][0]["id"]
                conv.append(
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_id, "content": result}]}
                )
            else:
                conv.append({"role": "user", "content": "That's wrong, the tests still fail."})
        metrics = await (await client.get("/metrics")).text()
        return ids, metrics

    async def main():
        async with gateway_over_fakes(test_model, tmp_path / "gw", [5], log_events=True) as (client, fakes):
            return await scenario(client, fakes)

    ids, metrics = asyncio.run(main())
    await_spool = [e for _, _, e, _ in spooled(tmp_path / "gw") if isinstance(e, ev.FeedbackEvent)]
    got = [(e.kind, e.signal, e.completion_id) for e in await_spool]
    assert got == [("implicit", "tests_fail", ids[0]), ("implicit", "correction", ids[2])]
    assert 'flywheel_gateway_implicit_signals_total{signal="tests_fail"} 1.0' in metrics
    assert 'flywheel_gateway_version_feedback_total{kind="implicit_correction",version="5"} 1.0' in metrics


def _completion(cid: str, ts: float, session: str = "") -> ev.CompletionEvent:
    return ev.CompletionEvent(
        completion_id=cid,
        choice_index=0,
        tenant="t",
        model_version=1,
        prompt_ids=np.array([1, 2], np.int32),
        output_ids=np.array([3], np.int32),
        logprobs=np.array([-0.5], np.float32),
        routed_experts=np.zeros((2, 2, 2), np.uint8),
        sampling={"tools": 1},
        finish_reason="stop",
        latency={},
        session_id=session,
        parent_id="",
        ts=ts,
    )


def test_the_trainer_rewards_each_signal_by_its_own_weight():
    table = RewardTable()
    j = Joiner(rewards=table)
    samples = []
    for i, name in enumerate(ev.SIGNALS):
        samples += j.add(_completion(f"cmpl-{i}", 100.0 + i, session=f"s{i}"))
        fb = ev.FeedbackEvent(completion_id=f"cmpl-{i}", choice_index=0, tenant="t", kind="implicit", signal=name)
        samples += j.add(ev.decode(fb.encode()))
    assert [s.reward for s in samples] == [table.signals[n] for n in ev.SIGNALS]
    assert all(getattr(j.stats, f"implicit_{n}") == 1 for n in ev.SIGNALS)
    with pytest.raises(ev.SchemaError):  # a client cannot name a signal on another kind, nor invent one
        ev.decode(
            ev.FeedbackEvent(completion_id="c", choice_index=0, tenant="t", kind="accept", signal="revert").encode()
        )
    with pytest.raises(ev.SchemaError):
        ev.decode(
            ev.FeedbackEvent(completion_id="c", choice_index=0, tenant="t", kind="implicit", signal="vibes").encode()
        )


def test_the_signals_precision_and_recall_against_a_simulated_population():
    """The benchmark's short version (benchmarks/implicit_signals.py, 300 sessions in `make bench`): agent users
    who know the truth, over the Messages API, against a scripted policy; every signal is named, and the ones a
    test run carries are right."""
    from benchmarks.implicit_signals import measure

    r = measure(40, seed=1)
    s = r["signals"]
    assert r["sessions"] == 40 and r["bad_turns"] > 0
    assert s["tests_pass"]["precision"] == 1.0 and s["tests_fail"]["precision"] == 1.0
    assert s["tests_pass"]["recall"] > 0.7 and s["tests_fail"]["recall"] > 0.7
    assert s["correction"]["named"] > 0 and s["correction"]["precision"] >= 0.6
    assert s["abandoned"]["named"] > 0 and s["abandoned"]["recall"] == 1.0
    assert s["any_negative"]["precision"] >= 0.8


def test_a_retried_turn_names_each_verdict_once_and_a_clients_reminders_are_not_the_users_words():
    import time as _time

    d = ImplicitSignals()
    write = call("w", "Bash", command="cat > a.py << 'EOF'\nx = 1\nEOF")
    d.answered("t", "s", "e:0", [write])
    d.answered("t", "s", "r:0", [call("x", "Bash", command="pytest -q")])
    conv = msgs(("user", "fix a.py"), ("assistant", ""), ("tool", "1 failed", "x"))
    assert [x.name for x in d.observe("t", "s", "r:0", conv)] == ["tests_fail"]
    assert d.observe("t", "s", "r:0", conv) == []  # the same request again (the first failed at a replica)
    d.answered("t", "s", "f:0", [])
    reminder = (
        "<system-reminder>The file was modified by the user; this change was intentional, so make sure to take it "
        "into account (don't revert it unless the user asks you to).</system-reminder>\nthanks, now add a docstring"
    )
    assert d.observe("t", "s", "f:0", msgs(("user", "fix a.py"), ("assistant", "Done."), ("user", reminder))) == []
    # a message built to make a regex backtrack costs what any message does (its head and tail are read)
    bomb = ("<ab>" + " " * 12) * 7185
    d.answered("t", "s", "g:0", [])
    t0 = _time.monotonic()
    d.observe("t", "s", "g:0", msgs(("user", bomb), ("assistant", "ok"), ("user", bomb)))
    assert _time.monotonic() - t0 < 0.5


def test_the_join_takes_an_implicit_verdict_that_came_first_and_keeps_it_across_a_checkpoint():
    j = Joiner(rewards=RewardTable())
    fb = ev.FeedbackEvent(completion_id="cmpl-9", choice_index=0, tenant="t", kind="implicit", signal="revert", ts=50.0)
    assert j.add(ev.decode(fb.encode())) == []  # before its completion (another partition): it waits
    restored = Joiner(rewards=RewardTable())
    restored.load_state(j.state())
    samples = restored.add(_completion("cmpl-9", 51.0, session="s9"))
    assert [(s.key, s.reward) for s in samples] == [("cmpl-9:0", RewardTable().signals["revert"])]
    assert restored.stats.implicit_revert == 1
