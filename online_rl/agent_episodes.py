"""Agent episodes for the bootstrap corpus: the tiny model learns a small tool language.

An episode is one chat with three tools, built from a synthetic task (online_rl.tasks):

    # tools: read_file(path: string)
    # tools: write_file(path: string, content: string)
    # tools: run_tests(path: string)
    # user: Fix util.py.
    <tool_call> read_file(util.py) </tool_call>          -> <tool_response> the task's prompt </tool_response>
    <tool_call> write_file(util.py, prompt + body) </tool_call>  -> ok
    <tool_call> run_tests(util.py) </tool_call>          -> "10 passed", "6 failed, 4 passed", ... (computed)
    Done: the tests pass.                                (or: The tests still fail.)

The environment is simulated but honest: the file holds the task's prompt, and the test result is what
the written body does on the task's test inputs. Each assistant turn is its own corpus document, the
prompt exactly as serving renders the conversation at that point (flywheel.core.tool_format, the same code)
followed by the turn and <|endoftext|>, because at serving a turn ends at end-of-text and the tool
result comes from the client. A share of the calls is deliberately imperfect (broken JSON, a missing
required argument, an unknown tool), so the base model makes malformed calls sometimes and RL has room.

In a later turn's document the earlier calls are history, followed by "\\n<tool_response>"; as a target
that newline would teach the model to run on past its call into a result it invented (which serving
counts as malformed), so bootstrap does not train on it (`history_breaks`).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from flywheel.core import tool_format as tf
from online_rl.tasks import EOS, Task

PATH = {"type": "string"}
# No descriptions: the names say it, and a description line costs 5-6 tokens in every turn's prompt.
TOOLS = (
    {
        "name": "read_file",
        "description": "",
        "parameters": {"type": "object", "properties": {"path": PATH}, "required": ["path"]},
    },
    {
        "name": "write_file",
        "description": "",
        "parameters": {
            "type": "object",
            "properties": {"path": PATH, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "run_tests",
        "description": "",
        "parameters": {"type": "object", "properties": {"path": PATH}, "required": ["path"]},
    },
)
TOOL_LINES = [tf.tool_line(t["name"], t["description"], t["parameters"]) for t in TOOLS]
PATHS = ("app.py", "main.py", "util.py", "lib.py", "core.py", "calc.py")
ASKS = ("Fix {p}.", "Implement {p}.", "Make {p} pass its tests.")
DONE, STILL_FAILING = "Done: the tests pass.", "The tests still fail."
MALFORMED_KINDS = ("broken_json", "missing_argument", "unknown_tool")
UNKNOWN_NAMES = {
    "read_file": ("open_file", "cat"),
    "write_file": ("save_file", "edit_file"),
    "run_tests": ("run_test", "pytest"),
}


def openai_tools() -> list[dict]:
    """TOOLS as a client sends them in a chat request."""
    return [{"type": "function", "function": dict(t)} for t in TOOLS]


@dataclass(frozen=True)
class Turn:
    prompt: str  # what serving renders for the conversation so far (the model continues after it)
    target: str  # the assistant's turn as the model writes it
    call: str | None  # the tool this turn calls (None: the final answer)
    malformed: str | None = None  # which imperfection, for a deliberately imperfect call

    @property
    def document(self) -> str:
        return self.prompt + self.target + EOS


def run_tests(task: Task, body: str) -> str:
    """What the simulated run_tests says about `body`: pytest's summary over the task's test inputs."""
    failed = _failures(task, body)
    passed = len(task.test_inputs()) - failed
    return ", ".join(f"{n} {what}" for n, what in ((failed, "failed"), (passed, "passed")) if n)


@functools.lru_cache(maxsize=4096)
def _failures(task: Task, body: str) -> int:
    from online_rl.tasks import _call

    ns: dict = {}
    exec(task.prompt + body, ns)  # noqa: S102 - the task's own reference or wrong-body templates, not model output
    got = [_call(ns[task.name], x) for x in task.test_inputs()]
    return sum(g != e for g, e in zip(got, task.expected_outputs()))


def episode(task: Task, body: str, path: str, ask: str) -> tuple[list[dict], list[Turn]]:
    """The conversation (messages as flywheel.core.tool_format renders them) and its four assistant turns."""
    calls = [
        ("read_file", {"path": path}),
        ("write_file", {"path": path, "content": task.prompt + body}),
        ("run_tests", {"path": path}),
    ]
    results = [task.prompt, "ok", run_tests(task, body)]
    messages: list[dict] = [{"role": "user", "content": ask.format(p=path), "calls": []}]
    turns = []
    for (name, args), result in zip(calls, results):
        turns.append(Turn(tf.render_chat(messages, TOOL_LINES), tf.call_text(name, args), name))
        messages += [
            {"role": "assistant", "content": "", "calls": [{"name": name, "arguments": args}]},
            {"role": "tool", "content": result},
        ]
    final = DONE if _failures(task, body) == 0 else STILL_FAILING
    turns.append(Turn(tf.render_chat(messages, TOOL_LINES), final, None))
    messages.append({"role": "assistant", "content": final, "calls": []})
    return messages, turns


def malformed(turn: Turn, args: dict, rng: random.Random) -> Turn:
    """The same turn with an imperfect call: broken JSON, a required argument missing, or an unknown tool."""
    kind = rng.choice(MALFORMED_KINDS)
    if kind == "broken_json":  # the object's closing brace is missing
        text = turn.target.replace("}}\n" + tf.CALL_CLOSE, "}\n" + tf.CALL_CLOSE)
    elif kind == "missing_argument":
        drop = "content" if turn.call == "write_file" else "path"
        text = tf.call_text(turn.call, {k: v for k, v in args.items() if k != drop})
    else:
        text = tf.call_text(rng.choice(UNKNOWN_NAMES[turn.call]), args)
    return Turn(turn.prompt, text, turn.call, kind)


def sample_turn(task: Task, rng: random.Random, correct_share: float, malformed_share: float) -> Turn:
    """One assistant turn of a random episode for `task` (each of the four turns equally likely)."""
    body = task.reference if rng.random() < correct_share else rng.choice(task.wrong_bodies())
    path, ask = rng.choice(PATHS), rng.choice(ASKS)
    messages, turns = episode(task, body, path, ask)
    i = rng.randrange(len(turns))
    turn = turns[i]
    if turn.call is not None and rng.random() < malformed_share:
        turn = malformed(turn, messages[1 + 2 * i]["calls"][0]["arguments"], rng)
    return turn


def history_breaks(doc: str) -> list[int]:
    """Offsets of the newlines that follow a call inside a document: history, never the end of a turn."""
    out, at = [], doc.find(tf.CALL_CLOSE + "\n")
    while at >= 0:
        out.append(at + len(tf.CALL_CLOSE))
        at = doc.find(tf.CALL_CLOSE + "\n", at + 1)
    return out


# ----------------------------------------------------------------------------- judging calls


@functools.lru_cache(maxsize=1)
def _validators() -> dict:
    from jsonschema import Draft202012Validator

    return {t["name"]: Draft202012Validator(t["parameters"]) for t in TOOLS}


def call_outcome(text: str) -> str:
    """How serving would read `text` as an answer to a request with TOOLS (flywheel.core.tool_format.read_calls,
    the same rules): valid | malformed | unknown_tool | none (no call)."""
    validators = _validators()

    def lookup(name: str):
        v = validators.get(name)
        return None if v is None else (lambda args: next(v.iter_errors(args), None) is None)

    return tf.read_calls(text, lookup)[0]


def call_matches(turn: Turn, text: str) -> bool:
    """Whether a valid call is the one this turn of the episode needs (the right tool and file; the
    content written is not judged here)."""
    import json

    want = json.loads(turn.target.split("\n")[1])
    got = tf.read_calls(text, lambda name: lambda args: True)[2]
    return len(got) == 1 and got[0][0] == want["name"] and got[0][1].get("path") == want["arguments"]["path"]
