"""One agent session against the gateway, as a coding agent runs it: the model is asked to implement a
function in a file and works through three tools (read_file, write_file, run_tests: the tool language of
online_rl.agent_episodes) until it answers in text or runs out of turns. The environment is a one-file
repository holding the task's prompt; run_tests runs the file's hidden tests. The session's outcome is
whether the file the agent left behind passes them (the edit is kept: accept; else reject), sent to the
gateway as feedback on the whole session, which the trainer spreads over the session's turns.

The transport is the caller's (`chat(messages) -> answer`: the openai client in the demo's population,
locust's client in load tests), so both drive the same session.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from typing import Callable

from flywheel.core.events import parse_version
from online_rl import sandbox, tasks
from online_rl.agent_episodes import ASKS, PATHS, openai_tools

MAX_TURNS = 5  # read, write, test, answer: four when all goes well; one more for a retry


@dataclass
class SessionResult:
    session_id: str | None
    outcome: str  # accept | reject (the written file passes its hidden tests, or not)
    turns: int
    versions: list = field(default_factory=list)  # the weight version of each turn
    calls: int = 0  # tool calls the model made (well formed: the gateway returned them as tool_calls)
    text_answers: int = 0  # turns answered in text (a final answer, or a call the gateway could not read)
    completion_ids: list = field(default_factory=list)


def tests_passed(task: tasks.Task, code: str, cfg: sandbox.SandboxConfig | None = None) -> tuple[int, int]:
    """The task's hidden tests on a whole file, in the sandbox: (passed, total)."""
    v = sandbox.run([dataclasses.replace(sandbox.candidate_for(task, ""), code=code)], cfg)[0]
    return v.passed, v.total


class Repository:
    """The simulated workspace: one file, the three tools."""

    def __init__(self, task: tasks.Task, path: str, judge: Callable[[tasks.Task, str], tuple[int, int]]):
        self.task, self.path, self.judge = task, path, judge
        self.files = {path: task.prompt}

    def call(self, name: str, arguments: str) -> str:
        try:
            args = json.loads(arguments)
        except ValueError:
            return "error: arguments are not JSON"
        path = args.get("path") if isinstance(args, dict) else None
        if name == "read_file":
            return self.files.get(path, f"error: no such file: {path}")
        if name == "write_file":
            content = args.get("content")
            if not isinstance(content, str):
                return "error: content must be a string"
            self.files[path] = content
            return "ok"
        if name == "run_tests":
            if path not in self.files:
                return f"error: no such file: {path}"
            passed, total = self.judge(self.task, self.files[path])
            return f"{total} passed" if passed == total else f"{total - passed} failed, {passed} passed"
        return f"error: unknown tool {name}"

    def kept(self) -> bool:
        """The outcome: the file, as the agent left it, passes every hidden test (and was changed)."""
        code = self.files[self.path]
        if code == self.task.prompt:
            return False
        passed, total = self.judge(self.task, code)
        return total > 0 and passed == total


def run_session(
    chat: Callable[[list[dict]], dict],
    task: tasks.Task,
    rng: random.Random,
    judge: Callable[[tasks.Task, str], tuple[int, int]] = tests_passed,
    max_turns: int = MAX_TURNS,
) -> SessionResult:
    """Drive one session; `chat` posts the conversation (with TOOLS) and returns the gateway's JSON answer
    (raising on any failed request). Returns the result; the caller sends the session's feedback."""
    path = rng.choice(PATHS)
    repo = Repository(task, path, judge)
    messages: list[dict] = [{"role": "user", "content": rng.choice(ASKS).format(p=path)}]
    res = SessionResult(session_id=None, outcome="reject", turns=0)
    for _ in range(max_turns):
        answer = chat(messages)
        res.turns += 1
        res.session_id = answer.get("session_id", res.session_id)
        res.versions.append(parse_version(answer.get("model_version")))
        res.completion_ids.append(answer["id"])
        choice = answer["choices"][0]
        message = choice["message"]
        calls = message.get("tool_calls") or []
        if choice["finish_reason"] != "tool_calls" or not calls:
            res.text_answers += 1
            break
        res.calls += len(calls)
        messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls})
        for c in calls:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": c["id"],
                    "content": repo.call(c["function"]["name"], c["function"]["arguments"]),
                }
            )
    res.outcome = "accept" if repo.kept() else "reject"
    return res


def chat_body(messages: list[dict], temperature: float, max_tokens: int) -> dict:
    return {
        "model": "flywheel-coder",
        "messages": messages,
        "tools": openai_tools(),
        "temperature": temperature,
        "max_tokens": max_tokens,
    }
