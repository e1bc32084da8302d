"""The text contract of agent mode: how a chat with tools reads to the model and how its calls are read back.

Serving renders requests with it (serving.protocol.openai.render_chat, serving.protocol.tool_calls) and reads the
model's calls with it; online_rl builds the bootstrap corpus's agent episodes and judges sampled calls
with the same functions, so what the model is trained on is byte for byte what it is served.

A conversation is a comment block: one `# tools: name(arg: type, opt?: type)  # description` line per
tool, then `# role: text` lines per message; calls are written in the Qwen format, one JSON object per
call between `<tool_call>` lines, and tool results as `<tool_response>` blocks. The model continues after
the final newline.
"""

from __future__ import annotations

import json
import re
from typing import Callable

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
# The conversation's last line: the model's turn starts here. A chat template's generation prompt (Qwen's
# `<|im_start|>assistant`): after thousands of tokens of a client's prose the model cannot tell from the
# text alone that the prompt is over (measured: it went on writing `# tools:` and `# user:` lines).
ANSWER = "<|assistant|>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


# ----------------------------------------------------------------------------- prompt


def signature(name: str, description: str, parameters: dict) -> str:
    """A tool as one line of the prompt: `name(arg: type, opt?: type)  # first line of the description`."""
    props = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    args = ", ".join(
        f"{k}{'' if k in required else '?'}: {v.get('type', 'any') if isinstance(v, dict) else 'any'}"
        for k, v in props.items()
    )
    doc = f"  # {description.splitlines()[0]}" if description.strip() else ""
    return f"{name}({args}){doc}"


def tool_line(name: str, description: str, parameters: dict) -> str:
    return f"# tools: {signature(name, description, parameters)}"


def call_text(name: str, arguments) -> str:
    """One call as the model writes it."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # a client's own malformed arguments are shown as they were sent
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CALL_CLOSE}"


def response_text(content: str) -> str:
    return f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}"


def render_chat(messages: list[dict], tool_lines: list[str] = ()) -> str:  # type: ignore[assignment]  # model code
    """The prompt for a conversation: per message `# role: text` lines (one per line of its text), its
    calls, or a tool result, with the tool lines just before what is new since the assistant last spoke (the
    request, or the results of its calls), then the ANSWER line. Messages are
    {role, content, calls: [{name, arguments}]}.

    Why there: agent clients send thousands of tokens of system prompt and history (Codex ~11k of this
    tokenizer's), and a small model reads the list it must pick from best close to where it acts (measured:
    with the tools after the system prompt, the agent model named shells the client did not offer), while
    the newest input right before its turn tells it which step it is at (with the tools after everything, it
    read the file again and again). A client's next turn still finds its conversation in the prefix cache:
    only the tool lines and what follows them are computed again."""
    answered = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    at = (
        answered + 1
        if answered is not None
        else next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    )
    lines = [line for m in messages[:at] for line in _message_lines(m)] + list(tool_lines)
    lines += [line for m in messages[at:] for line in _message_lines(m)]
    return "\n".join(lines + [ANSWER]) + "\n"


def _message_lines(m: dict) -> list[str]:
    lines = []
    if m["role"] == "tool":
        return [response_text(m["content"])]
    if m["content"] or not m.get("calls"):
        for line in m["content"].splitlines() or [""]:
            lines.append(f"# {m['role']}: {line}".rstrip())
    return lines + [call_text(c["name"], c["arguments"]) for c in m.get("calls", [])]


# ----------------------------------------------------------------------------- answer


def read_calls(text: str, lookup: Callable[[str], Callable[[dict], bool] | None]):
    """The calls in a whole answer, all well formed or none: (outcome, start, [(name, arguments)]).

    outcome is "none" (no call opened), "valid", "malformed" (cut off, text around the calls, not JSON,
    not {"name", "arguments"}, arguments failing the tool's check) or "unknown_tool"; start is where the
    first call opens. `lookup(name)` gives the tool's argument check (True when valid), None for a tool
    the request does not offer. The first call that fails decides the outcome."""
    start = text.find(CALL_OPEN)
    if start < 0:
        return "none", -1, []
    blocks = list(_BLOCK.finditer(text, start))
    rest = _BLOCK.sub("", text[start:]).strip()
    if not blocks or rest:  # cut off mid-call, or text between/after the calls that is not a call
        return "malformed", start, []
    calls = []
    for b in blocks:
        try:
            obj = json.loads(b.group(1))
        except ValueError:
            return "malformed", start, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or set(obj) - {"name", "arguments"}:
            return "malformed", start, []
        check = lookup(obj["name"])
        if check is None:
            return "unknown_tool", start, []
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return "malformed", start, []
        try:
            valid = isinstance(args, dict) and bool(check(args))
        except Exception:  # noqa: BLE001 - a schema that fails on this input (RecursionError too): not a call
            valid = False
        if not valid:
            return "malformed", start, []
        calls.append((obj["name"], args))
    return "valid", start, calls
