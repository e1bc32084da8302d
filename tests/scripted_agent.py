"""What the agent session tests (tests/unit/flywheel/demo/test_agent_session*.py and
tests/integration/flywheel/demo/test_agent_session_mined.py) share: `answer`, a completion in the gateway's JSON as it
sends it (text or tool calls), and `scripted`, a chat function that replays a list of them and keeps the messages it
was sent each turn."""

from __future__ import annotations

import json
from collections.abc import Callable


def answer(i, calls=None, text=None, *, session_id: str = "cmpl-0", model_version: int = 3) -> dict:
    """Completion `cmpl-{i}`: the tool calls (name, arguments) in `calls`, or the text answer `text`."""
    msg: dict = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [
            {"id": f"call_{i}_{k}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for k, (n, a) in enumerate(calls)
        ]
    return {
        "id": f"cmpl-{i}",
        "session_id": session_id,
        "model_version": model_version,
        "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop"}],
    }


def scripted(answers: list[dict]) -> tuple[Callable[[list[dict]], dict], list[list[dict]]]:
    """A chat function answering its n-th call with answers[n], and the list of what each call was sent."""
    seen: list[list[dict]] = []

    def chat(messages):
        seen.append([dict(m) for m in messages])
        return answers[len(seen) - 1]

    return chat, seen
