"""Function tools in the OpenAI chat API: request validation, the prompt format, and reading calls back out
of the model's text (whole or streamed).

The model writes calls in the Qwen format, one JSON object per call:

    <tool_call>
    {"name": "read_file", "arguments": {"path": "app.py"}}
    </tool_call>

and reads tool results as `<tool_response>` blocks (the text format itself, shared with online_rl's corpus,
is contracts.tool_format). Our coder has no chat template (serving.protocol.openai
renders a conversation as a comment block); tools join it as one `# tools:` line per function with its
parameters, so a tool list costs tokens in proportion to what it says.

Why not SGLang's own parser (sglang.srt.function_call.qwen25_detector): importing it loads SGLang and
torch into the gateway, measured 8 s and 0.96 GB of resident memory for a regex and a JSON parse; and
SGLang's OpenAI endpoint, which would parse for us, does not return the token ids, behaviour logprobs
and routed experts the trainer needs from /generate. The format is the same; one difference: text after
the last call makes the answer text here (SGLang's parser keeps the calls and drops it), since a policy
that learns to trail prose after its calls should see that counted.

A call the model gets wrong (not JSON, an unknown tool, arguments that fail the tool's JSON schema or whose
check runs past its deadline (serving.protocol.tool_schema), a call cut off) makes the whole answer plain text with
finish_reason "stop" ("length" when cut off by the token limit), never an error: the client sees what the
model wrote, and the gateway counts it (a rising malformed-call rate is reward hacking's
first sign).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from contracts import tool_format as tf
from contracts.tool_format import CALL_OPEN
from serving.protocol import tool_schema as ts
from serving.protocol.limits import Limits
from serving.protocol.schema import ApiError, nesting

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 64
MAX_SCHEMA_DEPTH = ts.MAX_SCHEMA_DEPTH


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict
    validator: Any  # tool_schema.Validator (untyped): the parameters schema, no fetching, bounded patterns, deadline


@dataclass
class ToolSpec:
    """The tools of one request and how the model may use them."""

    tools: dict[str, Tool]
    choice: str = "auto"  # auto | none | required | function
    forced: str | None = None  # the function tool_choice names
    parallel: bool = True
    timeout_s: float = 1.0  # Limits.tool_call_timeout_s: checking an answer's calls, off the event loop
    max_argument_depth: int = 32  # Limits.max_argument_depth: deeper arguments are an invalid call

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @property
    def single(self) -> bool:
        """One call at most: parallel_tool_calls=false, or a named function (OpenAI returns exactly one)."""
        return not self.parallel or self.choice == "function"

    def opening(self) -> str:
        """What the answer starts with, written for the model: `required` opens a call, a named function
        opens a call to it (no grammar backend on CPU: this is how the choice is honoured)."""
        if self.choice == "function":
            return f'{CALL_OPEN}\n{{"name": "{self.forced}", "arguments": '
        if self.choice == "required":
            return f"{CALL_OPEN}\n"
        return ""


# ----------------------------------------------------------------------------- request


def parse_tools(body: dict, limits: Limits | None = None) -> ToolSpec | None:
    limits = limits or Limits()
    tools_raw, choice_raw = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be a boolean", param="parallel_tool_calls", code="invalid_type")
    if tools_raw is None or tools_raw == []:
        if choice_raw not in (None, "none", "auto"):
            raise ApiError(400, "'tool_choice' is only allowed when 'tools' are specified", param="tool_choice")
        return None
    if not isinstance(tools_raw, list):
        raise ApiError(400, "'tools' must be a list of function tools", param="tools", code="invalid_type")
    if len(tools_raw) > MAX_TOOLS:
        raise ApiError(400, f"'tools' takes at most {MAX_TOOLS} functions", param="tools", code="out_of_range")
    tools: dict[str, Tool] = {}
    nodes_left = limits.max_schema_nodes
    for i, t in enumerate(tools_raw):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise ApiError(
                400,
                f"{p} must be {{'type': 'function', 'function': {{...}}}} (only function tools are supported)",
                param=p,
                code="invalid_value",
            )
        extra = sorted(set(t) - {"type", "function"})
        if extra:
            raise ApiError(400, f"{p}: unrecognized field {extra[0]!r}", param=f"{p}.{extra[0]}")
        fn = t["function"]
        extra = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if extra:
            raise ApiError(400, f"{p}.function: unrecognized field {extra[0]!r}", param=f"{p}.function.{extra[0]}")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ApiError(
                400,
                f"{p}.function.name must be 1-64 letters, digits, '_' or '-'",
                param=f"{p}.function.name",
                code="invalid_value",
            )
        if name in tools:
            raise ApiError(400, f"{p}: duplicate function name {name!r}", param=f"{p}.function.name")
        desc = fn.get("description", "")
        if not isinstance(desc, str):
            raise ApiError(400, f"{p}.function.description must be a string", param=f"{p}.function.description")
        if fn.get("strict") is not None and not isinstance(fn.get("strict"), bool):
            raise ApiError(400, f"{p}.function.strict must be a boolean", param=f"{p}.function.strict")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ApiError(
                400,
                f"{p}.function.parameters must be a JSON schema object",
                param=f"{p}.function.parameters",
                code="invalid_type",
            )
        nodes_left -= ts.check_schema(params, f"{p}.function.parameters", limits, nodes_left)
        tools[name] = Tool(name, desc, params, ts.Validator(params, registry=ts.NO_FETCH))
    spec = ToolSpec(
        tools, parallel=parallel, timeout_s=limits.tool_call_timeout_s, max_argument_depth=limits.max_argument_depth
    )
    if choice_raw is None or choice_raw in ("auto", "none", "required"):
        spec.choice = choice_raw or "auto"
    elif (
        isinstance(choice_raw, dict)
        and choice_raw.get("type") == "function"
        and isinstance(choice_raw.get("function"), dict)
        and isinstance(choice_raw["function"].get("name"), str)
    ):
        spec.choice, spec.forced = "function", choice_raw["function"]["name"]
        if spec.forced not in tools:
            raise ApiError(
                400,
                f"tool_choice names {spec.forced!r}, which is not in 'tools'",
                param="tool_choice",
                code="invalid_value",
            )
    else:
        raise ApiError(
            400,
            "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
            code="invalid_value",
        )
    return spec


def assistant_calls(m: dict, i: int) -> list[dict]:
    """An assistant message's tool_calls, checked: [{id, name, arguments (a JSON string)}]."""
    calls = m.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise ApiError(400, f"messages[{i}].tool_calls must be a list", param=f"messages[{i}].tool_calls")
    out = []
    for j, c in enumerate(calls):
        p = f"messages[{i}].tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if (
            not isinstance(c, dict)
            or c.get("type", "function") != "function"
            or not isinstance(c.get("id"), str)
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments"), str)
        ):
            raise ApiError(
                400,
                f"{p} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}",
                param=p,
                code="invalid_value",
            )
        out.append({"id": c["id"], "name": fn["name"], "arguments": fn["arguments"]})
    return out


# ----------------------------------------------------------------------------- prompt


def _signature(t: Tool) -> str:
    return tf.signature(t.name, t.description, t.parameters)


def tools_header(spec: ToolSpec) -> list[str]:
    return [tf.tool_line(t.name, t.description, t.parameters) for t in spec.tools.values()]


# ----------------------------------------------------------------------------- answer

OUTCOMES = ("valid", "malformed", "unknown_tool", "dropped_parallel")  # of an answer with a call in it
MALFORMED = ("malformed", "unknown_tool")  # the call the model got wrong: the answer is returned as text


@dataclass
class Parsed:
    content: str | None  # the text before the first call (None when empty), or all of it when no call holds
    calls: list[dict] = field(default_factory=list)  # OpenAI tool_calls (id, type, function {name, arguments})
    outcome: str = "none"  # none | valid | malformed | unknown_tool | dropped_parallel

    @property
    def finish_reason(self) -> str | None:
        return "tool_calls" if self.calls else None


def new_call_id(prefix: str = "call_") -> str:
    """A call id as each API spells its own: `call_` (OpenAI), `toolu_` (Anthropic)."""
    return prefix + uuid.uuid4().hex[:24]


def parse(text: str, spec: ToolSpec, id_prefix: str = "call_") -> Parsed:
    """Calls in a whole answer (prefill included). All well formed, or the answer is text."""
    if not spec.active:
        return Parsed(content=text)

    def lookup(name: str):
        tool = spec.tools.get(name)
        if tool is None or (spec.forced is not None and name != spec.forced):
            return None
        return lambda args: (
            nesting(args, spec.max_argument_depth) and next(tool.validator.iter_errors(args), None) is None
        )

    try:
        outcome, start, found = tf.read_calls(text, lookup)
    except RecursionError:  # a call nested past Python's recursion (json.loads): not a call either
        return Parsed(content=text, outcome="malformed")
    if outcome != "valid":
        return Parsed(content=text, outcome=outcome)
    calls = [
        {
            "id": new_call_id(id_prefix),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
        }
        for name, args in found
    ]
    if spec.single and len(calls) > 1:
        calls, outcome = calls[:1], "dropped_parallel"
    return Parsed(content=text[:start] if text[:start].strip() else None, calls=calls, outcome=outcome)


async def parse_off_loop(text: str, spec: ToolSpec, id_prefix: str = "call_") -> Parsed:
    """parse(), with the calls' checks on a thread and within spec.timeout_s (serving.protocol.tool_schema): a check
    past it makes the call invalid, as arguments that fail their schema do; the event loop never waits on it."""
    if not spec.active or CALL_OPEN not in text:
        return parse(text, spec, id_prefix)
    return await ts.off_loop(
        lambda: parse(text, spec, id_prefix), spec.timeout_s, lambda: Parsed(content=text, outcome="malformed")
    )


class StreamSplitter:
    """Streams text as it comes until a call may be starting, then holds the rest for parse() at the end.
    Only text that cannot be the start of `<tool_call>` is let through."""

    def __init__(self, spec: ToolSpec, prefill: str = "", id_prefix: str = "call_"):
        self.spec, self.id_prefix = spec, id_prefix
        self.buf = prefill
        self.sent = 0  # chars of buf already streamed as content
        self.holding = bool(prefill)  # a prefilled call: nothing is content until parse() says so

    def feed(self, delta: str) -> str:
        """Content safe to stream now."""
        self.buf += delta
        if self.holding:
            return ""
        at = self.buf.find(CALL_OPEN, self.sent)
        if at >= 0:
            self.holding = True
            out, self.sent = self.buf[self.sent : at], at
            return out
        # keep back a tail that could be the beginning of "<tool_call>"
        keep = next(
            (
                k
                for k in range(min(len(CALL_OPEN) - 1, len(self.buf) - self.sent), 0, -1)
                if CALL_OPEN.startswith(self.buf[-k:])
            ),
            0,
        )
        end = len(self.buf) - keep
        out, self.sent = self.buf[self.sent : end], max(self.sent, end)
        return out

    def finish(self, parsed: Parsed | None = None) -> tuple[str, Parsed]:
        """(content still to stream, the parse of the whole answer: `parsed`, when already done off the loop)."""
        parsed = parsed or parse(self.buf, self.spec, self.id_prefix)
        if parsed.calls:
            return "", parsed
        return self.buf[self.sent :], parsed

    async def finish_off_loop(self) -> tuple[str, Parsed]:
        return self.finish(await parse_off_loop(self.buf, self.spec, self.id_prefix))


def trimmed_close(finish: dict | None) -> str:
    """The closing tag of a call when SGLang stopped on it (and trimmed it from the text)."""
    return tf.CALL_CLOSE if (finish or {}).get("matched") == tf.CALL_CLOSE else ""
