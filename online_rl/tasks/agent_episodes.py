"""Agent episodes for the bootstrap corpus: the tiny model learns a small tool language.

An episode is one chat with three tools, built from a synthetic task (online_rl.tasks.synthetic):

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
prompt exactly as serving renders the conversation at that point (contracts.tool_format, the same code)
followed by the turn and <|endoftext|>, because at serving a turn ends at end-of-text and the tool
result comes from the client. A share of the calls is deliberately imperfect (broken JSON, a missing
required argument, an unknown tool), so the base model makes malformed calls sometimes and RL has room.

In a later turn's document the earlier calls are history, followed by "\\n<tool_response>"; as a target
that newline would teach the model to run on past its call into a result it invented (which serving
counts as malformed), so bootstrap does not train on it (online_rl.model.loss_mask.history_breaks).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from contracts import tool_format as tf
from online_rl.tasks import agent_clients as C
from online_rl.tasks.synthetic import EOS, Task, _call

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
TOOL_LINES = [tf.tool_line(t["name"], t["description"], t["parameters"]) for t in TOOLS]  # type: ignore[arg-type]  # model code
PATHS = ("app.py", "main.py", "util.py", "lib.py", "core.py", "calc.py")
# Through a client's shell, many more names: six are few enough to memorise, and the model must read the
# file's name from the request (a client's workspace can hold any)
SHELL_PATHS = PATHS + tuple(
    f"{w}.py"
    for w in "solver helpers tools mathx numbers strings parse score grid text series rules model task report "
    "shapes stats convert values".split()
)
ASKS = ("Fix {p}.", "Implement {p}.", "Make {p} pass its tests.")
# Through a client's shell the tests are a file beside the code: `python3 {t}` runs them.
SHELL_ASKS = ("Fix {p} so that python3 {t} passes.", "Implement {p}; check it with python3 {t}.", "Make {t} pass.")
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
    tools: tuple = TOOLS  # the tools the conversation offers (as a client sends them)
    context_chars: int = 0  # characters of the client's context (system prompt, environment) before the request

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
    ns: dict = {}
    exec(task.prompt + body, ns)  # noqa: S102 - the task's own reference or wrong-body templates, not model output
    got = [_call(ns[task.name], x) for x in task.test_inputs()]
    return sum(g != e for g, e in zip(got, task.expected_outputs()))


def episode(
    task: Task,
    body: str,
    path: str,
    ask: str,
    shell: C.Shell | None = None,
    context: C.Context | None = None,
    rng: random.Random | None = None,
) -> tuple[list[dict], list[Turn]]:
    """The conversation (messages as contracts.tool_format renders them) and its four assistant turns:
    with Flywheel's three tools, or through a client's shell (`shell`, online_rl.tasks.agent_clients), inside a
    client's context (system prompt, environment) when one is given."""
    rng = rng or random.Random(0)
    context = context or C.Context()
    failed = _failures(task, body)
    summary = run_tests(task, body)
    if shell is None:
        tools = TOOLS
        calls = [
            ("read_file", {"path": path}),
            ("write_file", {"path": path, "content": task.prompt + body}),
            ("run_tests", {"path": path}),
        ]
        results = [task.prompt, "ok", summary]
    else:
        tools = shell.tools  # type: ignore[assignment]  # model code
        calls = [
            shell.call(f"cat {path}"),
            shell.call(C.heredoc(path, task.prompt + body)),
            shell.call(f"python3 {C.test_file(path)}"),
        ]
        results = [
            C.shell_output(shell, task.prompt, 0, rng),
            C.shell_output(shell, "", 0, rng),
            C.shell_output(shell, summary + "\n", int(failed > 0), rng),
        ]
    lines = [tf.tool_line(t["name"], t["description"], t["parameters"]) for t in tools]  # type: ignore[arg-type]  # model code
    messages: list[dict] = context.messages(ask.format(p=path, t=C.test_file(path)))
    chars = sum(len(m["content"]) for m in messages[:-1]) + (len(context.before) if context.reminder else 0)
    turns = []
    for (name, args), result in zip(calls, results):
        turns.append(Turn(tf.render_chat(messages, lines), tf.call_text(name, args), name, None, tools, chars))
        messages += [
            {"role": "assistant", "content": "", "calls": [{"name": name, "arguments": args}]},
            {"role": "tool", "content": result},
        ]
    final = DONE if failed == 0 else STILL_FAILING
    turns.append(Turn(tf.render_chat(messages, lines), final, None, None, tools, chars))
    messages.append({"role": "assistant", "content": final, "calls": []})
    return messages, turns


def malformed(turn: Turn, args: dict, rng: random.Random) -> Turn:
    """The same turn with an imperfect call: broken JSON, a required argument missing, or an unknown tool."""
    kind = rng.choice(MALFORMED_KINDS)
    if kind == "broken_json":  # the object's closing brace is missing
        text = turn.target.replace("}}\n" + tf.CALL_CLOSE, "}\n" + tf.CALL_CLOSE)
    elif kind == "missing_argument":
        drop = "content" if turn.call == "write_file" else next(iter(args))
        text = tf.call_text(turn.call, {k: v for k, v in args.items() if k != drop})  # type: ignore[arg-type]  # model code
    else:
        text = tf.call_text(rng.choice(UNKNOWN_NAMES.get(turn.call, ("run", "execute"))), args)  # type: ignore[arg-type]  # model code
    return Turn(turn.prompt, text, turn.call, kind, turn.tools, turn.context_chars)


def sample_turn(
    task: Task,
    rng: random.Random,
    correct_share: float,
    malformed_share: float,
    client_share: float = 0.0,
    context_share: float = 0.0,
    context_chars: int = 0,
) -> Turn:
    """One assistant turn of a random episode for `task` (each of the four turns equally likely): through a
    client's shell (`client_share` of them), those inside a client's context (`context_share` of them, its
    system prompt up to `context_chars` characters)."""
    body = task.reference if rng.random() < correct_share else rng.choice(task.wrong_bodies())
    shell = C.client_shell(rng) if rng.random() < client_share else None
    path = rng.choice(PATHS if shell is None else SHELL_PATHS)
    ask = rng.choice(SHELL_ASKS if shell is not None else ASKS)
    style = "codex" if shell is not None and shell.style == "codex" else "plain"
    # A client's context goes with a client's tools: a long system prompt means Codex or Claude Code, whose
    # tools are never Flywheel's (measured: with contexts around both, the agent model answered Claude Code's
    # prompt with read_file in six samples of seven)
    in_context = shell is not None and rng.random() < context_share
    context = C.client_context(rng, style, context_chars) if in_context else C.Context()
    messages, turns = episode(task, body, path, ask, shell, context, rng)
    i = rng.randrange(len(turns))
    turn = turns[i]
    if turn.call is not None and rng.random() < malformed_share:
        first_call = next(m for m in messages if m["role"] == "assistant")
        at = messages.index(first_call) + 2 * i
        turn = malformed(turn, messages[at]["calls"][0]["arguments"], rng)
    return turn


# ----------------------------------------------------------------------------- judging calls


def _validators(tools: tuple) -> dict:
    from jsonschema import Draft202012Validator

    return {t["name"]: Draft202012Validator(t["parameters"]) for t in tools}


def call_outcome(text: str, tools: tuple = TOOLS) -> str:
    """How serving would read `text` as an answer to a request with `tools` (contracts.tool_format.read_calls,
    the same rules): valid | malformed | unknown_tool | none (no call)."""
    validators = _validators(tools)

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
    if len(got) != 1 or got[0][0] != want["name"]:
        return False
    if "path" in want["arguments"]:
        return got[0][1].get("path") == want["arguments"]["path"]
    # through a shell: the same command word and file (cat app.py, cat > app.py << ..., python3 test_app.py)
    arg, command = next(iter(want["arguments"].items()))
    got_command = str(got[0][1].get(arg))
    return got_command.split("\n")[0].split()[:3] == command.split("\n")[0].split()[:3]
