"""One agent session against the gateway, as a coding agent runs it: the model is asked to implement a
function in a file and works through three tools (read_file, write_file, run_tests: the tool language of
online_rl.tasks.agent_episodes) until it answers in text or runs out of turns. The environment is a one-file
repository holding the task's prompt; run_tests runs the file's hidden tests. The session's outcome is
whether the file the agent left behind passes them (the edit is kept: accept; else reject).

With a `UserModel` the simulated user also behaves as people do with agent clients that send no feedback:
after the agent's answer it corrects it, asks again, asks to undo it, moves on or leaves; mid-task it may
stop the agent and walk away. The gateway reads those as implicit signals (serving.signals.implicit); the
session records the truth for every turn (`SessionResult.truth`: did the file that turn left pass), so the
signals' precision and recall can be measured (benchmarks/implicit_signals.py, the demo).

A session may also be on a mined task (online_rl.tasks.mining: code no one here wrote, drawn with the synthetic
tasks by a mixture, PopulationConfig.mined_share): the workspace then holds the repository's changed file(s) at
their own paths (a body task: the code file with the function's body deleted; a feature task: each file the
deletion changed), the agent is asked for the function by name, and run_tests runs the repository's own kept
tests through the mined tasks' sandbox judge (online_rl.tasks.mining.judge), on the files as the agent left them.

The transport is the caller's (`chat(messages) -> answer`, in the chat API's shapes): the openai client,
the anthropic client through `messages_transport` (the Messages API, as Claude Code speaks it), locust's
client in load tests; all drive the same session.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from contracts.events import parse_version
from online_rl.sandbox import judge as sandbox
from online_rl.tasks import synthetic as tasks
from online_rl.tasks.agent_episodes import ASKS, PATHS, openai_tools
from online_rl.tasks.mining import judge as mined_judge
from online_rl.tasks.mining.candidates import MARKER
from online_rl.tasks.mining.store import FeatureTask, MinedTask

AnyTask = tasks.Task | MinedTask | FeatureTask
Code = str | dict[str, str]  # a synthetic task's one file; a mined task's files by path
# run_tests' judge: (task, its Code) -> (passed, total); Any: a caller's judge of synthetic tasks only takes a str
Judge = Callable[[Any, Any], tuple[int, int]]

MAX_TURNS = 5  # read, write, test, answer: four when all goes well; one more for a retry


@dataclass
class UserModel:
    """How the simulated user reacts to an agent's answer, by whether the file it left passes the hidden
    tests (the truth only the user knows), and when it gives up mid-task. The rates are a guess at people,
    with their noise on purpose: a satisfied user's "no worries" reads as a correction, a repeat can be
    impatience, a bad answer is often just left."""

    correct_if_bad: float = 0.5  # "That's wrong, the tests still fail."
    repeat_if_bad: float = 0.15  # the same request again
    undo_if_bad: float = 0.1  # "Undo that."
    new_request_if_good: float = 0.15  # "Thanks, now ..." (no verdict)
    no_worries_if_good: float = 0.05  # "No worries, that's it." (reads as a correction: noise)
    repeat_if_good: float = 0.03  # asks again anyway (noise)
    abandon: float = 0.02  # walks away mid-task, whatever happened
    abandon_after_failure: float = 0.15  # ... after a test run failed
    max_turns: int = 8  # a follow-up gives the agent more turns


CORRECTIONS = ("That's wrong, the tests still fail.", "No, that doesn't work.", "Still broken, try again.")
UNDOS = ("Undo that change, please.", "Please revert it.")
NEW_REQUESTS = ("Thanks! Now add a short comment above it.", "Great. Can you also keep the style consistent?")
NO_WORRIES = ("No worries, that's it, thanks.", "No, that's all for now. Thanks!")


@dataclass
class SessionResult:
    session_id: str | None
    outcome: str  # accept | reject (the written file passes its hidden tests, or not)
    turns: int
    versions: list = field(default_factory=list)  # the weight version of each turn
    calls: int = 0  # tool calls the model made (well formed: the gateway returned them as tool_calls)
    text_answers: int = 0  # turns answered in text (a final answer, or a call the gateway could not read)
    completion_ids: list = field(default_factory=list)
    truth: dict = field(default_factory=dict)  # completion id -> the file that turn left passes (a write: it wrote)
    writes: list = field(default_factory=list)  # completion ids of the turns that wrote the file
    reactions: list = field(default_factory=list)  # what the user did after each answer (correct, repeat, ...)
    abandoned: bool = False


class JudgeError(Exception):
    """A mined task's judge could not run its tests (its repository changed since it was mined): the population records
    the session as `judge_error`, not as a failed request (serving answered)."""


def tests_passed(task: AnyTask, code: Code, cfg: sandbox.SandboxConfig | None = None) -> tuple[int, int]:
    """The task's hidden tests on a whole file (a mined task's: its files, by its own judge), in the sandbox:
    (passed, total)."""
    if isinstance(task, (MinedTask, FeatureTask)):
        try:
            mv = mined_judge.judge([(task, code if isinstance(code, dict) else {task.path: code})])[0]
        except Exception as e:  # noqa: BLE001 - whatever stopped the judge, it is not the session's answer
            raise JudgeError(f"{type(e).__name__}: {e}"[:300]) from e
        return mv.passed, mv.total
    assert isinstance(code, str)
    v = sandbox.run([dataclasses.replace(sandbox.candidate_for(task, ""), code=code)], cfg)[0]
    return v.passed, v.total


def workspace(task: AnyTask, path: str) -> dict[str, str]:
    """The files a session starts with: the task's prompt as `path`, or a mined task's changed files."""
    if isinstance(task, FeatureTask):
        return dict(task.shown)
    if isinstance(task, MinedTask):
        return {task.path: task.prefix + task.indent + MARKER + "\n" + task.suffix}
    return {path: task.prompt}


def ask_for(task: AnyTask, path: str, rng: random.Random) -> str:
    if isinstance(task, FeatureTask):
        return task.ask
    if isinstance(task, MinedTask):
        return f"Implement `{task.qualname}` in {task.path}: its body was deleted. Make the repository's tests pass."
    return rng.choice(ASKS).format(p=path)


def agent_mixture(cfg, synthetic: list, agent: int):
    """The mixture agent `agent`'s sessions draw their tasks from (cfg: a PopulationConfig), or None when no share of
    them is mined: then they draw the synthetic tasks as they always did. Every kind of mined task is drawn (a
    session writes whole files, a feature's as readily as a body's)."""
    if cfg.mined_share <= 0:
        return None
    from pathlib import Path

    from infra.paths import flywheel_home
    from online_rl.tasks.mining.mixture import Mixture

    # Every tasks.jsonl under $FLYWHEEL_HOME/tasks: body tasks (tasks/mined) and feature tasks (tasks/mined-feature).
    where = Path(cfg.mined_tasks) if cfg.mined_tasks else flywheel_home() / "tasks"
    seed = int.from_bytes(f"{cfg.seed}/agent/{agent}".encode(), "big") % (1 << 63)
    return Mixture(synthetic, where, cfg.mined_share, seed, modes=("body", "feature"))


class Repository:
    """The simulated workspace: the task's file(s), the three tools."""

    def __init__(self, task: AnyTask, path: str, judge: Judge):
        self.task, self.path, self.judge = task, path, judge
        self.files = workspace(task, path)
        self.start = dict(self.files)

    def code(self) -> Code:
        """What the hidden tests judge: the one file, or a mined task's files as they are now."""
        if isinstance(self.task, tasks.Task):
            return self.files[self.path]
        return {p: self.files[p] for p in self.start}

    def call(self, name: str, arguments: str) -> str:
        try:
            args = json.loads(arguments)
        except ValueError:
            return "error: arguments are not JSON"
        path = args.get("path") if isinstance(args, dict) else None
        if name == "read_file":
            return self.files.get(path, f"error: no such file: {path}") if isinstance(path, str) else "error: no path"
        if name == "write_file":
            content = args.get("content")
            if not isinstance(content, str):
                return "error: content must be a string"
            if not isinstance(path, str):
                return "error: no path"
            self.files[path] = content
            return "ok"
        if name == "run_tests":
            if path not in self.files:
                return f"error: no such file: {path}"
            passed, total = self.judge(self.task, self.code() if path in self.start else self.files[path])
            return f"{total} passed" if passed == total else f"{total - passed} failed, {passed} passed"
        return f"error: unknown tool {name}"

    def passes(self, code: Code) -> bool:
        passed, total = self.judge(self.task, code)
        return total > 0 and passed == total

    def kept(self) -> bool:
        """The outcome: the file(s), as the agent left them, pass every hidden test (and were changed)."""
        code = self.code()
        return code != (self.start[self.path] if isinstance(code, str) else self.start) and self.passes(code)


def _react(user: UserModel, rng: random.Random, good: bool, ask: str) -> tuple[str, str] | None:
    """(reaction, the user's next message), or None: the user is done with the session."""
    r = rng.random()
    if not good:
        for kind, p, say in (
            ("correct", user.correct_if_bad, rng.choice(CORRECTIONS)),
            ("repeat", user.repeat_if_bad, ask),
            ("undo", user.undo_if_bad, rng.choice(UNDOS)),
        ):
            if r < p:
                return kind, say
            r -= p
        return None
    for kind, p, say in (
        ("new_request", user.new_request_if_good, rng.choice(NEW_REQUESTS)),
        ("no_worries", user.no_worries_if_good, rng.choice(NO_WORRIES)),
        ("repeat", user.repeat_if_good, ask),
    ):
        if r < p:
            return kind, say
        r -= p
    return None


def run_session(
    chat: Callable[[list[dict]], dict],
    task: AnyTask,
    rng: random.Random,
    judge: Judge = tests_passed,
    max_turns: int = MAX_TURNS,
    user: UserModel | None = None,
) -> SessionResult:
    """Drive one session; `chat` posts the conversation (with TOOLS) and returns the gateway's JSON answer
    (raising on any failed request). Returns the result; the caller sends the session's feedback, if any."""
    path = rng.choice(PATHS) if isinstance(task, tasks.Task) else task.path
    repo = Repository(task, path, judge)
    ask = ask_for(task, path, rng)
    messages: list[dict] = [{"role": "user", "content": ask}]
    res = SessionResult(session_id=None, outcome="reject", turns=0)
    segment: list[str] = []  # turns since the user last spoke: judged by the file they leave
    failed_test = False
    limit = user.max_turns if user is not None else max_turns
    while res.turns < limit:
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
            _judge_segment(res, repo, segment + [answer["id"]])
            segment = []
            reaction = _react(user, rng, repo.kept(), ask) if user is not None else None
            if reaction is None:
                break
            res.reactions.append(reaction[0])
            messages += [
                {"role": "assistant", "content": message.get("content") or ""},
                {"role": "user", "content": reaction[1]},
            ]
            continue
        res.calls += len(calls)
        segment.append(answer["id"])
        if user is not None and rng.random() < (user.abandon_after_failure if failed_test else user.abandon):
            res.abandoned = True  # the tool results never go back
            break
        messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls})
        for c in calls:
            result = repo.call(c["function"]["name"], c["function"]["arguments"])
            if c["function"]["name"] == "write_file" and result == "ok":
                res.truth[answer["id"]] = repo.passes(repo.code())  # a write: judged by what it wrote
                res.writes.append(answer["id"])
            if c["function"]["name"] == "run_tests":
                failed_test = "failed" in result
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    _judge_segment(res, repo, segment)
    res.outcome = "accept" if repo.kept() else "reject"
    return res


def _judge_segment(res: SessionResult, repo: Repository, turns: list[str]) -> None:
    good = repo.kept()
    for cid in turns:
        res.truth.setdefault(cid, good)


def chat_body(messages: list[dict], temperature: float, max_tokens: int) -> dict:
    return {
        "model": "flywheel-coder",
        "messages": messages,
        "tools": openai_tools(),
        "temperature": temperature,
        "max_tokens": max_tokens,
    }


# ----------------------------------------------------------------------------- the Messages API


def anthropic_tools() -> list[dict]:
    return [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in openai_tools()]


def to_anthropic(messages: list[dict]) -> list[dict]:
    """The session's conversation (chat API shapes) as Messages API messages: calls as tool_use blocks,
    tool results as one user message of tool_result blocks."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            for c in m["tool_calls"]:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": c["id"],
                        "name": c["function"]["name"],
                        "input": json.loads(c["function"]["arguments"]),
                    }
                )
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": m["role"], "content": m["content"] or ""})
    return out


def from_anthropic(msg: dict) -> dict:
    """A Messages API answer in the chat API's shape (what run_session reads)."""
    text = "".join(b["text"] for b in msg["content"] if b["type"] == "text")
    calls = [
        {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
        for b in msg["content"]
        if b["type"] == "tool_use"
    ]
    finish = "tool_calls" if msg.get("stop_reason") == "tool_use" and calls else "stop"
    message = {"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}
    return {
        "id": msg["id"],
        "session_id": msg.get("session_id"),
        "model_version": msg.get("model_version"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def messages_transport(
    create: Callable[..., dict], temperature: float, max_tokens: int
) -> Callable[[list[dict]], dict]:
    """`chat` for run_session over the Messages API: `create(**body)` posts it (the anthropic client's
    messages.create, its answer dumped to a dict; `extra_body` is merged into the request's JSON)."""

    def chat(messages: list[dict]) -> dict:
        body = {
            "model": "flywheel-coder",
            "max_tokens": max_tokens,
            "messages": to_anthropic(messages),
            "tools": anthropic_tools(),
            # the anthropic SDK pinned here no longer types `temperature`; the API (and the gateway) take it
            "extra_body": {"temperature": temperature},
        }
        return from_anthropic(create(**body))

    return chat
