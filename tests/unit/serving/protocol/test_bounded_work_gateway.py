"""Bounded work through a gateway (over fake engines, tests.fake_engine): a call the model wrote whose check runs
long never holds the event loop that every tenant, /health and /admin share, and bodies built to overflow recursion
are 400s, never 500s. (The bounds themselves, request by request: tests/unit/serving/protocol/test_bounded_work.py.)"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request

import pytest

from serving.protocol import tool_calls as tc
from serving.protocol.openai import Limits
from tests.fake_engine import gateway_over_fakes
from tests.unit.serving.protocol.test_bounded_work import SLOW, SLOW_CALL, USER, tool


def _probe(url: str, stop: threading.Event, seen: list) -> None:
    """GET /health over and over from outside the gateway's event loop: (sent, answered) of each."""
    while not stop.is_set():
        t = time.monotonic()
        try:
            urllib.request.urlopen(url + "/health", timeout=60).read()
        except OSError as e:  # a 503 (no replica marked healthy yet) is an answer too
            if not hasattr(e, "code"):
                continue
        seen.append((t, time.monotonic()))
        time.sleep(0.02)


@pytest.mark.timeout(180)
def test_health_and_other_tenants_are_answered_while_a_hostile_call_is_checked(test_model, tmp_path):
    """The model writes a call whose check runs long (SLOW_CALL): /health and another tenant's completion are
    answered while it is checked, and the hostile request ends as text within its deadline."""
    hostile_body = {
        "model": "flywheel-coder",
        "messages": USER,
        "tools": [tool(SLOW)],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "max_tokens": 64,
    }

    limits = Limits()
    limits.tool_call_timeout_s = 3.0  # a long window to answer in (set so: the test also runs on code without it)

    async def main():
        async with gateway_over_fakes(test_model, tmp_path / "gw", [1], limits=limits) as (client, fakes):
            engine_answered: list[float] = []

            def script(ids):
                if not engine_answered:
                    engine_answered.append(time.monotonic())
                    return SLOW_CALL[len(tc.CALL_OPEN) + 1 :].split('"arguments": ', 1)[1]  # after the prefill
                return "x = 1"

            fakes[0].script = script
            url = str(client.make_url("")).rstrip("/")
            stop, seen = threading.Event(), []
            prober = threading.Thread(target=_probe, args=(url, stop, seen), daemon=True)
            prober.start()
            hostile = asyncio.ensure_future(
                client.post("/v1/chat/completions", json=hostile_body, headers={"Authorization": "Bearer key-u0"})
            )
            while not engine_answered:
                await asyncio.sleep(0.01)
            normal_done: list[float] = []

            def normal():
                body = json.dumps({"model": "flywheel-coder", "messages": USER, "max_tokens": 8}).encode()
                req = urllib.request.Request(
                    url + "/v1/chat/completions",
                    body,
                    {"Authorization": "Bearer key-u1", "Content-Type": "application/json"},
                )
                assert json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["message"]
                normal_done.append(time.monotonic())

            other = threading.Thread(target=normal, daemon=True)
            other.start()
            r = await hostile
            hostile_done = time.monotonic()
            answer = await r.json()
            await asyncio.get_running_loop().run_in_executor(None, other.join, 60)
            stop.set()
            await asyncio.get_running_loop().run_in_executor(None, prober.join, 60)
            return r.status, answer, engine_answered[0], hostile_done, normal_done, seen

    status, answer, t_engine, t_hostile, normal_done, seen = asyncio.run(main())
    during = [a for s, a in seen if t_engine < s and a < t_hostile]
    assert len(during) >= 5, f"/health answered {len(during)} times in the {t_hostile - t_engine:.1f} s checked"
    assert normal_done and normal_done[0] < t_hostile  # another tenant's request was not held behind it
    assert status == 200 and t_hostile - t_engine < 30, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]  # past its deadline: text


@pytest.mark.timeout(180)
def test_bodies_built_to_overflow_recursion_are_400s_never_500s(test_model, tmp_path):
    deep_args = "[" * 100_000 + "]" * 100_000  # a string: any depth passes the body's bound
    chat = {
        "model": "flywheel-coder",
        "max_tokens": 8,
        "messages": USER
        + [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep_args}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ],
    }
    messages = {
        "model": "flywheel-coder",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": "NESTED"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        ],
    }

    async def main():
        async with gateway_over_fakes(test_model, tmp_path / "gw", [1]) as (client, _):
            auth = {"Authorization": "Bearer key-u0"}
            a = await client.post("/v1/chat/completions", json=chat, headers=auth)
            # orjson reads up to 1024 levels; pydantic and Python's json overflow before that
            raw = json.dumps(messages).replace('"NESTED"', "[" * 1000 + "1" + "]" * 1000)
            headers = {**auth, "anthropic-version": "2023-06-01", "Content-Type": "application/json"}
            b = await client.post("/v1/messages", data=raw, headers=headers)
            return a.status, await a.text(), b.status, await b.json()

    sa, ta, sb, jb = asyncio.run(main())
    assert sa == 400 and "max_json_depth" in ta, ta
    assert sb == 400 and "max_json_depth" in jb["error"]["message"], jb
